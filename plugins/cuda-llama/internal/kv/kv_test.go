package kv_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv/kvtest"
)

// These are the plugin's tests of its KV policy (TestKVCapacity,
// TestContextShift, TestPromptReuse, TestCacheReuse) played over a fake
// memory; the plugin's own run them on llama.cpp for what needs its
// numbers (the reused slot's state and logits against a fresh prefill's).

// ramp is n tokens counting from from.
func ramp(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

// cells is n slots over nCtx cells, shared or split equally.
func cells(nCtx, n int, unified bool) *kv.Cells {
	c := &kv.Cells{NCtx: nCtx, SlotCtx: nCtx, Unified: unified}
	if !unified {
		c.SlotCtx = nCtx / n
	}
	for range n {
		c.Slots = append(c.Slots, kv.NewSlot(0))
	}
	return c
}

// prefill evaluates toks into slot i as the plugin's prefill does: what
// the plan keeps where the memory can be cut there, the rest evaluated.
func prefill(t *testing.T, c *kv.Cells, m *kvtest.Memory, i int, toks []int32, minChunk int) kv.Prefill {
	t.Helper()
	s := c.Slots[i]
	p := kv.PlanPrefill(m, s.Seq(), toks, minChunk)
	keep := p.Keep
	switch {
	case len(p.Moves) > 0:
		kv.ApplyMoves(m, i, p.Moves, keep)
	case !kv.Cut(m, i, keep, m.Window):
		m.SeqRm(i)
		keep = 0
	}
	if err := c.Fits(i, len(toks)-keep); err != nil {
		t.Fatalf("prefill of %d tokens keeping %d: %v", len(toks), keep, err)
	}
	m.Eval(i, keep, toks[keep:])
	s.Set(slices.Clone(toks), nil, 0)
	p.Keep = keep
	return p
}

// decode generates up to n tokens in slot i with the scheduler's claims: a
// token is sampled (claiming its cell) one step before it is evaluated, and
// a full slot shifts its context before the step that evaluates its next
// token where shift allows. It returns the tokens and why it stopped.
func decode(c *kv.Cells, m *kvtest.Memory, i, n int, shift bool, nKeep int, bos int32) ([]int32, string) {
	s := c.Slots[i]
	var ids []int32
	pending, stop, needShift := int32(-1), "", false
	room := func() bool {
		switch c.Room(i, shift, nKeep) {
		case kv.RoomShift:
			needShift = true
		case kv.RoomSlotFull, kv.RoomCacheFull:
			stop = "n_tokens_limit"
			return false
		}
		return true
	}
	queue := func() {
		pending = int32(1000 + len(ids))
		s.Claim++
		ids = append(ids, pending)
		if len(ids) >= n {
			stop = "length"
		}
	}
	if !room() {
		return nil, stop
	}
	queue()
	for pending >= 0 {
		if needShift {
			kept, _, _ := kv.Shift(m, i, s.Seq(), nKeep, bos)
			s.Set(kept, nil, 0)
			needShift = false
		}
		m.Eval(i, len(s.Seq()), []int32{pending})
		s.Append([]int32{pending})
		s.Claim--
		pending = -1
		if stop == "" && room() {
			queue()
		}
	}
	return ids, stop
}

// TestKVCapacity: with the cells split per slot a prompt over a slot's
// share is refused naming it and a decode stops at the share; shared, a
// prompt that does not fit the free cells is refused naming both counts.
func TestKVCapacity(t *testing.T) {
	split := cells(256, 4, false)
	err := split.CheckPrompt(65)
	if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "a slot holds 64 (n_ctx 256 split across 4 slots)") {
		t.Fatalf("prompt over a slot's share: %v", err)
	}
	m := &kvtest.Memory{}
	prefill(t, split, m, 0, make([]int32, 60), 0)
	if _, stop := decode(split, m, 0, 20, false, 0, -1); stop != "n_tokens_limit" || len(split.Slots[0].Seq()) != 64 {
		t.Fatalf("decode to a slot's share: stop %q, n_past %d", stop, len(split.Slots[0].Seq()))
	}

	shared := cells(256, 2, true)
	prefill(t, shared, &kvtest.Memory{}, 0, make([]int32, 200), 0)
	err = shared.Fits(1, 100)
	if !errors.Is(err, iface.ErrNoRoom) || !strings.Contains(err.Error(), "needs 100 KV cells, 56 free (shared by all slots") {
		t.Fatalf("prompt over the free cells: %v", err)
	}
	if err := shared.CheckPrompt(256); err != nil {
		t.Fatalf("a prompt of n_ctx tokens: %v", err)
	}
	shared.Slots[1].Claim = 56
	if _, stop := decode(shared, &kvtest.Memory{}, 0, 5, true, 0, -1); stop != "n_tokens_limit" {
		t.Fatalf("decode with no free cell: stop %q", stop)
	}
}

// TestContextShift: with context_shift a slot that fills its cells drops
// the older half after n_keep and decodes on; the sequence stays within the
// slot, starts with what was kept, and the memory holds exactly it.
func TestContextShift(t *testing.T) {
	c := cells(256, 2, false)
	m := &kvtest.Memory{}
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(10 + i%200)
	}
	prefill(t, c, m, 0, prompt, 0)
	ids, stop := decode(c, m, 0, 100, true, 4, -1)
	if len(ids) != 100 || stop != "length" {
		t.Fatalf("decode through a shift: %d tokens, stop %q", len(ids), stop)
	}
	seq := c.Slots[0].Seq()
	if len(seq) > 128 || !slices.Equal(seq[:4], prompt[:4]) || !slices.Equal(seq[len(seq)-10:], ids[len(ids)-10:]) {
		t.Fatalf("after the shift: n_past %d, starts %v, ends %v (last generated %v)", len(seq), seq[:4], seq[len(seq)-10:], ids[len(ids)-10:])
	}
	if got, whole := m.Tokens(0); !whole || !slices.Equal(got, seq) || m.NPos(0) != len(seq) {
		t.Fatalf("the memory holds %d positions (whole %v), the slot %d tokens", m.NPos(0), whole, len(seq))
	}
}

// TestShiftKeepsBOS: n_keep counts after BOS, and the kept start and the
// moved half are the memory's.
func TestShiftKeepsBOS(t *testing.T) {
	m := &kvtest.Memory{}
	toks := append([]int32{1}, ramp(100, 19)...)
	m.Eval(0, 0, toks)
	kept, keep, discard := kv.Shift(m, 0, toks, 3, 1)
	if keep != 4 || discard != 8 || !slices.Equal(kept, slices.Concat(toks[:4], toks[12:])) {
		t.Fatalf("kept %v (keep %d, discard %d)", kept, keep, discard)
	}
	if got, whole := m.Tokens(0); !whole || !slices.Equal(got, kept) {
		t.Fatalf("the memory holds %v", got)
	}
}

// TestPromptReuse: a prefill sharing a prefix with the slot's sequence
// keeps those cells and the slot then holds exactly the prompt; the same
// prompt again keeps all but its last token, whose logits are the reply's.
func TestPromptReuse(t *testing.T) {
	c := cells(512, 2, true)
	m := &kvtest.Memory{}
	base := ramp(100, 64)
	first := slices.Concat(base, ramp(300, 3))
	second := slices.Concat(base, ramp(400, 3))
	if p := prefill(t, c, m, 0, first, 0); p.Keep != 0 {
		t.Fatalf("reused %d of an empty slot", p.Keep)
	}
	decode(c, m, 0, 5, false, 0, -1)
	p := prefill(t, c, m, 0, second, 0)
	if want := iface.CommonPrefix(first, second); p.Keep != want || p.Prefix != want {
		t.Fatalf("reused %d tokens (prefix %d), the prompts share %d", p.Keep, p.Prefix, want)
	}
	if got, whole := m.Tokens(0); !whole || !slices.Equal(got, second) {
		t.Fatalf("the memory holds %v, want the prompt", got)
	}
	if p := prefill(t, c, m, 0, second, 0); p.Keep != len(second)-1 {
		t.Errorf("the same prompt again reused %d of %d", p.Keep, len(second))
	}
}

// TestCacheReuse: with cache_reuse a prompt that drops part of the slot's
// sequence (an early turn cut from a conversation) keeps the chunk after
// it, its cells moved into place; the memory then holds exactly the
// prompt. A memory that cannot shift keeps the prefix alone.
func TestCacheReuse(t *testing.T) {
	head, early, mid, tail := ramp(10, 5), ramp(50, 7), ramp(100, 18), ramp(200, 4)
	old := slices.Concat(head, early, mid, tail)
	prompt := slices.Concat(head, mid, ramp(300, 3))
	c := cells(256, 1, true)
	m := &kvtest.Memory{}
	prefill(t, c, m, 0, old, 0)
	p := prefill(t, c, m, 0, prompt, 8)
	if p.Keep < len(head)+len(mid) || len(p.Moves) != 1 {
		t.Fatalf("reused %d tokens in %d moves, want at least the prefix %d and the middle %d", p.Keep, len(p.Moves), len(head), len(mid))
	}
	if got, whole := m.Tokens(0); !whole || !slices.Equal(got, prompt) || m.NPos(0) != len(prompt) {
		t.Fatalf("the memory holds %v (%d positions), the prompt %v", got, m.NPos(0), prompt)
	}

	fixed := &kvtest.Memory{NoShift: true}
	fixed.Eval(0, 0, old)
	if p := kv.PlanPrefill(fixed, old, prompt, 8); len(p.Moves) != 0 || p.Keep != len(head) {
		t.Fatalf("a memory that cannot shift: %+v", p)
	}
	if p := kv.PlanPrefill(m, old, prompt, 0); len(p.Moves) != 0 || p.Keep != len(head) {
		t.Fatalf("without cache_reuse: %+v", p)
	}
}

// TestCut: a sliding window is cut only where it still holds the window
// before the cut, and a recurrent state only at its end; a refused cut
// leaves the memory as it was.
func TestCut(t *testing.T) {
	win := &kvtest.Memory{Window: 8}
	win.Eval(0, 0, ramp(0, 20)) // holds positions 12..19
	if kv.Cut(win, 0, 15, 8) {
		t.Error("a window cut where it no longer holds the window before the cut")
	}
	if !kv.Cut(win, 0, 20, 8) || win.NPos(0) != 20 {
		t.Error("a window not cut at its end")
	}
	rec := &kvtest.Memory{Recurrent: true}
	rec.Eval(0, 0, ramp(0, 10))
	if kv.Cut(rec, 0, 5, 0) || rec.NPos(0) != 10 {
		t.Error("a recurrent state cut before its end")
	}
	if kv.Cut(rec, 0, 0, 0) {
		t.Error("a cut to nothing counts as a cut")
	}
	if !kv.Cut(rec, 0, 10, 0) {
		t.Error("a recurrent state not kept whole")
	}
}

// TestParkedCells: cells parked for a save count as taken, and a slot that
// needs them gets them back through Reclaim instead of a refusal.
func TestParkedCells(t *testing.T) {
	c := cells(100, 2, true)
	c.Slots[0].Set(ramp(0, 30), nil, 0)
	c.Parked = 50
	reclaimed := 0
	c.Reclaim = func() { reclaimed++; c.Parked = 0 }
	if got := c.Free(); got != 20 {
		t.Fatalf("free with 50 parked: %d, want 20", got)
	}
	if err := c.Fits(1, 20); err != nil || reclaimed != 0 {
		t.Fatalf("20 of 20 free cells: %v, reclaimed %d times", err, reclaimed)
	}
	if err := c.Fits(1, 21); err != nil || reclaimed != 1 || c.Free() != 70 {
		t.Fatalf("21 cells with 20 free and 50 parked: %v, reclaimed %d times, %d free", err, reclaimed, c.Free())
	}
	if err := c.Fits(1, 71); !errors.Is(err, iface.ErrNoRoom) {
		t.Fatalf("71 cells with 70 free: %v, want ErrNoRoom", err)
	}

	c.Slots[1].Set(ramp(0, 20), nil, 0)
	c.Parked = 50 // 30 + 20 + 50: full
	if got := c.Room(1, false, 0); got != kv.RoomOK || reclaimed != 2 {
		t.Fatalf("a decode in a cache full of parked cells: %v, reclaimed %d times", got, reclaimed)
	}
	c.Reclaim = nil
	c.Parked = 50
	if got := c.Room(1, false, 0); got != kv.RoomCacheFull {
		t.Fatalf("parked cells with no Reclaim: %v, want RoomCacheFull", got)
	}
}
