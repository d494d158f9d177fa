//go:build llama && cgo

package llama

/*
#include "llama.h"
#include "kernels.h"
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
)

// Context is a llama_context with its batch and its state streaming: the
// adapter's decoding context, an embedding context, or a draft's (wrapContext).
// Contexts are never freed, because freeing one on CUDA is not safe (see the
// adapter's engine). Its methods are not safe for concurrent use: the
// caller's context lock orders them.
type Context struct {
	p     *C.struct_llama_context
	mem   C.llama_memory_t
	batch C.struct_llama_batch // nBatch rows; none in a context wrapContext wraps
	io    *C.struct_hydra_io   // state streaming; nil in a context wrapContext wraps
	// nBatch is the most tokens one evaluation takes, nVocab a row's
	// logits, nStream the KV cache's streams: 1 (unified), or one per
	// sequence.
	nBatch, nVocab, nStream int
}

// ContextParams are a context's parameters.
type ContextParams struct {
	NCtx, NBatch, NUBatch int
	NSeqMax               int
	// NRsSeq keeps that many recurrent-state snapshots a sequence, so that a
	// recurrent or hybrid memory can be cut back by up to NRsSeq tokens once
	// after each decode (llama.cpp's n_rs_seq; 0: not at all).
	NRsSeq int
	// PerSeqKV gives every sequence a KV stream of its own, n_ctx split
	// among them; states are one stream on the wire either way (shim.cpp).
	PerSeqKV                bool
	NThreads, NThreadsBatch int
	FlashAttn               int    // a llama_flash_attn_type
	TypeK, TypeV            string // f16 (anything else), f32, bf16, q8_0, q4_0
	SWAFull                 bool
	RopeScaling             int     // a llama_rope_scaling_type; -1: the model's
	RopeFreqScale           float32 // 0: the model's
	YarnOrigCtx             int     // 0: the model's training context
	// Embeddings makes an embedding context, pooled as Pooling says (a
	// llama_pooling_type; -1: the model's).
	Embeddings bool
	Pooling    int
	// GPU is the first GPU in use, nil on the CPU: its pinned host buffers
	// stage state streams, and KV tensors in its memory are read with async
	// copies.
	GPU *Device
}

func ggmlType(t string) C.enum_ggml_type {
	switch t {
	case "f32":
		return C.GGML_TYPE_F32
	case "bf16":
		return C.GGML_TYPE_BF16
	case "q8_0":
		return C.GGML_TYPE_Q8_0
	case "q4_0":
		return C.GGML_TYPE_Q4_0
	}
	return C.GGML_TYPE_F16
}

// NewContext creates a context on m, its batch and state streaming with it;
// the error says why llama.cpp refused (LastError), because only its log
// does.
func NewContext(m Model, p ContextParams) (*Context, error) {
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(p.NCtx)
	cp.n_batch = C.uint32_t(min(p.NBatch, p.NCtx))
	cp.n_ubatch = C.uint32_t(min(p.NUBatch, p.NBatch, p.NCtx))
	cp.n_seq_max = C.uint32_t(p.NSeqMax)
	cp.n_rs_seq = C.uint32_t(p.NRsSeq)
	cp.n_threads = C.int32_t(p.NThreads)
	cp.n_threads_batch = C.int32_t(p.NThreadsBatch)
	cp.flash_attn_type = C.enum_llama_flash_attn_type(p.FlashAttn)
	cp.type_k = ggmlType(p.TypeK)
	cp.type_v = ggmlType(p.TypeV)
	cp.rope_scaling_type = C.enum_llama_rope_scaling_type(p.RopeScaling) // -1: the model's
	if p.RopeFreqScale > 0 {
		cp.rope_freq_scale = C.float(p.RopeFreqScale) // 0 (the default): the model's
	}
	cp.yarn_orig_ctx = C.uint32_t(p.YarnOrigCtx) // 0: the model's training context
	cp.kv_unified = C.bool(!p.PerSeqKV)          // states are one stream on the wire either way (shim.cpp)
	cp.swa_full = C.bool(p.SWAFull)
	cp.offload_kqv = true
	cp.no_perf = true
	if p.Embeddings {
		cp.embeddings = true
		cp.pooling_type = C.enum_llama_pooling_type(p.Pooling)
	}
	// The streaming state (never freed, as the context is not) comes after
	// the context, which is freed again if it cannot be had: nothing leaks
	// from a failed load.
	ClearError()
	c := C.llama_init_from_model(m.p, cp)
	if c == nil {
		return nil, fmt.Errorf("llama.cpp could not create a context%s", LastError())
	}
	io := C.hydra_io_new(p.GPU.dev())
	if io == nil {
		C.llama_free(c)
		return nil, errors.New("out of memory")
	}
	ctx := &Context{p: c, mem: C.llama_get_memory(c), nBatch: int(cp.n_batch), nVocab: m.Vocab().NTokens(), io: io, nStream: 1}
	if p.PerSeqKV {
		ctx.nStream = int(C.llama_n_seq_max(c))
	}
	ctx.batch = C.llama_batch_init(C.int32_t(ctx.nBatch), 0, 1)
	return ctx, nil
}

// wrapContext wraps a *llama_context made elsewhere (the draft context
// spec.cpp makes) for its memory's operations and partial state: it has no
// batch of its own and no state streaming.
func wrapContext(c *C.struct_llama_context) *Context {
	vocab := C.llama_model_get_vocab(C.llama_get_model(c))
	return &Context{p: c, mem: C.llama_get_memory(c), nBatch: int(C.llama_n_batch(c)), nVocab: int(C.llama_vocab_n_tokens(vocab)), nStream: 1}
}

// NCtx is the context's cells.
func (c *Context) NCtx() int { return int(C.llama_n_ctx(c.p)) }

// NRsSeq is the recurrent-state snapshots a sequence keeps (ContextParams).
func (c *Context) NRsSeq() int { return int(C.llama_n_rs_seq(c.p)) }

// NCtxSeq is the cells one sequence may hold: n_ctx, or its stream's.
func (c *Context) NCtxSeq() int { return int(C.llama_n_ctx_seq(c.p)) }

// NBatch is the most tokens one evaluation takes (n_batch, at most n_ctx).
func (c *Context) NBatch() int { return c.nBatch }

// NUBatch is the context's physical batch.
func (c *Context) NUBatch() int { return int(C.llama_n_ubatch(c.p)) }

// NVocab is the floats of a row's logits.
func (c *Context) NVocab() int { return c.nVocab }

// NStream is the KV cache's streams: 1 (unified), or one per sequence.
func (c *Context) NStream() int { return c.nStream }

// HasMemory reports whether the context has a memory module (a KV cache or
// a recurrent state); an embedding model's may have none.
func (c *Context) HasMemory() bool { return c.mem != nil }

// PoolingType is the pooling an embedding context applies (a
// llama_pooling_type), as llama.cpp resolved it.
func (c *Context) PoolingType() int { return int(C.llama_pooling_type(c.p)) }

// UseReferenceKernels makes the context's CPU work run ggml's reference
// kernels, for tests whose oracle is bit-for-bit equality of results computed
// in batches of different sizes, which ggml's optimized CPU kernels do not
// give (kernels.cpp); it returns the CPU backends switched.
func (c *Context) UseReferenceKernels() int { return int(C.hydra_cpu_reference_kernels(c.p)) }
