// C interface of kernels.cpp: the choice of ggml's CPU kernels for a
// context. Plain C, so cgo can call it.
#pragma once

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// hydra_cpu_reference_kernels makes the context's CPU backends run ggml's
// reference kernels, whose results do not depend on how many tokens a
// batch holds; returns the CPU backends switched.
int hydra_cpu_reference_kernels(struct llama_context * ctx);

#ifdef __cplusplus
}
#endif
