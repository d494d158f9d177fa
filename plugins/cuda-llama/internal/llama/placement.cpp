//go:build llama && cgo

// Weight placement (placement.h): rules to llama.cpp's tensor buffer type
// overrides, and where a loaded model's weights ended up, read from
// llama_model's tensors_by_name (llama-model.h, an internal struct: the
// llama.cpp tree is pinned in mk/llama-pin.mk). Patterns are compiled with std::regex's
// defaults, as llama-model.cpp's load_tensors does, so what a pattern
// matches here is what it matches there.

#include "placement.h"

#include <cstdio>
#include <cstring>
#include <regex>
#include <string>
#include <strings.h>
#include <vector>

#include "ggml-backend.h"
#include "gguf.h"
#include "llama-model.h"

namespace {

void set_err(char * err, size_t err_len, const std::string & msg) {
    if (err != nullptr && err_len > 0) {
        snprintf(err, err_len, "%s", msg.c_str());
    }
}

// device_bufts are the default buffer types of ggml's devices, the names
// llama-server's --override-tensor accepts.
std::vector<ggml_backend_buffer_type_t> device_bufts() {
    std::vector<ggml_backend_buffer_type_t> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        if (auto * buft = ggml_backend_dev_buffer_type(ggml_backend_dev_get(i))) {
            out.push_back(buft);
        }
    }
    return out;
}

// find_buft is the buffer type named name: exactly, else ignoring case.
ggml_backend_buffer_type_t find_buft(const std::vector<ggml_backend_buffer_type_t> & bufts, const char * name) {
    for (auto * b : bufts) {
        if (strcmp(ggml_backend_buft_name(b), name) == 0) {
            return b;
        }
    }
    for (auto * b : bufts) {
        if (strcasecmp(ggml_backend_buft_name(b), name) == 0) {
            return b;
        }
    }
    return nullptr;
}

std::string known_names(const std::vector<ggml_backend_buffer_type_t> & bufts) {
    std::string s;
    for (auto * b : bufts) {
        s += (s.empty() ? "" : ", ") + std::string(ggml_backend_buft_name(b));
    }
    return s;
}

// memory_of names where a buffer's bytes are: host memory ("CPU", mapped
// or pinned alike) or the device the buffer type belongs to.
const char * memory_of(ggml_backend_buffer_t buf) {
    if (buf == nullptr) {
        return "none";
    }
    if (ggml_backend_buffer_is_host(buf)) {
        return "CPU";
    }
    auto * dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf));
    return dev != nullptr ? ggml_backend_dev_name(dev) : ggml_backend_buffer_name(buf);
}

} // namespace

int hydra_placement_resolve(const char * const * patterns, const char * const * devices, size_t n,
                            struct llama_model_tensor_buft_override * out, char * err, size_t err_len) {
    const auto bufts = device_bufts();
    for (size_t i = 0; i < n; i++) {
        try {
            std::regex check(patterns[i]);
        } catch (const std::regex_error & e) {
            set_err(err, err_len, std::string("pattern \"") + patterns[i] + "\" is not a regular expression llama.cpp can use (ECMAScript syntax): " + e.what());
            return -1;
        }
        auto * buft = find_buft(bufts, devices[i]);
        if (buft == nullptr) {
            set_err(err, err_len, std::string("device \"") + devices[i] + "\" is not one ggml has here; known: " + known_names(bufts) +
                " (CUDA devices need libggml-cuda.so beside the plugin and a GPU)");
            return -1;
        }
        out[i] = {patterns[i], buft};
    }
    out[n] = {nullptr, nullptr};
    return 0;
}

size_t hydra_model_tensor_count(const struct llama_model * model) {
    return model->tensors_by_name.size();
}

int hydra_model_tensor(const struct llama_model * model, size_t i,
                       const char ** name, const char ** buffer, const char ** memory) {
    if (i >= model->tensors_by_name.size()) {
        return -1;
    }
    const auto & [tname, t] = model->tensors_by_name[i];
    *name = tname.c_str();
    *buffer = t->buffer != nullptr ? ggml_backend_buffer_name(t->buffer) : "none";
    *memory = memory_of(t->buffer);
    return 0;
}

void hydra_placement_assign(const struct llama_model * model, const char * const * patterns, size_t n, int * rule) {
    std::vector<std::regex> res;
    for (size_t i = 0; i < n; i++) {
        res.emplace_back(patterns[i]);
    }
    for (size_t t = 0; t < model->tensors_by_name.size(); t++) {
        rule[t] = -1;
        for (size_t i = 0; i < n; i++) {
            if (std::regex_search(model->tensors_by_name[t].first, res[i])) {
                rule[t] = (int) i;
                break;
            }
        }
    }
}

int64_t hydra_gguf_block_count(const char * path) {
    gguf_init_params params = {/* no_alloc */ true, /* ctx */ nullptr};
    gguf_context * ctx = gguf_init_from_file(path, params);
    if (ctx == nullptr) {
        return -1;
    }
    int64_t n = -1;
    const int64_t arch = gguf_find_key(ctx, "general.architecture");
    if (arch >= 0 && gguf_get_kv_type(ctx, arch) == GGUF_TYPE_STRING) {
        const int64_t key = gguf_find_key(ctx, (std::string(gguf_get_val_str(ctx, arch)) + ".block_count").c_str());
        if (key >= 0 && gguf_get_kv_type(ctx, key) == GGUF_TYPE_UINT32) {
            n = gguf_get_val_u32(ctx, key);
        } else if (key >= 0 && gguf_get_kv_type(ctx, key) == GGUF_TYPE_INT32) {
            n = gguf_get_val_i32(ctx, key);
        }
    }
    gguf_free(ctx);
    return n;
}
