package cudallama

import (
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// embedLayout is how the embedding context takes inputs.
type embedLayout struct {
	// split: an input may span several batches, as only last pooling over
	// a KV cache allows (the pooled token is the last, and attends to the
	// cells of the batches before); otherwise every input is in one
	// physical batch, which mean, cls and rank pool over.
	split bool
	cells int // the context's KV cells: what a batch of inputs holds together
	batch int // tokens per llama_decode, one physical batch
	seqs  int // inputs evaluated together at most
}

// embedSeqs is how many inputs one pass evaluates together: as many
// sequences as the context keeps apart.
const embedSeqs = 32

// newEmbedLayout sizes the embedding context for pooling p (the context's,
// resolved), a model with a KV cache or not, slots of slotCtx cells and a
// physical batch of nUBatch tokens.
func newEmbedLayout(p int, hasMemory bool, slotCtx, nUBatch, embdCtx int) embedLayout {
	l := embedLayout{split: p == llamaopt.PoolingLast && hasMemory, batch: min(nUBatch, slotCtx), seqs: embedSeqs}
	l.cells = l.batch
	if l.split {
		l.cells = slotCtx
		if embdCtx > 0 {
			l.cells = min(embdCtx, slotCtx)
		}
		l.batch = min(l.batch, l.cells)
	}
	return l
}

// check says why input i (of n tokens) cannot be evaluated, in
// llama-server's terms: pooled over one physical batch it must fit one; a
// split input must leave a cell, as a slot's prompt must.
func (l embedLayout) check(i, n int) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: input[%d] is empty", iface.ErrBadRequest, i)
	case !l.split && n > l.batch:
		return fmt.Errorf("%w: input[%d] has %d tokens, more than the physical batch of %d it must fit (n_ubatch)", iface.ErrBadRequest, i, n, l.batch)
	case l.split && n >= l.cells:
		return fmt.Errorf("%w: input[%d] has %d tokens: the embedding context holds %d (embd_ctx)", iface.ErrBadRequest, i, n, l.cells)
	}
	return nil
}

// groups cuts the inputs (their lengths) into passes: consecutive inputs,
// at most seqs of them, holding at most cells tokens together; each pass is
// evaluated, read and cleared before the next. A pass of inputs that may
// not split is one llama_decode (cells is a physical batch).
func (l embedLayout) groups(lens []int) [][2]int {
	var out [][2]int
	start, tokens := 0, 0
	for i, n := range lens {
		if i > start && (i-start == l.seqs || tokens+n > l.cells) {
			out = append(out, [2]int{start, i})
			start, tokens = i, 0
		}
		tokens += n
	}
	if len(lens) > start {
		out = append(out, [2]int{start, len(lens)})
	}
	return out
}
