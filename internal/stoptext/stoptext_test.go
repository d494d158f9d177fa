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
