package cudallama

import (
	"fmt"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Options of the embeddings (Embed; llama-server's --embeddings,
// --reranking, --pooling, --embd-normalize).
const (
	// OptEmbeddings: true serves Embed, in a llama.cpp context of its own
	// beside the slots' (embed.go), so that embeddings never take or touch a
	// slot's KV cells.
	OptEmbeddings = "embeddings"
	// OptPooling is how a sequence's embeddings are pooled: none, mean, cls,
	// last or rank (a classifier head's scores, for /rerank); unset, as the
	// model's GGUF says (none where it says nothing).
	OptPooling = "pooling"
	// OptEmbdNormalize is the normalisation of pooled embeddings when a
	// request names none: -1 none, 0 max absolute (int16), 1 taxicab, 2
	// euclidean (the default), p > 2 p-norm, as llama-server's.
	OptEmbdNormalize = "embd_normalize"
	// OptEmbdCtx is the KV cells of the embedding context where inputs may
	// span several batches (last pooling): the longest input, all inputs
	// of a batch of them together; default: a slot's cells, llama-server's
	// limit. Other poolings take an input in one physical batch (n_ubatch),
	// as llama-server does, and the context holds n_ubatch cells.
	OptEmbdCtx = "embd_ctx"
)

// embedOptions are the parsed embedding options; the zero value serves
// none.
type embedOptions struct {
	embeddings bool
	pooling    int // llama_pooling_type; poolingUnspecified: the model's
	normalize  int
	embdCtx    int // 0: a slot's cells
}

// llama_pooling_type's values.
const (
	poolingUnspecified = -1
	poolingNone        = 0
	poolingMean        = 1
	poolingCLS         = 2
	poolingLast        = 3
	poolingRank        = 4
)

var poolingNames = map[int]string{poolingNone: iface.PoolingNone, poolingMean: iface.PoolingMean, poolingCLS: iface.PoolingCLS,
	poolingLast: iface.PoolingLast, poolingRank: iface.PoolingRank}

// poolingName is BackendInfo.Pooling of llama_pooling_type p.
func poolingName(p int) string { return poolingNames[p] }

func defaultEmbedOptions() embedOptions {
	return embedOptions{pooling: poolingUnspecified, normalize: 2}
}

// embedParsers are the options of this file, merged into optionParsers.
var embedParsers = map[string]optionParser{
	OptEmbeddings: boolField(func(o *options) *bool { return &o.embeddings }),
	OptPooling: func(o *options, key, v string) error {
		for p, name := range poolingNames {
			if strings.EqualFold(v, name) {
				o.pooling = p
				return nil
			}
		}
		return fmt.Errorf("%w: option %s=%q: want none, mean, cls, last or rank", iface.ErrBadRequest, key, v)
	},
	OptEmbdNormalize: intField(func(o *options) *int { return &o.normalize }, -1, 1<<16),
	OptEmbdCtx:       intField(func(o *options) *int { return &o.embdCtx }, 1, maxNCtx),
}

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
	l := embedLayout{split: p == poolingLast && hasMemory, batch: min(nUBatch, slotCtx), seqs: embedSeqs}
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
