package httpapi

import (
	"strings"
	"testing"
)

// splitReasoningPieces feeds the pieces through a splitter and joins what comes out.
func splitReasoningPieces(t testing.TB, s *reasoningSplitter, pieces []string) (reasoning, content string) {
	t.Helper()
	var r, c strings.Builder
	limit := max(len(s.start), len(s.end))
	for _, p := range pieces {
		rp, cp := s.Push(p)
		r.WriteString(rp)
		c.WriteString(cp)
		if len(s.held) >= limit || !(strings.HasPrefix(s.start, s.held) || strings.HasPrefix(s.end, s.held)) {
			t.Fatalf("after %q holds back %q, more than a marker's beginning", p, s.held)
		}
	}
	rp, cp := s.Flush()
	r.WriteString(rp)
	c.WriteString(cp)
	return r.String(), c.String()
}

func TestReasoningSplitter(t *testing.T) {
	cases := []struct {
		name          string
		pieces        []string
		startsInside  bool
		reason, cont  string
		customMarkers bool
	}{
		{name: "plain content", pieces: []string{"Hello", " world"}, cont: "Hello world"},
		{name: "block then content", pieces: []string{"<think>\nplan\n</think>\n\nAnswer."},
			reason: "plan\n", cont: "Answer."},
		{name: "markers split across pieces", pieces: []string{"<", "thi", "nk>a", "b</", "think", ">", "c"},
			reason: "ab", cont: "c"},
		{name: "end marker one byte a piece", pieces: strings.Split("<think>x</think>y", ""),
			reason: "x", cont: "y"},
		{name: "false end marker prefix is reasoning", pieces: []string{"<think>a</thin", "g>b</think>c"},
			reason: "a</thing>b", cont: "c"},
		{name: "whitespace before the start marker is content", pieces: []string{"\n ", "<think>r</think>c"},
			reason: "r", cont: "\n c"},
		{name: "text before the start marker: all content", pieces: []string{"Sure. <think>r</think>c"},
			cont: "Sure. <think>r</think>c"},
		{name: "not a start marker after all", pieces: []string{"<thin", "g>"}, cont: "<thing>"},
		{name: "whitespace after the end marker dropped across pieces", pieces: []string{"<think>r</think>", "\n", "\n\t ", "c \n"},
			reason: "r", cont: "c \n"},
		{name: "second block after the first", pieces: []string{"<think>a</think>\n<think>b</think>\nc"},
			reason: "ab", cont: "c"},
		{name: "a later start marker is content", pieces: []string{"<think>a</think>c <think>d</think>"},
			reason: "a", cont: "c <think>d</think>"},
		{name: "content starting like a marker", pieces: []string{"<think>a</think>", "<", "tool_call>"},
			reason: "a", cont: "<tool_call>"},
		{name: "never closed", pieces: []string{"<think>still", " going</thi"},
			reason: "still going</thi", cont: ""},
		{name: "start marker cut off at the end", pieces: []string{"<thi"}, cont: "<thi"},
		{name: "starts inside", pieces: []string{"\nplan", "</think>\n\nAnswer"}, startsInside: true,
			reason: "plan", cont: "Answer"},
		{name: "starts inside, repeated start marker", pieces: []string{"\n<think>", "\nplan</think>ok"}, startsInside: true,
			reason: "plan", cont: "ok"},
		{name: "starts inside, never closed", pieces: []string{"a <", "b"}, startsInside: true,
			reason: "a <b"},
		{name: "starts inside, end marker first", pieces: []string{"</think>Answer"}, startsInside: true,
			cont: "Answer"},
		{name: "starts inside, cut-off start marker", pieces: []string{"<thi"}, startsInside: true,
			reason: "<thi"},
		{name: "empty stream", pieces: nil},
		{name: "custom markers", pieces: []string{"[THINK]a[/THI", "NK] b"}, customMarkers: true,
			reason: "a", cont: "b"},
	}
	for _, c := range cases {
		start, end := "", ""
		if c.customMarkers {
			start, end = "[THINK]", "[/THINK]"
		}
		r, ct := splitReasoningPieces(t, newReasoningSplitter(start, end, c.startsInside), c.pieces)
		if r != c.reason || ct != c.cont {
			t.Errorf("%s: reasoning %q content %q, want %q and %q", c.name, r, ct, c.reason, c.cont)
		}
	}
}

// Each piece's reasoning reaches the caller as soon as it cannot be part of
// the end marker.
func TestReasoningSplitterStreams(t *testing.T) {
	s := newReasoningSplitter("", "", true)
	for _, step := range []struct{ in, reason, cont string }{
		{"Let me", "Let me", ""},
		{" see <", " see ", ""},
		{"/", "", ""},
		{"x", "</x", ""},
		{"</think>\n", "", ""},
		{"\nDone", "", "Done"},
	} {
		r, c := s.Push(step.in)
		if r != step.reason || c != step.cont {
			t.Errorf("Push(%q) = %q, %q; want %q, %q", step.in, r, c, step.reason, step.cont)
		}
	}
}

// splitReasoningOnce is the splitter's rule applied to the whole text at once.
func splitReasoningOnce(text, start, end string, startsInside bool) (reasoning, content string) {
	rest := strings.TrimLeft(text, reasoningSpaces)
	if startsInside {
		rest = strings.TrimPrefix(rest, start)
	} else {
		if !strings.HasPrefix(rest, start) {
			return "", text
		}
		content = text[:len(text)-len(rest)]
		rest = rest[len(start):]
	}
	for {
		rest = strings.TrimLeft(rest, reasoningSpaces)
		i := strings.Index(rest, end)
		if i < 0 {
			return reasoning + rest, content
		}
		reasoning += rest[:i]
		rest = strings.TrimLeft(rest[i+len(end):], reasoningSpaces)
		if !strings.HasPrefix(rest, start) {
			return reasoning, content + rest
		}
		rest = rest[len(start):]
	}
}

// reasoningFragments make random texts rich in markers, their beginnings and
// whitespace, which random bytes would seldom contain.
var reasoningFragments = []string{"<think>", "</think>", "[THINK]", "[/THINK]", "<", "</", "<thi", "</thin", "[/TH", "think>", ">", "\n", " ", "\t", "a", "é"}

// FuzzReasoning checks that however a text is cut into pieces, the
// reasoning and content streamed out join to what the rule gives for the
// whole text, and that nothing beyond a marker's beginning is held back.
func FuzzReasoning(f *testing.F) {
	f.Add("", []byte{0, 11, 14, 1, 11, 11, 14}, []byte{3, 9, 1}, false, false)
	f.Add("\nplan</think> ok <think>", []byte{}, []byte{1, 1, 1, 1}, true, false)
	f.Add("x", []byte{2, 14, 3, 11, 2, 9, 8}, []byte{2, 7}, false, true)
	f.Fuzz(func(t *testing.T, text string, frags, cuts []byte, startsInside, custom bool) {
		start, end := "<think>", "</think>"
		if custom {
			start, end = "[THINK]", "[/THINK]"
		}
		for _, b := range frags {
			text += reasoningFragments[int(b)%len(reasoningFragments)]
		}
		var pieces []string
		rest := text
		for _, c := range cuts {
			n := min(int(c)%16, len(rest))
			pieces = append(pieces, rest[:n])
			rest = rest[n:]
		}
		pieces = append(pieces, rest)
		r, c := splitReasoningPieces(t, newReasoningSplitter(start, end, startsInside), pieces)
		wantR, wantC := splitReasoningOnce(text, start, end, startsInside)
		if r != wantR || c != wantC {
			t.Fatalf("pieces %q: reasoning %q content %q, want %q and %q", pieces, r, c, wantR, wantC)
		}
	})
}
