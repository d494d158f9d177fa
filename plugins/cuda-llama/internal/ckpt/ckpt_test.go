package ckpt

import (
	"slices"
	"testing"
)

var server = Rules{Max: DefaultMax, MinStep: DefaultMinStep, NBatch: 2048, NUBatch: 512}

func TestChunkEndOffsets(t *testing.T) {
	r := server
	cases := []struct{ n, next, room, want int }{
		{3000, 0, 2048, 2048},
		{3000, 2048, 2048, 2484}, // n − 516
		{3000, 2484, 2048, 2996}, // n − 4
		{3000, 2996, 2048, 3000},
		{100, 0, 2048, 96}, // shorter than n_ubatch + 4: only n − 4
		{3000, 0, 10, 10},
	}
	for _, c := range cases {
		if got := r.ChunkEnd(c.n, c.next, c.room, Spans{}, -1); got != c.want {
			t.Errorf("ChunkEnd(%d, %d, %d) = %d, want %d", c.n, c.next, c.room, got, c.want)
		}
	}
	r.Max = 0
	if got := r.ChunkEnd(3000, 2048, 2048, Spans{}, -1); got != 3000 {
		t.Errorf("checkpoints off: ChunkEnd broke at %d", got)
	}
	// n_batch smaller than the offsets: the breaks are at n − n_batch.
	r = Rules{Max: 4, NBatch: 2, NUBatch: 512}
	if got := r.ChunkEnd(10, 0, 2, Spans{}, -1); got != 2 {
		t.Errorf("ChunkEnd = %d", got)
	}
	if got := r.ChunkEnd(10, 7, 2, Spans{}, -1); got != 8 {
		t.Errorf("ChunkEnd = %d, want 8 (n − n_batch)", got)
	}
}

func TestTake(t *testing.T) {
	r := server
	cases := []struct {
		name                          string
		n, start, end, memMin, newest int
		spans                         Spans
		want                          bool
	}{
		{"empty memory", 3000, 0, 2048, -1, -1, Spans{}, false},
		{"mid prompt", 10000, 2048, 4096, 2047, -1, Spans{}, false},
		{"near end", 3000, 2484, 2996, 2483, -1, Spans{}, true},
		{"last chunk", 3000, 2996, 3000, 2995, 2484, Spans{}, true},
		{"user start, first", 10000, 500, 2548, 499, -1, Spans{UserStarts: []int{500, 9000}}, true},
		{"user start within step", 20000, 500, 2548, 499, 100, Spans{UserStarts: []int{500, 9000}}, false},
		{"user start past step", 20000, 8500, 9000, 8499, 100, Spans{UserStarts: []int{8500, 9000}}, true},
		{"last user within step", 20000, 9000, 11048, 8999, 8500, Spans{UserStarts: []int{8500, 9000}}, true},
	}
	for _, c := range cases {
		if got := r.Take(c.n, c.start, c.end, c.memMin, c.spans, c.newest); got != c.want {
			t.Errorf("%s: Take = %v, want %v", c.name, got, c.want)
		}
	}
	r.Max = 0
	if r.Take(3000, 2996, 3000, 2995, Spans{}, -1) {
		t.Error("checkpoints off: Take")
	}
}

func cp(nTokens int, task uint64, size int) *Checkpoint {
	return &Checkpoint{PosMin: nTokens - 1, PosMax: nTokens - 1, NTokens: nTokens, Data: make([]byte, size), Task: task}
}

func TestListAdd(t *testing.T) {
	r := Rules{Max: 3, MinStep: 100}
	var l List
	for i, n := range []int{100, 150, 400, 700} {
		l.Add(r, cp(n, uint64(i+1), 1))
	}
	// 150 lies within MinStep of 100 and is another prompt's: dropped when
	// 400 came; 700 then fits the count.
	got := []int{}
	for _, c := range l.All() {
		got = append(got, c.NTokens)
	}
	if !slices.Equal(got, []int{100, 400, 700}) {
		t.Fatalf("held %v, want [100 400 700]", got)
	}
	// The same task keeps its own close checkpoints.
	var m List
	m.Add(r, cp(100, 9, 1))
	m.Add(r, cp(110, 9, 1))
	m.Add(r, cp(120, 9, 1))
	if m.Len() != 3 {
		t.Fatalf("same task: %d held, want 3", m.Len())
	}
	m.Add(r, cp(130, 9, 1))
	if m.Len() != 3 || m.Oldest().NTokens != 110 {
		t.Fatalf("full: %d held, oldest %d", m.Len(), m.Oldest().NTokens)
	}
	if d := m.After(115); len(d) != 2 || m.Len() != 1 {
		t.Fatalf("After dropped %d, %d left", len(d), m.Len())
	}
}

func TestStoreBudget(t *testing.T) {
	r := Rules{Max: 8}
	s := NewStore(r, 2, 100)
	if !s.Add(0, cp(10, 1, 40)) || !s.Add(1, cp(10, 2, 40)) {
		t.Fatal("refused within budget")
	}
	// A third of 40 goes over 100: the oldest (slot 0's) is dropped, never
	// the new one.
	if !s.Add(1, cp(20, 2, 40)) {
		t.Fatal("refused")
	}
	if n, _ := s.Slot(0); n != 0 {
		t.Fatalf("slot 0 holds %d, want 0", n)
	}
	st := s.Stats()
	if st.Bytes != 80 || st.Held != 2 || st.Dropped != 1 || st.Taken != 3 {
		t.Fatalf("stats %+v", st)
	}
	if s.Add(0, cp(30, 3, 101)) {
		t.Fatal("took a checkpoint larger than the budget")
	}
	if st := s.Stats(); st.OverBudget != 1 || st.Bytes != 80 {
		t.Fatalf("stats %+v", st)
	}
	// One brought by a prompt cache entry or a STATE_PUT is held and
	// budgeted alike, but not counted as taken.
	if !s.Put(0, cp(40, 4, 30)) {
		t.Fatal("Put refused within budget")
	}
	if st := s.Stats(); st.Taken != 3 || st.Held != 2 || st.Bytes != 70 || st.Dropped != 2 {
		t.Fatalf("after Put: stats %+v", st)
	}
	s.Clear(0)
	s.Clear(1)
	if st := s.Stats(); st.Bytes != 0 || st.Held != 0 {
		t.Fatalf("after clear: %+v", st)
	}
}

// Find with a sliding window: the memory's first position must be within
// the window of the prefix, or a checkpoint whose window reaches there.
func TestFindWindow(t *testing.T) {
	r := Rules{Max: 4, NSWA: 100}
	list := []*Checkpoint{
		{PosMin: 0, PosMax: 99, NTokens: 100},
		{PosMin: 400, PosMax: 499, NTokens: 500},
	}
	// The memory holds positions 900.. (a window at 1000): a prefix of 600
	// needs position 500 at least: the checkpoint at 500 serves it.
	res := r.Find(list, 700, 600, 900)
	if res.Restore != list[1] || res.Keep != 499 {
		t.Fatalf("Find = %+v", res)
	}
	// A prefix of 450: only the first checkpoint ends before it.
	res = r.Find(list, 700, 450, 900)
	if res.Restore != list[0] || res.Keep != 99 {
		t.Fatalf("Find = %+v", res)
	}
	// The window still reaches the prefix: cut there.
	res = r.Find(list, 2000, 1050, 900)
	if res.Restore != nil || res.Keep != 1050 {
		t.Fatalf("Find = %+v", res)
	}
	if res := r.Find(list, 10, 0, 900); res.Keep != 0 || res.Restore != nil {
		t.Fatalf("no prefix: %+v", res)
	}
}

// UserStarts: Qwen3's delimiters, a tool result's (<|im_start|>user
// <tool_response>) listed before a user message's, which it begins like.
func TestFindUserStarts(t *testing.T) {
	const start, user, nl, tool, asst = 1, 2, 3, 4, 5
	delims := []Delimiter{
		{Tokens: []int32{start, asst}},
		{Tokens: []int32{start, user, nl, tool}},
		{User: true, Tokens: []int32{start, user}},
		{Tokens: []int32{start, 9}},
	}
	prompt := []int32{start, 9, 7, start, user, nl, 7, 7, start, asst, 7, start, user, nl, tool, 7, start, user, 8, start, user}
	if got := UserStarts(prompt, delims).UserStarts; !slices.Equal(got, []int{3, 16, 19}) {
		t.Fatalf("user starts %v, want [3 16 19]", got)
	}
	if got := UserStarts(prompt, nil).UserStarts; got != nil {
		t.Fatalf("without delimiters: %v", got)
	}
}
