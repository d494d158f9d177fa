// C interface of combined.cpp: what INFO reports of a model's placement
// across devices. Plain C, so cgo can call it.
#pragma once

#include <stddef.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// hydra_model_layer_split writes the devices of the model's layers as runs
// of layers per device ("0-23:CUDA0,24-47:CUDA1") and returns llama.cpp's
// split mode: 0 none, 1 layer, 2 row.
int hydra_model_layer_split(const struct llama_model * model, char * out, size_t out_len);

#ifdef __cplusplus
}
#endif
