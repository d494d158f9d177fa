package ckpt

import "github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"

// Memory is a context's memory as a prompt's resume uses it: cut by
// position, and a sequence's partial state (a checkpoint's bytes) loaded.
type Memory interface {
	kv.Memory
	SetPartialState(seq int, data []byte) error
}

// Resumed is what Store.Resume did to a slot's sequence.
type Resumed struct {
	// Keep is the positions the sequence keeps: the prompt is evaluated
	// from there (0: the sequence was emptied).
	Keep int
	// Restored is the checkpoint the sequence resumes from; nil for none.
	Restored *Checkpoint
	// Failed is the checkpoint whose restore failed (Err: llama.cpp's
	// error, nil where the restored memory could not be cut at its end):
	// the sequence was emptied.
	Failed *Checkpoint
	Err    error
	// NoneServes: checkpoints are kept, the prompt shares a prefix with
	// the sequence, and none of them serves it: evaluated from the start.
	NoneServes bool
}

// Resume readies sequence i of m, whose sliding window is window (0 for
// none), for a prompt of n tokens that shares prefix tokens with it: cut at
// the prefix where the memory allows (never past the prompt's next-to-last
// token, whose successor's logits are the reply's), else restored from the
// newest checkpoint that serves the prompt (Rules.Find) and cut at its end,
// else emptied. The slot's checkpoints past the point kept are dropped. A
// nil Store keeps none.
func (s *Store) Resume(m Memory, i, n, prefix, window int) Resumed {
	keep := min(prefix, n-1)
	if kv.Cut(m, i, keep, window) {
		s.CutTo(i, keep, nil)
		return Resumed{Keep: keep} // a refused cut leaves the memory as it was
	}
	if !s.Enabled() {
		s.empty(m, i, window)
		return Resumed{}
	}
	res := s.Find(i, n, prefix, m.SeqPosMin(i))
	c := res.Restore
	if c == nil {
		s.empty(m, i, window)
		return Resumed{NoneServes: prefix > 0}
	}
	err := m.SetPartialState(i, c.Data)
	if err == nil && res.Keep < n && m.SeqRmFrom(i, res.Keep) {
		s.CutTo(i, res.Keep, c)
		s.Restored(res.Keep)
		return Resumed{Keep: res.Keep, Restored: c}
	}
	s.empty(m, i, window)
	return Resumed{Failed: c, Err: err}
}

// empty empties sequence i, by a cut at 0 where the memory takes one, and
// drops the checkpoints that restore onto its cells.
func (s *Store) empty(m Memory, i, window int) {
	if kv.Cut(m, i, 0, window) {
		s.CutTo(i, 0, nil)
		return
	}
	m.SeqRm(i)
	s.Clear(i)
}
