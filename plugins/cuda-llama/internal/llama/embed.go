//go:build llama && cgo

package llama

/*
#include "llama.h"
#include "embed.h"
*/
import "C"

import "unsafe"

// TokenEmbedding is a copy of the embedding of the last batch's row i (the
// model's n_embd_out values), nil where llama.cpp has none; read it before
// the next evaluation.
func (c *Context) TokenEmbedding(i int) []float32 {
	p := C.llama_get_embeddings_ith(c.p, C.int32_t(i))
	if p == nil {
		return nil
	}
	n := int(C.llama_model_n_embd_out(C.llama_get_model(c.p)))
	return append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(p)), n)...)
}

// PooledEmbedding is sequence seq's pooled output, its first n values
// normalised as llama.cpp's common_embd_normalize does with norm (-1 none,
// 0 max absolute scaled to int16, 1 taxicab, 2 euclidean, p > 2 p-norm), so
// that it is the vector llama-server returns; nil where llama.cpp has none.
func (c *Context) PooledEmbedding(seq, n, norm int) []float32 {
	p := C.llama_get_embeddings_seq(c.p, C.llama_seq_id(seq))
	if p == nil {
		return nil
	}
	v := make([]float32, n)
	if n > 0 {
		C.hydra_embd_normalize(p, (*C.float)(unsafe.Pointer(&v[0])), C.int(n), C.int(norm))
	}
	return v
}

// MemorySizes is what the context allocated beside the model's weights,
// over every device, as llama.cpp's memory breakdown reports it: its KV
// cells and its compute buffers, in bytes.
func (c *Context) MemorySizes() (kv, compute uint64) {
	var k, b C.size_t
	C.hydra_context_memory(c.p, &k, &b)
	return uint64(k), uint64(b)
}
