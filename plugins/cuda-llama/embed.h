// C interface of embed.cpp: llama.cpp's common library's normalisation of
// embeddings, as llama-server applies it. Plain C, so cgo can call it.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// hydra_embd_normalize is common_embd_normalize: out = in / norm(in), the
// norm chosen by embd_norm (-1 none, 0 max absolute scaled to int16, 1
// taxicab, 2 euclidean, p > 2 p-norm).
void hydra_embd_normalize(const float * in, float * out, int n, int embd_norm);

#ifdef __cplusplus
}
#endif
