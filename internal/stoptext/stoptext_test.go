package stoptext

import "testing"

func TestTextStream(t *testing.T) {
	for _, c := range []struct {
		name    string
		stops   []string
		pieces  []string
		want    []string // released after each piece
		stopped bool
		rest    string // flush at the end
	}{
		{name: "no stops", pieces: []string{"ab", "c"}, want: []string{"ab", "c"}},
		{name: "stop inside a piece", stops: []string{"END"}, pieces: []string{"abENDcd"}, want: []string{"ab"}, stopped: true},
		{name: "stop across pieces", stops: []string{"END"}, pieces: []string{"abE", "N", "Dx"}, want: []string{"ab", "", ""}, stopped: true},
		{name: "false start released", stops: []string{"END"}, pieces: []string{"abE", "Nx"}, want: []string{"ab", "ENx"}},
		{name: "held tail flushed", stops: []string{"END"}, pieces: []string{"abEN"}, want: []string{"ab"}, rest: "EN"},
		{name: "earliest of two", stops: []string{"cd", "b"}, pieces: []string{"abcd"}, want: []string{"a"}, stopped: true},
		{name: "split UTF-8", pieces: []string{"h\xc3", "\xa9!"}, want: []string{"h", "é!"}},
		{name: "split 4-byte rune", pieces: []string{"\xf0\x9f", "\x98", "\x80"}, want: []string{"", "", "😀"}},
		{name: "invalid byte passes", pieces: []string{"a\xff"}, want: []string{"a\xff"}},
	} {
		ts := &Stream{Stops: c.stops}
		stopped := false
		for i, p := range c.pieces {
			out, st := ts.Push(p)
			if i < len(c.want) && out != c.want[i] {
				t.Errorf("%s: piece %d released %q, want %q", c.name, i, out, c.want[i])
			}
			stopped = st
		}
		if stopped != c.stopped {
			t.Errorf("%s: stopped %v, want %v", c.name, stopped, c.stopped)
		}
		if rest := ts.Flush(); !c.stopped && rest != c.rest {
			t.Errorf("%s: flush %q, want %q", c.name, rest, c.rest)
		}
	}
}

// TestMatched: the stop string that ended the text is the one found first
// in it, across pieces; none before a match.
func TestMatched(t *testing.T) {
	s := &Stream{Stops: []string{"END", "ST"}}
	if out, stopped := s.Push("abc E"); stopped || s.Matched != "" || out != "abc " {
		t.Fatalf("%q %v %q", out, stopped, s.Matched)
	}
	if out, stopped := s.Push("ND then STOP"); !stopped || s.Matched != "END" || out != "" {
		t.Errorf("%q %v %q, want END", out, stopped, s.Matched)
	}
	s = &Stream{Stops: []string{"END", "ST"}}
	if _, stopped := s.Push("a STEND"); !stopped || s.Matched != "ST" {
		t.Errorf("%v %q, want ST", stopped, s.Matched)
	}
}
