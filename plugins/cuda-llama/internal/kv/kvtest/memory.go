// Package kvtest is a context's memory without a model, for tests of the
// rules that edit it (package kv) and of what drives them: each sequence's
// cells hold the token evaluated at each position, so a test reads back
// what a sequence would decode from.
package kvtest

import (
	"slices"
	"sort"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
)

// Memory is a fake kv.Memory. A recurrent one holds a state after its last
// position: it cannot be cut before its end, and its first position is its
// last. A sliding window of Window positions drops the cells before it as
// tokens are evaluated.
type Memory struct {
	Recurrent bool
	Window    int
	NoShift   bool // positions cannot move
	seqs      map[int][]cell
}

type cell struct {
	pos int
	tok int32
}

// Eval evaluates toks at positions pos0.. of sequence seq, as a decode does.
func (m *Memory) Eval(seq, pos0 int, toks []int32) {
	if m.seqs == nil {
		m.seqs = map[int][]cell{}
	}
	cs := m.seqs[seq]
	for i, t := range toks {
		cs = append(cs, cell{pos: pos0 + i, tok: t})
	}
	sort.SliceStable(cs, func(a, b int) bool { return cs[a].pos < cs[b].pos })
	if m.Window > 0 && len(cs) > 0 {
		last := cs[len(cs)-1].pos
		cs = slices.DeleteFunc(cs, func(c cell) bool { return c.pos <= last-m.Window })
	}
	m.seqs[seq] = cs
}

// Tokens is the sequence's tokens by position, and whether its positions
// run from its first without a gap or a repeat.
func (m *Memory) Tokens(seq int) ([]int32, bool) {
	cs := m.seqs[seq]
	out := make([]int32, 0, len(cs))
	ok := true
	for i, c := range cs {
		if i > 0 && c.pos != cs[i-1].pos+1 {
			ok = false
		}
		out = append(out, c.tok)
	}
	return out, ok
}

// NPos is the sequence's last position and one; 0 if empty.
func (m *Memory) NPos(seq int) int {
	cs := m.seqs[seq]
	if len(cs) == 0 {
		return 0
	}
	return cs[len(cs)-1].pos + 1
}

func (m *Memory) SeqRm(seq int) { delete(m.seqs, seq) }

func (m *Memory) SeqRmFrom(seq, p0 int) bool {
	if m.Recurrent && p0 > 0 && p0 < m.NPos(seq) {
		return false
	}
	m.SeqRmRange(seq, p0, m.NPos(seq))
	return true
}

func (m *Memory) SeqRmRange(seq, p0, p1 int) {
	m.seqs[seq] = slices.DeleteFunc(m.seqs[seq], func(c cell) bool { return c.pos >= p0 && c.pos < p1 })
}

func (m *Memory) SeqShift(seq, p0, p1, delta int) {
	if m.NoShift {
		panic("kvtest: a shift of a memory that cannot")
	}
	cs := m.seqs[seq]
	for i := range cs {
		if cs[i].pos >= p0 && cs[i].pos < p1 {
			cs[i].pos += delta
		}
	}
	sort.SliceStable(cs, func(a, b int) bool { return cs[a].pos < cs[b].pos })
}

func (m *Memory) SeqPosMin(seq int) int {
	cs := m.seqs[seq]
	switch {
	case len(cs) == 0:
		return -1
	case m.Recurrent:
		return cs[len(cs)-1].pos
	}
	return cs[0].pos
}

func (m *Memory) CanShift() bool { return !m.NoShift && !m.Recurrent }

var _ kv.Memory = (*Memory)(nil)
