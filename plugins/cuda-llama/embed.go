//go:build llama && cgo

package cudallama

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Embeddings run in a llama.cpp context of their own, made at load with
// embeddings on and the pooling chosen (llama.cpp fixes a context's pooling
// when it makes it), beside the slots' context and sharing its weights. Its
// KV cells are its own, so an embedding can neither overwrite nor wait for
// a slot's cells, nor take a slot from a completion; and the slots'
// context never switches its output between logits and embeddings. What
// they share is the device: a pass's llama_decode runs under the context
// lock between two of the scheduler's steps (a decode step waits for one
// embedding batch at most), which also keeps it apart from weight swaps.
// docs/design/batching.md has the measurements.

// embedder is the embedding context and how it takes inputs.
type embedder struct {
	mu        sync.Mutex // one pass at a time: passes share the context's cells and batch
	c         *lctx
	batch     sched.Batch // a pass's batch, every row an output (as llama.cpp requires of a context that outputs embeddings)
	layout    embedLayout
	pooling   int // the context's llama_pooling_type
	nOut      int // values of a pooled output: n_embd_out, or n_cls_out with rank pooling
	nEmbd     int // values of a token's embedding (pooling none): n_embd_out
	normalize int // the default normalisation (embd_normalize)
	nVocab    int
	// What the context took beside the weights at load, as llama.cpp
	// reports it: KV cells and compute buffers (bytes).
	kvBytes, computeBytes uint64
}

// modelPooling is the pooling the model's GGUF names ({arch}.pooling_type),
// which llama.cpp gives a context that asks for none; none where it names
// none.
func (m *model) modelPooling() int {
	v := m.metaString(m.metaString("general.architecture") + ".pooling_type")
	p, err := strconv.Atoi(v)
	if err != nil || llamaopt.PoolingName(p) == "" {
		return llamaopt.PoolingNone
	}
	return p
}

// newEmbedder makes the embedding context for slots of slotCtx cells with
// newCtx: pooled as opts.pooling says, else as the model says.
func newEmbedder(m *model, opts llamaopt.Options, slotCtx int, hasMemory bool, newCtx func(contextParams) (*lctx, error), log hclog.Logger) (*embedder, error) {
	// Unset, llama.cpp resolves the model's pooling itself (and says
	// nothing); the layout needs it before the context exists.
	asked, pooling := opts.Pooling, opts.Pooling
	if pooling == llamaopt.PoolingUnspecified {
		pooling = m.modelPooling()
	}
	l := newEmbedLayout(pooling, hasMemory, slotCtx, opts.NUBatch, opts.EmbdCtx)
	p := contextParams{nCtx: l.cells, nBatch: l.batch, nUBatch: l.batch, nSeqMax: l.seqs, nThreads: opts.NThreads,
		nThreadsBatch: opts.NThreadsBatch, flashAttn: opts.FlashAttn, typeK: opts.CacheTypeK, typeV: opts.CacheTypeV,
		RopeOptions: opts.RopeOptions, embedPooling: &asked}
	c, err := newCtx(p)
	if err != nil {
		return nil, fmt.Errorf("the embedding context: %w", err)
	}
	if got := c.PoolingType(); got != pooling {
		return nil, fmt.Errorf("the embedding context pools %s, the model and options say %s", llamaopt.PoolingName(got), llamaopt.PoolingName(pooling))
	}
	em := &embedder{c: c, layout: l, pooling: pooling, nEmbd: m.m.NEmbdOut(), normalize: opts.Normalize, nVocab: m.nVocab}
	em.nOut = em.nEmbd
	if pooling == llamaopt.PoolingRank {
		em.nOut = m.m.NClsOut()
	}
	kv, compute := c.binding().MemorySizes()
	em.kvBytes, em.computeBytes = kv, compute
	log.Info("embedding context made", "pooling", llamaopt.PoolingName(pooling), "cells", c.NCtx(), "batch", l.batch, "split", l.split,
		"sequences", l.seqs, "n_embd_out", em.nOut, "kv_bytes", kv, "compute_bytes", compute,
		"output_bytes", 4*l.batch*(m.nVocab+em.nEmbd)) // llama.cpp's output buffer once a batch is whole: every token's logits and embedding
	return em, nil
}

// Embed evaluates the inputs in the embedding context, in passes of as many
// as it holds, and returns their embeddings: pooled ones normalised as
// req.Normalize (else embd_normalize) says, with llama.cpp's
// common_embd_normalize; with pooling none every token's, as they are.
func (b *Backend) Embed(ctx context.Context, req iface.EmbedRequest) ([]iface.Embedding, error) {
	e, err := b.engine()
	if err != nil {
		return nil, err
	}
	em := e.embed
	if em == nil {
		return nil, fmt.Errorf("%w: the cuda-llama backend serves embeddings with the option %s=true", iface.ErrNotImplemented, llamaopt.OptEmbeddings)
	}
	lens := make([]int, len(req.Inputs))
	for i, in := range req.Inputs {
		if err := em.layout.check(i, len(in)); err != nil {
			return nil, err
		}
		for j, t := range in {
			if t < 0 || int(t) >= em.nVocab {
				return nil, fmt.Errorf("%w: input[%d]: token %d at position %d is outside the vocabulary [0, %d)", iface.ErrBadRequest, i, t, j, em.nVocab)
			}
		}
		lens[i] = len(in)
	}
	norm := em.normalize
	if req.Normalize != nil {
		norm = *req.Normalize
	}
	out := make([]iface.Embedding, len(req.Inputs))
	em.mu.Lock()
	defer em.mu.Unlock()
	for _, g := range em.layout.groups(lens) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := em.pass(&e.mu, req.Inputs[g[0]:g[1]], out[g[0]:g[1]], norm); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// pass evaluates inputs, sequence k being input k, in batches of at most
// layout.batch tokens taken in order, reads each input's embedding after
// the batch that holds its last token, and empties the cells. Each
// llama_decode runs under lock, the slots' context lock, and its results
// are read before the lock goes (llama.cpp's getters wait for the device).
func (em *embedder) pass(lock *sched.Lock, inputs [][]int32, out []iface.Embedding, norm int) error {
	c, b := em.c, &em.batch
	defer c.Clear()
	seq, pos := 0, 0
	for seq < len(inputs) {
		n := 0
		type ended struct{ seq, first, last int } // batch rows of an input ending in this batch
		var ends []ended
		first := 0
		b.Reset()
		for n < em.layout.batch && seq < len(inputs) {
			in := inputs[seq]
			b.Token, b.Pos, b.Seq, b.Logits = append(b.Token, in[pos]), append(b.Pos, int32(pos)), append(b.Seq, int32(seq)), append(b.Logits, true)
			if pos == 0 {
				first = n
			}
			n++
			if pos++; pos == len(in) {
				ends = append(ends, ended{seq, first, n})
				seq, pos, first = seq+1, 0, n
			}
		}
		lock.Lock()
		err := c.Decode(b)
		if err == nil {
			for _, x := range ends {
				if out[x.seq], err = em.read(x.seq, x.first, x.last, norm); err != nil {
					break
				}
				out[x.seq].NTokens = len(inputs[x.seq])
			}
		}
		lock.Unlock()
		if err != nil {
			return fmt.Errorf("evaluating the embeddings: %w", err)
		}
	}
	return nil
}

// read is the embedding of sequence seq, whose tokens are the batch's rows
// [first, last) with pooling none (an input that does not split is in one
// batch); pooled, the sequence's pooled output.
func (em *embedder) read(seq, first, last, norm int) (iface.Embedding, error) {
	c := em.c.binding()
	if em.pooling == llamaopt.PoolingNone {
		rows := make([][]float32, 0, last-first)
		for i := first; i < last; i++ {
			v := c.TokenEmbedding(i)
			if v == nil {
				return iface.Embedding{}, fmt.Errorf("llama.cpp has no embedding for batch row %d%s", i, lastLlamaError())
			}
			rows = append(rows, v)
		}
		return iface.Embedding{Vectors: rows}, nil
	}
	v := c.PooledEmbedding(seq, em.nOut, norm)
	if v == nil {
		return iface.Embedding{}, errors.New("llama.cpp has no pooled embedding for the sequence")
	}
	return iface.Embedding{Vectors: [][]float32{v}}, nil
}

// describeEmbeddings fills in the pooling and the capabilities of an
// engine with an embedding context: embed, and rerank where rank pooling
// was asked for (llama-server's /rerank wants --reranking, not a model
// that pools so by itself).
func (e *engine) describeEmbeddings(opts llamaopt.Options, log hclog.Logger) {
	if e.embed == nil {
		if opts.Pooling != llamaopt.PoolingUnspecified {
			log.Warn("pooling has no effect without embeddings=true", "pooling", llamaopt.PoolingName(opts.Pooling))
		}
		return
	}
	e.info.Pooling = llamaopt.PoolingName(e.embed.pooling)
	e.info.Capabilities = append(e.info.Capabilities, iface.CapEmbed)
	if opts.Pooling == llamaopt.PoolingRank {
		e.info.Capabilities = append(e.info.Capabilities, iface.CapRerank)
	}
}
