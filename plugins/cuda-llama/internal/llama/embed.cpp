//go:build llama && cgo

// The normalisation of pooled embeddings is llama.cpp's own
// (common/common.cpp), so that a vector here is the vector llama-server
// returns for the same pooled output.

#include "embed.h"

#include "common.h"
#include "llama-ext.h"

void hydra_embd_normalize(const float * in, float * out, int n, int embd_norm) {
    common_embd_normalize(in, out, n, embd_norm);
}

void hydra_context_memory(const struct llama_context * ctx, size_t * kv, size_t * compute) {
    *kv = 0;
    *compute = 0;
    for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx)) {
        (void) buft;
        *kv += mb.context;
        *compute += mb.compute;
    }
}
