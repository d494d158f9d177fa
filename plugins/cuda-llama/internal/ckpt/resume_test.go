package ckpt_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv/kvtest"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched/schedtest"
)

// failing is a memory whose partial states do not load.
type failing struct{ *schedtest.Context }

func (failing) SetPartialState(int, []byte) error { return errors.New("refused") }

func seq(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(100 + i)
	}
	return out
}

// memoryWith is a memory whose sequence 0 holds toks, and checkpoints of it
// after each of at tokens in a store of one slot (nil: no store).
func memoryWith(t *testing.T, recurrent bool, toks []int32, at ...int) (*schedtest.Context, *ckpt.Store) {
	t.Helper()
	c := &schedtest.Context{Memory: kvtest.Memory{Recurrent: recurrent}, NVocab: 512}
	s := ckpt.NewStore(ckpt.Rules{Max: 8, NBatch: 64, NUBatch: 16}, 1, -1)
	for p := range toks {
		c.Eval(0, p, toks[p:p+1])
		if slices.Contains(at, p+1) {
			data, err := c.PartialStateInto(0, nil)
			if err != nil {
				t.Fatal(err)
			}
			pos := c.SeqPosMin(0)
			if !recurrent {
				pos = 0
			}
			if !s.Add(0, &ckpt.Checkpoint{PosMin: pos, PosMax: p, NTokens: p + 1, Data: data}) {
				t.Fatalf("checkpoint at %d not kept", p+1)
			}
		}
	}
	return c, s
}

func held(c *schedtest.Context) []int32 {
	toks, _ := c.Tokens(0)
	return toks
}

// TestResume: a prompt's resume on a slot's sequence — cut at the common
// prefix where the memory can be cut, never at the prompt's last token;
// else the newest checkpoint that serves it restored and the sequence cut
// at its end; else emptied, saying whether checkpoints had been there to
// serve it; a restore that fails empties the sequence and says so. The
// checkpoints past what is kept go.
func TestResume(t *testing.T) {
	old := seq(20)
	prompt := append(slices.Clone(old[:10]), 7, 7, 7)

	t.Run("cut at the prefix", func(t *testing.T) {
		c, s := memoryWith(t, false, old, 4, 16)
		r := s.Resume(c, 0, len(prompt), 10, 0)
		if r.Keep != 10 || r.Restored != nil || r.Failed != nil || !slices.Equal(held(c), old[:10]) {
			t.Fatalf("%+v, held %v", r, held(c))
		}
		if n, _ := s.Slot(0); n != 1 {
			t.Fatalf("%d checkpoints held, want the one before the cut", n)
		}
	})
	t.Run("the same prompt keeps all but its last token", func(t *testing.T) {
		c, s := memoryWith(t, false, old)
		if r := s.Resume(c, 0, len(old), len(old), 0); r.Keep != len(old)-1 || !slices.Equal(held(c), old[:19]) {
			t.Fatalf("%+v, held %v", r, held(c))
		}
	})
	t.Run("recurrent: the newest checkpoint that serves", func(t *testing.T) {
		c, s := memoryWith(t, true, old, 4, 8, 16)
		r := s.Resume(c, 0, len(prompt), 10, 0)
		if r.Keep != 8 || r.Restored == nil || r.Restored.NTokens != 8 || !slices.Equal(held(c), old[:8]) {
			t.Fatalf("%+v, held %v", r, held(c))
		}
		if n, _ := s.Slot(0); n != 2 {
			t.Fatalf("%d checkpoints held, want those at 4 and 8", n)
		}
		if st := s.Stats(); st.Restored != 1 || st.TokensSaved != 8 {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("recurrent: none serves", func(t *testing.T) {
		c, s := memoryWith(t, true, old, 16)
		r := s.Resume(c, 0, len(prompt), 10, 0)
		if r.Keep != 0 || !r.NoneServes || r.Restored != nil || len(held(c)) != 0 {
			t.Fatalf("%+v, held %v", r, held(c))
		}
		if n, _ := s.Slot(0); n != 0 {
			t.Fatalf("%d checkpoints held by an empty sequence", n)
		}
	})
	t.Run("recurrent: no common prefix", func(t *testing.T) {
		c, s := memoryWith(t, true, old, 4)
		if r := s.Resume(c, 0, 5, 0, 0); r.Keep != 0 || r.NoneServes || len(held(c)) != 0 {
			t.Fatalf("%+v, held %v", r, held(c))
		}
	})
	t.Run("recurrent: no store", func(t *testing.T) {
		c, _ := memoryWith(t, true, old)
		var s *ckpt.Store
		if r := s.Resume(c, 0, len(prompt), 10, 0); r.Keep != 0 || r.NoneServes || len(held(c)) != 0 {
			t.Fatalf("%+v, held %v", r, held(c))
		}
	})
	t.Run("recurrent: the restore fails", func(t *testing.T) {
		c, s := memoryWith(t, true, old, 8)
		r := s.Resume(failing{c}, 0, len(prompt), 10, 0)
		if r.Keep != 0 || r.Failed == nil || r.Err == nil || r.Restored != nil || len(held(c)) != 0 {
			t.Fatalf("%+v, held %v", r, held(c))
		}
		if n, _ := s.Slot(0); n != 0 || s.Stats().Restored != 0 {
			t.Fatalf("%d checkpoints held, stats %+v", n, s.Stats())
		}
	})
}
