package promptcache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
)

// fakeAlloc hands out Go memory of exactly the bytes asked for, rounded to
// its page, and keeps count of what is live, so a test sees the cache's
// accounting against what it really holds.
type fakeAlloc struct {
	page int64
	mu   sync.Mutex
	live int64 // bytes allocated and not yet freed
	peak int64
	fail error // the next Alloc's error
	// during, if set, runs inside every Alloc (a test's look at the cache
	// while a save holds its reservation).
	during func()
}

func (a *fakeAlloc) Size(n int64) int64 { return (n + a.page - 1) / a.page * a.page }

func (a *fakeAlloc) Alloc(n int64) (Memory, error) {
	if a.during != nil {
		a.during()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fail != nil {
		err := a.fail
		a.fail = nil
		return nil, err
	}
	m := &fakeMem{a: a, b: make([]byte, a.Size(n))}
	a.live += int64(len(m.b))
	a.peak = max(a.peak, a.live)
	return m, nil
}

type fakeMem struct {
	a     *fakeAlloc
	b     []byte
	freed bool
}

func (m *fakeMem) Bytes() []byte { return m.b }

func (m *fakeMem) Free() {
	m.a.mu.Lock()
	defer m.a.mu.Unlock()
	if m.freed {
		panic("memory freed twice")
	}
	m.freed = true
	m.a.live -= int64(len(m.b))
}

// seq is n tokens starting with lead, then lead+1, …: sequences of other
// leads share nothing.
func seq(lead int32, n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = lead + int32(i)
	}
	return s
}

func cat(a []int32, b ...int32) []int32 { return append(slices.Clone(a), b...) }

// save saves tokens with a state of stateBytes, its bytes their count.
func save(t *testing.T, c *Cache, tokens []int32, stateBytes int64) bool {
	t.Helper()
	s, err := c.Begin(tokens, stateBytes)
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return false
	}
	if int64(len(s.Mem())) < stateBytes {
		t.Fatalf("a save's memory of %d bytes for a %d-byte state", len(s.Mem()), stateBytes)
	}
	if err := s.Commit(stateBytes, 0); err != nil {
		t.Fatal(err)
	}
	return true
}

// cached is the leading token of every entry, least recently used first.
func cached(c *Cache) []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int32
	for _, e := range c.entries {
		out = append(out, e.Tokens[0])
	}
	return out
}

func TestKeep(t *testing.T) {
	base := seq(100, 60)
	longer := cat(base, 7, 8, 9)
	diverged := cat(base[:50], 7, 8, 9)
	kv, hybrid, window := Rule{}, Rule{Recurrent: true}, Rule{Window: 32}
	for _, c := range []struct {
		name         string
		r            Rule
		seq          []int32
		posMin       int
		prompt       []int32
		keep, shared int
	}{
		{"kv extends", kv, base, 0, longer, 60, 60},
		{"kv diverges", kv, base, 0, diverged, 50, 50},
		{"kv the same prompt keeps all but its last token", kv, base, 0, base, 59, 60},
		{"kv nothing shared", kv, base, 0, seq(900, 10), 0, 0},
		{"kv empty sequence", kv, nil, -1, base, 0, 0},
		{"recurrent extends", hybrid, base, 59, longer, 60, 60},
		{"recurrent diverges: cannot be cut", hybrid, base, 59, diverged, 0, 0},
		{"recurrent the same prompt: its last token cannot be cut", hybrid, base, 59, base, 0, 0},
		{"window holds the window before the cut", window, base, 10, diverged, 50, 50},
		{"window lost the positions before the cut", window, base, 30, diverged, 0, 0},
		{"window, a cut inside the window from position 0", window, base, 0, cat(base[:20], 1), 20, 20},
	} {
		if got := c.r.Keep(c.seq, c.posMin, c.prompt); got != c.keep {
			t.Errorf("%s: Keep %d, want %d", c.name, got, c.keep)
		}
		if got := c.r.shared(c.seq, c.posMin, c.prompt); got != c.shared {
			t.Errorf("%s: shared %d, want %d", c.name, got, c.shared)
		}
	}
}

func TestLeaves(t *testing.T) {
	base := seq(100, 100)
	for _, c := range []struct {
		name   string
		r      Rule
		seq    []int32
		prompt []int32
		want   bool
	}{
		{"empty slot", Rule{}, nil, base, false},
		{"the prompt extends it", Rule{}, base, cat(base, 1), false},
		{"keeps half", Rule{}, base, cat(base[:50], 1), false},
		{"keeps less than half", Rule{}, base, cat(base[:49], 1), true},
		{"another prompt", Rule{}, base, seq(900, 100), true},
		{"recurrent, diverging late", Rule{Recurrent: true}, base, cat(base[:99], 1), true},
	} {
		posMin := 0
		if c.r.Recurrent {
			posMin = len(c.seq) - 1
		}
		if got := c.r.Leaves(c.seq, posMin, c.prompt); got != c.want {
			t.Errorf("%s: Leaves %v, want %v", c.name, got, c.want)
		}
	}
}

// TestBudgetLRU: entries go least recently used first to make room, before
// the new one is allocated, so the memory live never exceeds the budget;
// what the cache counts is what its allocator holds, plus 4 bytes a token.
func TestBudgetLRU(t *testing.T) {
	a := &fakeAlloc{page: 100}
	c := New(1000+3*4*10, 0, a) // three 10-token entries of 300-byte states
	for i := range 3 {
		if !save(t, c, seq(int32(1000*(i+1)), 10), 250) {
			t.Fatalf("entry %d not saved", i)
		}
	}
	if got := cached(c); !slices.Equal(got, []int32{1000, 2000, 3000}) {
		t.Fatalf("cached %v", got)
	}
	st := c.Stats()
	if st.Bytes != 3*(300+40) || st.Entries != 3 || st.Tokens != 30 || a.live != 900 {
		t.Fatalf("stats %+v, allocator live %d", st, a.live)
	}
	// A fourth needs the room of one: the least recently used goes.
	save(t, c, seq(4000, 10), 300)
	if got := cached(c); !slices.Equal(got, []int32{2000, 3000, 4000}) {
		t.Fatalf("after a fourth: %v", got)
	}
	// Taking one makes it the slot's; a later save of it is the most recent.
	r := c.Take(Rule{}, nil, -1, cat(seq(2000, 10), 5))
	if r == nil || r.Entry.Tokens[0] != 2000 {
		t.Fatalf("took %+v", r)
	}
	if st := c.Stats(); st.Bytes != 3*340 { // the taken entry's memory stays counted until Done
		t.Fatalf("while restoring: %+v", st)
	}
	r.Done(true)
	save(t, c, cat(seq(2000, 10), 5), 250)
	if got := cached(c); !slices.Equal(got, []int32{3000, 4000, 2000}) {
		t.Fatalf("after the restored one came back: %v", got)
	}
	// Larger than the budget alone: skipped, nothing evicted.
	if save(t, c, seq(5000, 10), 2000) {
		t.Fatal("a state larger than the budget was saved")
	}
	if got := cached(c); len(got) != 3 {
		t.Fatalf("a skipped save evicted: %v", got)
	}
	st = c.Stats()
	if st.Evictions != 1 || st.Skipped != 1 || st.Saves != 5 || st.Hits != 1 || st.Restores != 1 || st.RestoreBytes != 250 {
		t.Fatalf("stats %+v", st)
	}
	if a.peak > c.budget {
		t.Fatalf("the allocator held %d bytes at most, the budget is %d", a.peak, c.budget)
	}
	if st.Bytes != a.live+st.Tokens*4 {
		t.Fatalf("counted %d bytes, the allocator holds %d and the tokens %d", st.Bytes, a.live, st.Tokens*4)
	}
	c.Drop()
	if st := c.Stats(); st.Bytes != 0 || st.Entries != 0 || a.live != 0 {
		t.Fatalf("after Drop: %+v, live %d", st, a.live)
	}
}

// TestSaveContained: a sequence an entry holds all of is not saved again;
// entries that are prefixes of a new one are dropped for it.
func TestSaveContained(t *testing.T) {
	a := &fakeAlloc{page: 1}
	c := New(-1, 0, a)
	long := seq(1, 40)
	save(t, c, long[:10], 10)
	save(t, c, seq(500, 10), 10)
	save(t, c, long[:20], 20) // holds long[:10]: that one goes
	if got := c.Stats(); got.Entries != 2 || got.Tokens != 30 || got.Evictions != 0 {
		t.Fatalf("stats %+v", got)
	}
	if save(t, c, long[:15], 15) {
		t.Fatal("a prefix of an entry was saved")
	}
	if got := cached(c); !slices.Equal(got, []int32{500, 1}) {
		t.Fatalf("cached %v", got)
	}
	if a.live != 40 { // the dropped entry's memory is kept for the next save
		t.Fatalf("live %d", a.live)
	}
}

// TestTokenLimit: with no limit in bytes the entries hold at most the
// token limit (llama-server's n_ctx), least recently used out first.
func TestTokenLimit(t *testing.T) {
	a := &fakeAlloc{page: 1}
	c := New(BudgetOf(-1), 25, a)
	for i := range 3 {
		save(t, c, seq(int32(100*(i+1)), 10), 1<<20)
	}
	st := c.Stats()
	if got := cached(c); !slices.Equal(got, []int32{200, 300}) || st.Tokens != 20 || st.Evictions != 1 || st.BudgetBytes != -1 {
		t.Fatalf("cached %v, stats %+v", got, st)
	}
}

// TestTake: llama-server's choice. An empty slot takes the entry the
// prompt keeps most of (at least a quarter of it) and that serves the most
// of the prompt; a slot's own sequence wins unless an entry beats it on
// both shares.
func TestTake(t *testing.T) {
	sys := seq(1, 40) // a shared system prompt
	convA := cat(sys, seq(1000, 60)...)
	convB := cat(sys, seq(2000, 60)...)
	other := seq(5000, 100)
	newC := func() *Cache {
		c := New(-1, 0, &fakeAlloc{page: 1})
		save(t, c, convA, 10)
		save(t, c, convB, 10)
		save(t, c, other, 10)
		return c
	}
	lead := func(r *Restore) int32 {
		if r == nil {
			return -1
		}
		return r.Entry.Tokens[40]
	}
	for _, tc := range []struct {
		name   string
		rule   Rule
		slot   []int32
		prompt []int32
		want   int32 // the entry's token 40, -1 none
	}{
		{"empty slot, conversation A goes on", Rule{}, nil, cat(convA, 7, 8), 1000},
		{"empty slot, conversation B goes on", Rule{}, nil, cat(convB, 7, 8), 2000},
		{"the slot holds A already", Rule{}, convA, cat(convA, 7, 8), -1},
		{"the slot holds B, A goes on", Rule{}, convB, cat(convA, 7, 8), 1000},
		{"only the system prompt is shared: 40 of 100 kept, f_sim 40/42", Rule{}, nil, cat(sys, 7, 8), 1000},
		{"the slot shares the system prompt too: no entry beats it", Rule{}, cat(sys, 9), cat(sys, 7, 8), -1},
		{"a quarter of an entry is not enough", Rule{}, nil, cat(convA[:24], 7), -1},
		{"nothing shared", Rule{}, nil, seq(9000, 10), -1},
		{"recurrent: A is a prefix of the prompt", Rule{Recurrent: true}, nil, cat(convA, 7), 1000},
		{"recurrent: the prompt diverges from every entry", Rule{Recurrent: true}, nil, cat(convA[:90], 7), -1},
	} {
		c := newC()
		posMin := 0
		if tc.rule.Recurrent {
			posMin = len(tc.slot) - 1
		}
		for e := range slices.Values(c.entries) {
			if tc.rule.Recurrent {
				e.PosMin = len(e.Tokens) - 1
			}
		}
		r := c.Take(tc.rule, tc.slot, posMin, tc.prompt)
		if got := lead(r); got != tc.want {
			t.Errorf("%s: took %d, want %d", tc.name, got, tc.want)
			continue
		}
		st := c.Stats()
		switch {
		case r == nil && (st.Misses != 1 || st.Hits != 0 || st.Entries != 3):
			t.Errorf("%s: a miss counted %+v", tc.name, st)
		case r != nil && (st.Hits != 1 || st.Misses != 0 || st.Entries != 2 || st.Tokens != 300-int64(len(r.Entry.Tokens))):
			t.Errorf("%s: a hit counted %+v", tc.name, st)
		}
		if r != nil {
			r.Done(false)
			if st := c.Stats(); st.RestoreFailures != 1 || st.Restores != 0 || st.Bytes != 4*st.Tokens+30 { // two entries, the taken one's memory kept
				t.Errorf("%s: after a failed restore %+v", tc.name, st)
			}
		}
	}
}

// TestFailures: a failed allocation, a save that wrote other than it said,
// and an aborted save leave nothing held.
func TestFailures(t *testing.T) {
	a := &fakeAlloc{page: 1, fail: errors.New("out of memory")}
	c := New(1000, 0, a)
	if s, err := c.Begin(seq(1, 10), 100); s != nil || err == nil {
		t.Fatalf("Begin with a failing allocator: %v, %v", s, err)
	}
	s, err := c.Begin(seq(1, 10), 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(99, 0); err == nil {
		t.Fatal("a short save was committed")
	}
	if err := s.Commit(100, 0); err == nil {
		t.Fatal("a failed save was committed after all")
	}
	s, _ = c.Begin(seq(1, 10), 100)
	s.Abort()
	s.Abort()
	st := c.Stats()
	if st.Bytes != 100 || st.Entries != 0 || a.live != 100 || st.SaveFailures != 3 || st.Saves != 0 { // the memory kept for the next save
		t.Fatalf("stats %+v, live %d", st, a.live)
	}
	c.Drop()
	if st := c.Stats(); st.Bytes != 0 || a.live != 0 {
		t.Fatalf("after Drop: %+v, live %d", st, a.live)
	}
	if New(0, 100, a) != nil {
		t.Fatal("a cache of no bytes")
	}
	var none *Cache
	if s, err := none.Begin(seq(1, 3), 1); s != nil || err != nil || none.Take(Rule{}, nil, -1, seq(1, 3)) != nil || none.Stats() != nil {
		t.Fatal("the nil cache did something")
	}
	none.Drop()
}

// TestConcurrentBudget: slots saving and restoring at once with a small
// budget never make the cache hold more than it, counted or allocated, and
// every byte comes back.
func TestConcurrentBudget(t *testing.T) {
	a := &fakeAlloc{page: 64}
	c := New(4096, 0, a)
	a.during = func() {
		if st := c.Stats(); st.Bytes > c.budget {
			t.Errorf("counted %d bytes during a save, over the budget %d", st.Bytes, c.budget)
		}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range 400 {
				conv := int32(rng.IntN(12)) * 1000
				prompt := seq(conv, 5+rng.IntN(40))
				if rng.IntN(2) == 0 {
					if r := c.Take(Rule{}, nil, -1, prompt); r != nil {
						if r.Entry.Tokens[0] != conv {
							t.Errorf("took %d for %d", r.Entry.Tokens[0], conv)
						}
						r.Done(rng.IntN(4) > 0)
					}
					continue
				}
				s, err := c.Begin(prompt, int64(64+rng.IntN(2000)))
				if err != nil {
					t.Error(err)
					return
				}
				if s == nil {
					continue
				}
				if rng.IntN(5) == 0 {
					s.Abort()
				} else if err := s.Commit(s.entry.StateBytes, 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	st := c.Stats()
	if a.peak > c.budget || st.Bytes > c.budget {
		t.Fatalf("peak allocation %d, counted %d, budget %d", a.peak, st.Bytes, c.budget)
	}
	if st.Bytes != a.live+4*st.Tokens {
		t.Fatalf("counted %d, allocator %d and tokens %d", st.Bytes, a.live, 4*st.Tokens)
	}
	if st.Saves == 0 || st.Hits == 0 || st.Evictions == 0 {
		t.Fatalf("the workload did not exercise the cache: %+v", st)
	}
	t.Logf("%+v, peak %d", *st, a.peak)
	c.Drop()
	if a.live != 0 {
		t.Fatalf("%d bytes live after Drop", a.live)
	}
}

// countingAlloc counts the allocations its fakeAlloc makes.
type countingAlloc struct {
	*fakeAlloc
	n int
}

func (a *countingAlloc) Alloc(n int64) (Memory, error) {
	a.n++
	return a.fakeAlloc.Alloc(n)
}

// TestSpare: an entry's memory, once restored, is kept for the next save
// it fits (a conversation's longer state in the room roomFor leaves), so
// conversations taking turns allocate nothing after their first saves;
// kept memory counts against the budget and goes first, before entries,
// when a save needs room; at most maxSpare are kept.
func TestSpare(t *testing.T) {
	a := &countingAlloc{fakeAlloc: &fakeAlloc{page: 1 << 10}}
	c := New(64<<20, 0, a)
	state := func(tokens int) int64 { return 8<<20 + int64(tokens)<<12 } // 8 MiB and 4 KiB a token
	convs := [][]int32{seq(1000, 100), seq(2000, 100)}
	save(t, c, convs[0], state(100))
	for turn := range 6 {
		k := turn % 2
		conv := convs[k]
		if r := c.Take(Rule{}, nil, -1, cat(conv, 9)); turn > 0 && r == nil {
			t.Fatalf("turn %d: conversation %d not in the cache", turn, k)
		} else if r != nil {
			r.Done(true)
		}
		convs[1-k] = cat(convs[1-k], seq(int32(5000+10*turn), 10)...) // the other one went on meanwhile
		save(t, c, convs[1-k], state(len(convs[1-k])))
	}
	// One slot: the one coming back leaves its memory to the one leaving.
	if st := c.Stats(); a.n != 1 || st.Bytes != a.live+4*st.Tokens || st.Bytes > 64<<20 {
		t.Fatalf("%d allocations for two conversations taking turns on one slot; %+v, live %d", a.n, st, a.live)
	}
	if roomFor(8<<20+1) != 10<<20 || roomFor(9<<20) != 10<<20 || roomFor(100) != 100 || roomFor(16<<20) != 16<<20 {
		t.Fatalf("roomFor %d %d %d %d", roomFor(8<<20+1), roomFor(9<<20), roomFor(100), roomFor(16<<20))
	}

	// Room: spare memory goes before any entry.
	small := New(33<<20, 0, &fakeAlloc{page: 1}) // three 10 MiB entries, or two and a 12 MiB one
	for i := range 3 {
		save(t, small, seq(int32(100*(i+1)), 10), 9<<20)
	}
	r := small.Take(Rule{}, nil, -1, cat(seq(100, 10), 1))
	r.Done(true) // its 10 MiB kept
	if got := cached(small); !slices.Equal(got, []int32{200, 300}) || len(small.spare) != 1 {
		t.Fatalf("cached %v, %d spare", got, len(small.spare))
	}
	save(t, small, seq(900, 10), 12<<20) // too large for the spare memory, which is freed for it
	if got, st := cached(small), small.Stats(); !slices.Equal(got, []int32{200, 300, 900}) || len(small.spare) != 0 || st.Evictions != 0 {
		t.Fatalf("cached %v, %d spare, %+v", got, len(small.spare), st)
	}

	// At most maxSpare kept.
	many := New(-1, 0, &fakeAlloc{page: 1})
	for i := range maxSpare + 2 {
		save(t, many, seq(int32(100*(i+1)), 10), 100)
	}
	for i := range maxSpare + 2 {
		many.Take(Rule{}, nil, -1, cat(seq(int32(100*(i+1)), 10), 1)).Done(true)
	}
	if st := many.Stats(); len(many.spare) != maxSpare || st.Bytes != maxSpare*100 || st.Entries != 0 {
		t.Fatalf("%d spare, %+v", len(many.spare), st)
	}
}

func TestMapped(t *testing.T) {
	pinned := 0
	m := Mapped{Pin: func(b []byte) func() {
		pinned++
		return func() { pinned-- }
	}}
	if page := int64(os.Getpagesize()); m.Size(1) != page || m.Size(page) != page || m.Size(page+1) != 2*page {
		t.Fatalf("sizes %d, %d", m.Size(1), m.Size(m.Size(1)+1))
	}
	mem, err := m.Alloc(10000)
	if err != nil {
		t.Fatal(err)
	}
	b := mem.Bytes()
	if int64(len(b)) != m.Size(10000) {
		t.Fatalf("%d bytes for %d", len(b), m.Size(10000))
	}
	for i := range b {
		b[i] = byte(i)
	}
	if fmt.Sprint(b[:3]) != "[0 1 2]" || !Pinned(mem) || pinned != 1 {
		t.Fatalf("bytes %v, pinned %v (%d)", b[:3], Pinned(mem), pinned)
	}
	mem.Free()
	mem.Free()
	if pinned != 0 || mem.Bytes() != nil {
		t.Fatalf("after Free: pinned %d", pinned)
	}
	plain, err := Mapped{}.Alloc(1)
	if err != nil || Pinned(plain) {
		t.Fatalf("without a Pin: pinned %v, %v", err == nil && Pinned(plain), err)
	}
	plain.Free()
}

// fakeExtra serves prompts that share at least from tokens with the entry,
// as a checkpoint taken after from tokens would.
type fakeExtra struct {
	bytes int64
	from  int
}

func (x fakeExtra) Bytes() int64 { return x.bytes }

func (x fakeExtra) Serves(n, prefix, posMin int) bool { return prefix >= x.from }

// TestExtra: what an entry carries (a hybrid's checkpoints) counts against
// the budget, lets Take choose an entry whose recurrent state cannot be
// cut to the prompt, and comes back with the entry.
func TestExtra(t *testing.T) {
	hybrid := Rule{Recurrent: true}
	a := seq(100, 100)
	parted := cat(a[:90], 7, 8) // parts from a after 90 tokens
	saveWith := func(c *Cache, tokens []int32, x Extra) bool {
		t.Helper()
		s, err := c.BeginWith(tokens, 10, x)
		if err != nil {
			t.Fatal(err)
		}
		if s == nil {
			return false
		}
		if err := s.Commit(10, len(tokens)-1); err != nil {
			t.Fatal(err)
		}
		return true
	}

	c := New(-1, 0, &fakeAlloc{page: 1})
	saveWith(c, a, nil)
	if r := c.Take(hybrid, nil, -1, parted); r != nil {
		t.Fatalf("a recurrent entry without checkpoints served a prompt that parts from it")
	}

	c = New(-1, 0, &fakeAlloc{page: 1})
	x := fakeExtra{bytes: 1000, from: 64}
	saveWith(c, a, x)
	if st := c.Stats(); st.Bytes != 10+4*100+1000 {
		t.Errorf("an entry with 1000 bytes of checkpoints holds %d bytes, want %d", st.Bytes, 10+4*100+1000)
	}
	r := c.Take(hybrid, nil, -1, parted)
	if r == nil || r.Entry.Extra != x {
		t.Fatalf("the entry's checkpoints serve the prompt: took %+v", r)
	}
	r.Done(true)
	if st := c.Stats(); st.Bytes != 10 { // the state's memory kept spare, the checkpoints handed back
		t.Errorf("after the restore %d bytes held, want 10", st.Bytes)
	}

	c = New(-1, 0, &fakeAlloc{page: 1})
	saveWith(c, a, fakeExtra{bytes: 1000, from: 95})
	if r := c.Take(hybrid, nil, -1, parted); r != nil {
		t.Errorf("checkpoints after the point where the prompt parts served it")
	}

	c = New(1200, 0, &fakeAlloc{page: 1})
	if saveWith(c, a, fakeExtra{bytes: 1000, from: 64}) {
		t.Errorf("an entry of 1410 bytes saved in a budget of 1200")
	}
	if st := c.Stats(); st.Skipped != 1 || st.Bytes != 0 {
		t.Errorf("an entry over the budget: %+v", st)
	}
}
