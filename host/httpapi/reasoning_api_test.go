package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// thinkingBackend is the mock whose decodes emit a reasoning block, then
// the answer, in pieces that split the markers; opens says whether its
// prompts' template opened the block already (Tokenize).
type thinkingBackend struct {
	iface.Backend
	pieces []string
	opens  bool
}

func (b thinkingBackend) Tokenize(ctx context.Context, req iface.PrefillRequest) (iface.Prompt, error) {
	p, err := b.Backend.Tokenize(ctx, req)
	p.OpensThinking = b.opens
	return p, err
}

func (b thinkingBackend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	for _, s := range b.pieces {
		if err := emit(iface.Token{ID: 'x', Text: s}); err != nil {
			return iface.DecodeResult{}, err
		}
	}
	return iface.DecodeResult{TokensGenerated: len(b.pieces), StopReason: "eos"}, nil
}

// TestReasoningContent: with SplitReasoning a chat reply's <think> block
// comes back as reasoning_content, whole and streamed; the text API and an
// engine without the split leave it in the text.
func TestReasoningContent(t *testing.T) {
	m := mock.New(nil)
	info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	chat := `{"messages":[{"role":"user","content":"why?"}],"max_tokens":20}`
	for _, tc := range []struct {
		name             string
		b                thinkingBackend
		split            bool
		content, reasons string
	}{
		{"split", thinkingBackend{pieces: []string{"<thi", "nk>because", " reasons</th", "ink>\n\nThe answer."}}, true, "The answer.", "because reasons"},
		{"opened by the template", thinkingBackend{pieces: []string{"still thinking", "</think>", "Done."}, opens: true}, true, "Done.", "still thinking"},
		{"no split", thinkingBackend{pieces: []string{"<think>x</think>y"}}, false, "<think>x</think>y", ""},
	} {
		tc.b.Backend = m
		s := host.NewServer(tc.b, info, nil, host.Config{})
		h := Handler(s, Options{SplitReasoning: tc.split})
		var r struct {
			Choices []struct {
				Message struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"message"`
			} `json:"choices"`
		}
		rec := post(h, "/v1/chat/completions", chat)
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("%s: %d %s", tc.name, rec.Code, rec.Body)
		}
		if got := r.Choices[0].Message; got.Content != tc.content || got.ReasoningContent != tc.reasons {
			t.Errorf("%s: content %q reasoning %q, want %q and %q", tc.name, got.Content, got.ReasoningContent, tc.content, tc.reasons)
		}
		// Streamed, the deltas add up to the same.
		var content, reasons strings.Builder
		stream := post(h, "/v1/chat/completions", strings.TrimSuffix(chat, "}")+`,"stream":true}`)
		sc := bufio.NewScanner(stream.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var ev struct {
				Choices []struct {
					Delta struct {
						Content          string `json:"content"`
						ReasoningContent string `json:"reasoning_content"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(data), &ev) == nil && len(ev.Choices) == 1 {
				content.WriteString(ev.Choices[0].Delta.Content)
				reasons.WriteString(ev.Choices[0].Delta.ReasoningContent)
			}
		}
		if content.String() != tc.content || reasons.String() != tc.reasons {
			t.Errorf("%s streamed: content %q reasoning %q", tc.name, content.String(), reasons.String())
		}
		s.Close()
	}
}
