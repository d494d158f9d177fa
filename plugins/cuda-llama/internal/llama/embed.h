// C interface of embed.cpp: llama.cpp's common library's normalisation of
// embeddings, as llama-server applies it. Plain C, so cgo can call it.
#pragma once

#include <stddef.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// hydra_embd_normalize is common_embd_normalize: out = in / norm(in), the
// norm chosen by embd_norm (-1 none, 0 max absolute scaled to int16, 1
// taxicab, 2 euclidean, p > 2 p-norm).
void hydra_embd_normalize(const float * in, float * out, int n, int embd_norm);

// hydra_context_memory is what a context allocated beside the model's
// weights, over every device: its KV cells (*kv) and its compute buffers
// (*compute), in bytes, as llama.cpp's memory breakdown reports them.
void hydra_context_memory(const struct llama_context * ctx, size_t * kv, size_t * compute);

#ifdef __cplusplus
}
#endif
