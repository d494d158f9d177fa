//go:build llama && cgo

package llama

/*
#include "llama.h"

// The fields a prefill or decode batch sets; the rest of llama_batch stays as
// llama_batch_init left it.
static void hydra_batch_set(struct llama_batch * b, int i, llama_token tok, llama_pos pos, llama_seq_id seq, int logits) {
	b->token[i] = tok;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = (int8_t) logits;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Batch is the tokens one evaluation takes, as llama_batch holds them: row i
// is token Token[i] at position Pos[i] of sequence Seq[i], with its logits
// computed where Logits[i]. It has the shape of the scheduler's batch, so
// that the adapter converts one to the other without a copy.
type Batch struct {
	Token, Pos, Seq []int32
	Logits          []bool
}

// ErrKVFull is a decode's error where llama_decode found no free KV cells
// for the batch, because the caller may make room and try again.
var ErrKVFull = errors.New("llama_decode found no KV cells for the batch")

// Decode evaluates b (at most NBatch rows) through the context's batch.
func (c *Context) Decode(b *Batch) error {
	n := len(b.Token)
	copy(unsafe.Slice((*int32)(unsafe.Pointer(c.batch.token)), n), b.Token)
	copy(unsafe.Slice((*int32)(unsafe.Pointer(c.batch.pos)), n), b.Pos)
	nSeq, seqs, logits := unsafe.Slice(c.batch.n_seq_id, n), unsafe.Slice(c.batch.seq_id, n), unsafe.Slice(c.batch.logits, n)
	for i := range n {
		nSeq[i], *seqs[i], logits[i] = 1, C.llama_seq_id(b.Seq[i]), 0
		if b.Logits[i] {
			logits[i] = 1
		}
	}
	return c.decodeBatch(n)
}

// DecodeSeq evaluates tokens at positions pos.. in sequence seq (at most
// NBatch of them), computing logits for the last one when logits is set.
func (c *Context) DecodeSeq(seq int, tokens []int32, pos int, logits bool) error {
	n := len(tokens)
	for i, t := range tokens {
		last := 0
		if logits && i == n-1 {
			last = 1
		}
		C.hydra_batch_set(&c.batch, C.int(i), C.llama_token(t), C.llama_pos(pos+i), C.llama_seq_id(seq), C.int(last))
	}
	return c.decodeBatch(n)
}

// decodeBatch evaluates the first n rows of the context's batch.
func (c *Context) decodeBatch(n int) error {
	c.batch.n_tokens = C.int32_t(n)
	ClearError()
	switch r := C.llama_decode(c.p, c.batch); {
	case r == 0:
		return nil
	case r == 1:
		return ErrKVFull
	default:
		return fmt.Errorf("llama_decode failed (%d)%s", int(r), LastError())
	}
}

// Logits is the logits of the last batch's row i (computed for it; -1: the
// last row), in place in llama.cpp's memory until the next evaluation, so a
// sampler reads them without a copy; nil where it has none.
func (c *Context) Logits(i int) []float32 {
	p := C.llama_get_logits_ith(c.p, C.int32_t(i))
	if p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), c.nVocab)
}

// LogitsInto copies the logits of the last batch's row i (-1: the last row)
// into dst, which then outlive the next evaluation.
func (c *Context) LogitsInto(i int, dst []float32) { copy(dst, c.Logits(i)) }
