// C interface of placement.cpp: llama.cpp's tensor buffer type overrides
// built from (pattern, device) rules, the placement of a loaded model's
// weights, and a GGUF file's layer count. Plain C, so cgo can call it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// hydra_placement_resolve fills out[0..n) with the overrides for n rules
// (patterns[i] kept in devices[i]'s memory) and out[n] with the list's
// {NULL, NULL} end. A device is the name of a ggml device's buffer type
// (CPU, CUDA0, …; an exact match first, else one ignoring case). The
// patterns are used as given, so they must outlive the model's load. Returns
// 0, or -1 with a message in err for a pattern std::regex (llama.cpp's
// matcher) cannot compile or a device ggml does not have.
int hydra_placement_resolve(const char * const * patterns, const char * const * devices, size_t n,
                            struct llama_model_tensor_buft_override * out, char * err, size_t err_len);

// hydra_model_tensor_count is the number of the model's weights.
size_t hydra_model_tensor_count(const struct llama_model * model);

// hydra_model_tensor gives weight i's name, the name of the buffer holding
// it, and its memory: "CPU" for host memory, else its device's name. The
// strings live as long as the model. Returns -1 if i is out of range.
int hydra_model_tensor(const struct llama_model * model, size_t i,
                       const char ** name, const char ** buffer, const char ** memory);

// hydra_placement_assign writes for each weight (in hydra_model_tensor
// order) the index of the first pattern matching its name as llama.cpp
// matches them (std::regex_search, the first match deciding), or -1.
// rule has hydra_model_tensor_count entries; the patterns compile.
void hydra_placement_assign(const struct llama_model * model, const char * const * patterns, size_t n, int * rule);

// hydra_gguf_block_count reads block_count from a GGUF file's metadata
// (general.architecture's), or returns -1 if it has none.
int64_t hydra_gguf_block_count(const char * path);

#ifdef __cplusplus
}
#endif
