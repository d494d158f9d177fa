// Package schedtest is the scheduler's llama.cpp without a model, for the
// tests of package sched: a context whose logits for a row are a function
// of the tokens its sequence holds up to the row's position, a greedy
// sampler, a vocabulary, a drafter of chosen drafts and the adapter's
// slot and prompt work over the fake memory.
package schedtest

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv/kvtest"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
)

// Context is a fake sched.Context over kvtest.Memory. A row's logits are
// Logits of its sequence's tokens up to and with the row's, so a sequence
// decodes the same batched or alone, and a cell the scheduler failed to
// cut (a rejected draft token) changes every token sampled after it.
type Context struct {
	kvtest.Memory
	NVocab int
	// Fail, where set, is Decode's error for a batch, before it evaluates
	// any of it.
	Fail func(b *sched.Batch) error
	// Batches is the rows of each batch evaluated.
	Batches []int
	logits  map[int][]float32
}

// Decode evaluates the batch row by row; a row at a position other than
// the next of its sequence is refused, as llama.cpp refuses it.
func (c *Context) Decode(b *sched.Batch) error {
	if c.Fail != nil {
		if err := c.Fail(b); err != nil {
			return err
		}
	}
	next := map[int]int{}
	for i := range b.Len() {
		seq, pos := int(b.Seq[i]), int(b.Pos[i])
		if _, ok := next[seq]; !ok {
			next[seq] = c.NPos(seq)
		}
		if pos != next[seq] {
			return fmt.Errorf("schedtest: sequence %d: position %d where %d is next", seq, pos, next[seq])
		}
		next[seq]++
	}
	c.logits = map[int][]float32{}
	for i := range b.Len() {
		seq := int(b.Seq[i])
		c.Eval(seq, int(b.Pos[i]), []int32{b.Token[i]})
		if b.Logits[i] {
			toks, _ := c.Tokens(seq)
			c.logits[i] = Logits(toks, c.NVocab)
		}
	}
	c.Batches = append(c.Batches, b.Len())
	return nil
}

// Logits is the row's logits; nil where the last batch computed none.
func (c *Context) Logits(row int) []float32 { return c.logits[row] }

// PartialStateInto saves the sequence's tokens: a recurrent state is all
// of them.
func (c *Context) PartialStateInto(seq int, buf []byte) ([]byte, error) {
	toks, _ := c.Tokens(seq)
	buf = buf[:0]
	for _, t := range toks {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
	}
	return buf, nil
}

// SetPartialState brings the sequence back to the tokens saved.
func (c *Context) SetPartialState(seq int, data []byte) error {
	toks := make([]int32, len(data)/4)
	for i := range toks {
		toks[i] = int32(binary.LittleEndian.Uint32(data[4*i:]))
	}
	c.SeqRm(seq)
	c.Eval(seq, 0, toks)
	return nil
}

// StateSize is 4 bytes a position.
func (c *Context) StateSize(seq int) int64 { return 4 * int64(c.NPos(seq)) }

// Logits is the fake model's logits after history: every entry a function
// of the whole history, the greatest at Next(history).
func Logits(history []int32, nVocab int) []float32 {
	h := hash(history)
	out := make([]float32, nVocab)
	for k := range out {
		out[k] = float32((h>>7+uint64(k)*2654435761)%1000) / 1000
	}
	out[Next(history, nVocab)] = 2
	return out
}

// Next is the token the greedy sampler picks after history.
func Next(history []int32, nVocab int) int32 { return int32(hash(history) % uint64(nVocab)) }

func hash(toks []int32) uint64 {
	f := fnv.New64a()
	for _, t := range toks {
		f.Write(binary.LittleEndian.AppendUint32(nil, uint32(t)))
	}
	return f.Sum64()
}

var _ sched.Context = (*Context)(nil)
