//go:build llama && cgo

// Where a loaded model's layers are, read from llama_model (llama-model.h,
// an internal struct: the llama.cpp tree is pinned in mk/llama-pin.mk).

#include "combined.h"

#include <cstdio>
#include <string>

#include "ggml-backend.h"
#include "llama-model.h"

int hydra_model_layer_split(const struct llama_model * model, char * out, size_t out_len) {
    std::string s;
    const int n = llama_model_n_layer(model);
    for (int first = 0; first < n;) {
        ggml_backend_dev_t dev = model->dev_layer(first);
        int last = first;
        while (last + 1 < n && model->dev_layer(last + 1) == dev) {
            last++;
        }
        s += (s.empty() ? "" : ",") + std::to_string(first) + "-" + std::to_string(last) + ":" +
             (dev != nullptr ? ggml_backend_dev_name(dev) : "CPU");
        first = last + 1;
    }
    if (out != nullptr && out_len > 0) {
        snprintf(out, out_len, "%s", s.c_str());
    }
    return (int) model->split_mode();
}
