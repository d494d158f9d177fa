// Package ckpttest plays prompts on one slot by the checkpoint rules alone,
// with no model: what the plugin's scheduler must do, for tests of the
// rules (package ckpt) and of the plugin against them.
package ckpttest

import (
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
)

// Sim plays prompts on one slot of a model whose memory cannot be cut (a
// recurrent state: its first position is its last token's), as the plugin
// does: Find, restore or cut or start over, then the prompt in chunks with
// checkpoints where the rules say; it returns the tokens evaluated.
type Sim struct {
	t     testing.TB
	Rules ckpt.Rules
	Store *ckpt.Store
	Seq   []int32 // what the memory holds
	task  uint64
	Taken []int // NTokens of each checkpoint taken
}

// NewSim is a slot with no sequence under rules r.
func NewSim(t testing.TB, r ckpt.Rules) *Sim {
	return &Sim{t: t, Rules: r, Store: ckpt.NewStore(r, 1, -1)}
}

// MemMin is the memory's first position; -1 when empty.
func (s *Sim) MemMin() int {
	if len(s.Seq) == 0 {
		return -1
	}
	if s.Rules.NSWA > 0 {
		return max(0, len(s.Seq)-s.Rules.NSWA)
	}
	return len(s.Seq) - 1
}

// Prompt evaluates toks (with user messages starting at spans) and then
// generates gen tokens; it returns the prompt tokens evaluated.
func (s *Sim) Prompt(toks []int32, spans ckpt.Spans, gen int) int {
	s.task++
	n := len(toks)
	prefix := CommonPrefix(s.Seq, toks)
	res := s.Store.Find(0, n, prefix, s.MemMin())
	keep := res.Keep
	if res.Restore != nil {
		s.Store.Restored(keep)
		if got, want := res.Restore.Data[0], byte(res.Restore.NTokens); got != want {
			s.t.Fatalf("restored the data of another checkpoint: %d, want %d", got, want)
		}
	}
	keep = min(keep, n-1)
	// Without a restore, the memory can be cut only where it is whole.
	if res.Restore == nil && keep < len(s.Seq) && !(s.Rules.NSWA > 0 && s.MemMin() <= max(0, keep-s.Rules.NSWA)) {
		keep = 0
	}
	s.Store.CutTo(0, keep, res.Restore)
	s.Seq = slices.Clone(toks[:keep])
	for next := keep; next < n; {
		end := s.Rules.ChunkEnd(n, next, s.Rules.NBatch, spans, s.Store.Newest(0))
		if end <= next || end > n {
			s.t.Fatalf("ChunkEnd(%d, %d) = %d", n, next, end)
		}
		if s.Rules.Take(n, next, end, s.MemMin(), spans, s.Store.Newest(0)) {
			mm := s.MemMin()
			s.Store.Add(0, &ckpt.Checkpoint{PosMin: mm, PosMax: next - 1, NTokens: next, Data: []byte{byte(next)}, Task: s.task})
			s.Taken = append(s.Taken, next)
		}
		s.Seq = append(s.Seq, toks[next:end]...)
		next = end
	}
	for g := range gen {
		s.Seq = append(s.Seq, int32(100000+g))
	}
	return n - keep
}

// CommonPrefix is the length of a's and b's common prefix.
func CommonPrefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
