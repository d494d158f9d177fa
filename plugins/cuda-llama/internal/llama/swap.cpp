//go:build llama && cgo

// Re-pointing a loaded model's weights (swap.h). Each weight may have
// several copies: from the loaded file or a donor file (another
// quantisation of the same model), at home (where llama.cpp placed it) or
// on the peer device. A copy is a ggml tensor of our own, of the weight's
// shape and the source's type, in a buffer we allocate once and keep; using
// a copy means copying its type, strides, data, buffer and extra into the
// model's tensor, which every graph built afterwards reads. The model's
// structs are llama.cpp internals (llama-model.h, llama-context.h: the
// llama.cpp tree is pinned in mk/llama-pin.mk).

#include "swap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "llama-context.h"
#include "llama-memory.h"
#include "llama-model.h"

namespace {

void set_err(char * err, size_t err_len, const std::string & msg) {
    if (err != nullptr && err_len > 0) {
        snprintf(err, err_len, "%s", msg.c_str());
    }
}

// fields are what a copy of a weight sets in the model's tensor; the shape
// is the same in every copy.
struct fields {
    ggml_type type;
    size_t nb[GGML_MAX_DIMS];
    void * data;
    ggml_backend_buffer_t buffer;
    void * extra;
};

fields fields_of(const ggml_tensor * t) {
    fields f;
    f.type = t->type;
    memcpy(f.nb, t->nb, sizeof(f.nb));
    f.data = t->data;
    f.buffer = t->buffer;
    f.extra = t->extra;
    return f;
}

void use(ggml_tensor * t, const fields & f) {
    t->type = f.type;
    memcpy(t->nb, f.nb, sizeof(f.nb));
    t->data = f.data;
    t->buffer = f.buffer;
    t->extra = f.extra;
}

// source is a GGUF file the weights' bytes are read from, mapped for good:
// bytes bound in place stay there, uploads read the page cache.
struct source {
    std::string path;
    void * map = nullptr;
    size_t size = 0;
    ggml_backend_buffer_t mapped = nullptr;         // a host buffer over map, made on first use in place
    std::vector<size_t> offset;                     // per weight: where its bytes are in the file
    std::vector<ggml_type> type;                    // per weight
    std::vector<ggml_backend_buffer_type_t> buft;   // per weight: where llama.cpp keeps it at home
};

using copy_key = std::pair<int, int>; // (source, place)

ggml_backend_dev_t cpu_device() {
    return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
}

// device_of is the device a buffer type belongs to; ggml's CPU buffer types
// may have none.
ggml_backend_dev_t device_of(ggml_backend_buffer_type_t buft) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    return dev != nullptr ? dev : cpu_device();
}

const char * memory_of(ggml_backend_buffer_t buf) {
    if (buf == nullptr) {
        return "none";
    }
    if (ggml_backend_buffer_is_host(buf)) {
        return "CPU";
    }
    return ggml_backend_dev_name(device_of(ggml_backend_buffer_get_type(buf)));
}

} // namespace

struct hydra_swap {
    std::string arch;                   // the model's architecture
    std::vector<ggml_tensor *> weights; // the model's, in tensors_by_name order
    std::vector<std::string> names;
    std::vector<source> sources;        // 0: the loaded file
    std::vector<std::map<copy_key, fields>> copies;
    std::vector<int> src, place;        // the copy each weight uses now
    bool use_mmap = false;
    ggml_backend_dev_t peer = nullptr;
    std::vector<ggml_context *> ctxs;   // the copies' tensors
    std::vector<ggml_backend_buffer_t> bufs;
    int64_t allocated = 0, mapped = 0;
};

namespace {

// index_file maps path and finds each weight in it: present, of type
// types[i] and of the weight's size in that type.
bool index_file(const hydra_swap * s, source & src, const std::vector<ggml_type> & types, char * err, size_t err_len) {
    gguf_init_params params = {/* no_alloc */ true, /* ctx */ nullptr};
    gguf_context * g = gguf_init_from_file(src.path.c_str(), params);
    if (g == nullptr) {
        set_err(err, err_len, src.path + ": not a GGUF file llama.cpp can read");
        return false;
    }
    std::unique_ptr<gguf_context, void (*)(gguf_context *)> guard(g, gguf_free);
    const int64_t split = gguf_find_key(g, "split.count");
    if (split >= 0 && gguf_get_kv_type(g, split) == GGUF_TYPE_UINT16 && gguf_get_val_u16(g, split) > 1) {
        set_err(err, err_len, src.path + ": a model split over several files, which swaps do not read yet");
        return false;
    }
    const size_t data = gguf_get_data_offset(g);
    for (size_t i = 0; i < s->names.size(); i++) {
        const int64_t id = gguf_find_tensor(g, s->names[i].c_str());
        if (id < 0) {
            set_err(err, err_len, src.path + ": has no tensor " + s->names[i]);
            return false;
        }
        const int64_t * ne = s->weights[i]->ne;
        const size_t want = ggml_row_size(types[i], ne[0]) * ne[1] * ne[2] * ne[3];
        if (gguf_get_tensor_type(g, id) != types[i] || gguf_get_tensor_size(g, id) != want) {
            set_err(err, err_len, src.path + ": tensor " + s->names[i] + " is not the " + ggml_type_name(types[i]) +
                                      " tensor of " + std::to_string(want) + " bytes the model describes");
            return false;
        }
        src.offset.push_back(data + gguf_get_tensor_offset(g, id));
        src.type.push_back(types[i]);
    }
    const int fd = open(src.path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        set_err(err, err_len, src.path + ": " + strerror(errno));
        return false;
    }
    src.size = (size_t) st.st_size;
    src.map = mmap(nullptr, src.size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (src.map == MAP_FAILED) {
        src.map = nullptr;
        set_err(err, err_len, src.path + ": mmap: " + strerror(errno));
        return false;
    }
    return true;
}

// shape_text is a tensor's shape as llama.cpp prints it.
std::string shape_text(const ggml_tensor * t) {
    std::string s = "[";
    for (int d = 0; d < GGML_MAX_DIMS; d++) {
        s += (d ? ", " : "") + std::to_string(t->ne[d]);
    }
    return s + "]";
}

// in_place says whether a copy in buft is bound where its file is mapped
// instead of copied: as llama.cpp's loader does with use_mmap, for the
// default buffer type of a device that takes host pointers.
bool in_place(const hydra_swap * s, ggml_backend_buffer_type_t buft) {
    if (!s->use_mmap) {
        return false;
    }
    ggml_backend_dev_t dev = device_of(buft);
    ggml_backend_dev_props props;
    ggml_backend_dev_get_props(dev, &props);
    return props.caps.buffer_from_host_ptr && buft == ggml_backend_dev_buffer_type(dev);
}

// home_buft is where the weight's copy from source src lives at home.
ggml_backend_buffer_type_t home_buft(const hydra_swap * s, size_t i, int src) {
    if (src == 0) {
        return ggml_backend_buffer_get_type(s->copies[i].at({0, HYDRA_HOME}).buffer);
    }
    return s->sources[src].buft[i];
}

// target is the copy weight i is to use: on the peer, unless its home copy
// is already in the peer's buffer type (nothing to gain from a second one).
copy_key target(const hydra_swap * s, size_t i, int src, int place, int32_t * stayed) {
    copy_key k = {src < 0 ? s->src[i] : src, place < 0 ? s->place[i] : place};
    if (k.second == HYDRA_PEER) {
        ggml_backend_buffer_type_t home = home_buft(s, i, k.first);
        const bool mapped_home = k.first != 0 && in_place(s, home); // a donor's home copy bound in its mapping
        if (home == ggml_backend_dev_buffer_type(s->peer) && !mapped_home) {
            k.second = HYDRA_HOME;
            (*stayed)++;
        }
    }
    return k;
}

// pending is a copy to make.
struct pending {
    size_t i;
    copy_key key;
    ggml_tensor * t;
};

// new_tensors makes our tensors for the copies in group (one buffer type):
// the weights' shapes in their sources' types.
ggml_context * new_tensors(hydra_swap * s, std::vector<pending> & group) {
    ggml_init_params params = {/* mem_size */ group.size() * ggml_tensor_overhead(), /* mem_buffer */ nullptr, /* no_alloc */ true};
    ggml_context * ctx = ggml_init(params);
    if (ctx == nullptr) {
        return nullptr;
    }
    for (auto & p : group) {
        p.t = ggml_new_tensor(ctx, s->sources[p.key.first].type[p.i], GGML_MAX_DIMS, s->weights[p.i]->ne);
        ggml_set_name(p.t, s->names[p.i].c_str());
    }
    return ctx;
}

// mapped_buffer is the host buffer over source src's mapping, made once.
ggml_backend_buffer_t mapped_buffer(hydra_swap * s, int src) {
    source & so = s->sources[src];
    if (so.mapped == nullptr) {
        so.mapped = ggml_backend_dev_buffer_from_host_ptr(cpu_device(), so.map, so.size, so.size);
        if (so.mapped != nullptr) {
            ggml_backend_buffer_set_usage(so.mapped, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        }
    }
    return so.mapped;
}

// made is what make_copies allocated, to undo on failure.
struct made {
    std::vector<ggml_context *> ctxs;
    std::vector<ggml_backend_buffer_t> bufs;
    std::vector<pending> copies;
};

void undo(hydra_swap * s, made & m) {
    for (auto & p : m.copies) {
        s->copies[p.i].erase(p.key);
    }
    for (auto * b : m.bufs) {
        ggml_backend_buffer_free(b);
    }
    for (auto * c : m.ctxs) {
        ggml_free(c);
    }
}

// alloc_group makes group's tensors in one new buffer of buft, both kept in
// m so that undo frees them; nullptr when the buffer cannot be allocated.
ggml_backend_buffer_t alloc_group(hydra_swap * s, std::vector<pending> & group, ggml_backend_buffer_type_t buft, made & m) {
    ggml_context * ctx = new_tensors(s, group);
    ggml_backend_buffer_t buf = ctx != nullptr ? ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft) : nullptr;
    if (ctx != nullptr) {
        m.ctxs.push_back(ctx);
    }
    if (buf != nullptr) {
        m.bufs.push_back(buf);
    }
    return buf;
}

// make_copies makes the copies the targets lack: in one buffer per buffer
// type, allocated before a byte is copied, so that running out of memory
// changes nothing; bound in place where the file's mapping serves.
bool make_copies(hydra_swap * s, const std::vector<size_t> & hit, const std::vector<copy_key> & tgt,
                 hydra_swap_result * res, char * err, size_t err_len) {
    std::map<ggml_backend_buffer_type_t, std::vector<pending>> groups;
    std::vector<pending> mapped;
    for (size_t k = 0; k < hit.size(); k++) {
        const size_t i = hit[k];
        if (s->copies[i].count(tgt[k])) {
            continue;
        }
        ggml_backend_buffer_type_t buft = tgt[k].second == HYDRA_PEER ? ggml_backend_dev_buffer_type(s->peer) : home_buft(s, i, tgt[k].first);
        (in_place(s, buft) ? mapped : groups[buft]).push_back({i, tgt[k], nullptr});
    }
    made m;
    for (auto & [buft, group] : groups) {
        ggml_backend_buffer_t buf = alloc_group(s, group, buft, m);
        if (buf == nullptr) {
            undo(s, m);
            set_err(err, err_len, std::string("out of memory: cannot allocate the weights' ") + ggml_backend_buft_name(buft) + " copies");
            return false;
        }
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        res->allocated += ggml_backend_buffer_get_size(buf);
        m.copies.insert(m.copies.end(), group.begin(), group.end());
    }
    if (!mapped.empty()) {
        ggml_context * ctx = new_tensors(s, mapped);
        if (ctx == nullptr) {
            undo(s, m);
            set_err(err, err_len, "out of memory");
            return false;
        }
        m.ctxs.push_back(ctx);
        for (auto & p : mapped) {
            ggml_backend_buffer_t buf = mapped_buffer(s, p.key.first);
            if (buf == nullptr || ggml_backend_tensor_alloc(buf, p.t, (char *) s->sources[p.key.first].map + s->sources[p.key.first].offset[p.i]) != GGML_STATUS_SUCCESS) {
                undo(s, m);
                set_err(err, err_len, "cannot bind " + s->names[p.i] + " in place from " + s->sources[p.key.first].path);
                return false;
            }
            res->in_place += ggml_nbytes(p.t);
        }
        m.copies.insert(m.copies.end(), mapped.begin(), mapped.end());
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (auto & p : m.copies) {
        if (p.t->buffer != s->sources[p.key.first].mapped) {
            const source & so = s->sources[p.key.first];
            ggml_backend_tensor_set(p.t, (const char *) so.map + so.offset[p.i], 0, ggml_nbytes(p.t));
            res->uploaded += ggml_nbytes(p.t);
        }
        s->copies[p.i][p.key] = fields_of(p.t);
    }
    res->upload_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    s->ctxs.insert(s->ctxs.end(), m.ctxs.begin(), m.ctxs.end());
    s->bufs.insert(s->bufs.end(), m.bufs.begin(), m.bufs.end());
    s->allocated += res->allocated;
    s->mapped += res->in_place;
    return true;
}

// reset_graphs drops the graph llama.cpp would reuse and reserves the
// worst-case graph again, as llama.cpp does after a memory update: a reused
// graph keeps the old weights' splits and copies, and the scheduler's
// buffers must fit the new ones. It then splits a decode graph to report
// where the operations reading the matched weights run.
bool reset_graphs(hydra_swap * s, llama_context * ctx, const std::vector<size_t> & hit, hydra_swap_result * res,
                  char * err, size_t err_len) {
    const auto t0 = std::chrono::steady_clock::now();
    const llama_cparams & cp = ctx->get_cparams();
    const uint32_t n_seqs = cp.n_seq_max;
    const uint32_t n_tokens = std::min(cp.n_ctx, cp.n_ubatch);
    llama_memory_context_ptr mctx = ctx->get_memory()->init_full();
    if (!mctx || ctx->graph_reserve(n_tokens, n_seqs, std::min(n_tokens, cp.n_outputs_max), mctx.get()) == nullptr) {
        set_err(err, err_len, "llama.cpp could not reserve its compute buffers for the weights' new places");
        return false;
    }
    ggml_cgraph * gf = ctx->graph_reserve(n_seqs, n_seqs, n_seqs, mctx.get(), true);
    res->reset_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    res->ops = res->ops_local = 0;
    if (gf == nullptr) {
        return true;
    }
    std::unordered_set<const ggml_tensor *> moved;
    for (size_t i : hit) {
        moved.insert(s->weights[i]);
    }
    ggml_backend_sched_t sched = ctx->get_sched();
    for (int n = 0; n < ggml_graph_n_nodes(gf); n++) {
        ggml_tensor * node = ggml_graph_node(gf, n);
        for (int j = 0; j < GGML_MAX_SRC; j++) {
            if (node->src[j] == nullptr || !moved.count(node->src[j])) {
                continue;
            }
            res->ops++;
            ggml_backend_t be = ggml_backend_sched_get_tensor_backend(sched, node);
            if (be != nullptr && ggml_backend_get_device(be) == device_of(ggml_backend_buffer_get_type(node->src[j]->buffer))) {
                res->ops_local++;
            }
            break;
        }
    }
    return true;
}

} // namespace

struct hydra_swap * hydra_swap_new(struct llama_model * model, const char * path, bool use_mmap, char * err, size_t err_len) {
    auto s = std::make_unique<hydra_swap>();
    s->arch = model->arch_name();
    s->use_mmap = use_mmap;
    std::vector<ggml_type> types;
    for (auto & [name, t] : model->tensors_by_name) {
        s->weights.push_back(t);
        s->names.push_back(name);
        s->copies.push_back({{{0, HYDRA_HOME}, fields_of(t)}});
        types.push_back(t->type);
    }
    s->src.assign(s->weights.size(), 0);
    s->place.assign(s->weights.size(), HYDRA_HOME);
    source base;
    base.path = path;
    if (!index_file(s.get(), base, types, err, err_len)) {
        return nullptr;
    }
    for (auto * t : s->weights) {
        base.buft.push_back(ggml_backend_buffer_get_type(t->buffer));
    }
    s->sources.push_back(std::move(base));
    return s.release();
}

int hydra_swap_add_donor(struct hydra_swap * s, const struct llama_model * donor, const char * path, char * err, size_t err_len) {
    if (donor->arch_name() != s->arch) {
        set_err(err, err_len, std::string(path) + " is a " + donor->arch_name() + " model, the model a " + s->arch + " one");
        return -1;
    }
    const auto & dt = donor->tensors_by_name;
    if (dt.size() != s->weights.size()) {
        set_err(err, err_len, std::string(path) + " has " + std::to_string(dt.size()) + " weights, the model " +
                                  std::to_string(s->weights.size()));
        return -1;
    }
    source so;
    so.path = path;
    std::vector<ggml_type> types;
    // By name: llama.cpp lists a model's weights per buffer type, in an order
    // that depends on where the weights went (two loads on a GPU differ).
    std::unordered_map<std::string, const ggml_tensor *> by_name;
    for (const auto & [name, t] : dt) {
        by_name[name] = t;
    }
    for (size_t i = 0; i < s->weights.size(); i++) {
        const ggml_tensor * b = s->weights[i];
        auto it = by_name.find(s->names[i]);
        if (it == by_name.end()) {
            set_err(err, err_len, std::string(path) + " has no weight " + s->names[i]);
            return -1;
        }
        const ggml_tensor * d = it->second;
        if (!ggml_are_same_shape(b, d)) {
            set_err(err, err_len, std::string(path) + ": " + s->names[i] + " is " + shape_text(d) + ", the model's " + shape_text(b));
            return -1;
        }
        if (d->buffer == nullptr) {
            set_err(err, err_len, std::string(path) + ": llama.cpp placed no buffer for " + s->names[i]);
            return -1;
        }
        types.push_back(d->type);
        ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(d->buffer);
        // llama.cpp's loader keeps weights out of a device's pinned host
        // buffers when it maps the file; the donor was loaded without mmap.
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
        if (s->use_mmap && dev != nullptr && buft == ggml_backend_dev_host_buffer_type(dev)) {
            buft = ggml_backend_dev_buffer_type(cpu_device());
        }
        so.buft.push_back(buft);
    }
    if (!index_file(s, so, types, err, err_len)) {
        return -1;
    }
    s->sources.push_back(std::move(so));
    return (int) s->sources.size() - 1;
}

int hydra_swap_set_peer(struct hydra_swap * s, struct llama_context * ctx, const char * device, char * err, size_t err_len) {
    ggml_backend_sched_t sched = ctx->get_sched();
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(device);
    std::string known;
    for (int i = 0; i < ggml_backend_sched_get_n_backends(sched); i++) {
        ggml_backend_dev_t d = ggml_backend_get_device(ggml_backend_sched_get_backend(sched, i));
        if (d == dev && dev != nullptr) {
            s->peer = dev;
            return 0;
        }
        known += (known.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(d));
    }
    set_err(err, err_len, std::string("device \"") + device + "\" is not one the context runs on here; it runs on " + known);
    return -1;
}

// weight_list is idx as weight indices, or empty with the reason in err
// where it is empty or not ascending indices of weights.
static std::vector<size_t> weight_list(const struct hydra_swap * s, const int32_t * idx, int32_t n, char * err, size_t err_len) {
    std::vector<size_t> hit;
    for (int32_t k = 0; k < n; k++) {
        if (idx[k] < 0 || (size_t) idx[k] >= s->names.size() || (k > 0 && idx[k] <= idx[k - 1])) {
            set_err(err, err_len, "weight " + std::to_string(idx[k]) + " is not a weight of the model, or out of order");
            return {};
        }
        hit.push_back((size_t) idx[k]);
    }
    if (hit.empty()) {
        set_err(err, err_len, "no weights to swap");
    }
    return hit;
}

int hydra_swap_apply(struct hydra_swap * s, struct llama_context * ctx, const int32_t * idx, int32_t n, int src, int place,
                     struct hydra_swap_result * res, char * err, size_t err_len) {
    *res = {};
    if (src >= (int) s->sources.size() || (place == HYDRA_PEER && s->peer == nullptr)) {
        set_err(err, err_len, "no such source or no peer device");
        return -1;
    }
    const std::vector<size_t> hit = weight_list(s, idx, n, err, err_len);
    if (hit.empty()) {
        return -1;
    }
    std::vector<copy_key> tgt;
    for (size_t i : hit) {
        tgt.push_back(target(s, i, src, place, &res->stayed));
    }
    if (!make_copies(s, hit, tgt, res, err, err_len)) {
        return -1;
    }
    std::vector<fields> before;
    for (size_t k = 0; k < hit.size(); k++) {
        ggml_tensor * w = s->weights[hit[k]];
        before.push_back(fields_of(w));
        use(w, s->copies[hit[k]].at(tgt[k]));
    }
    if (!reset_graphs(s, ctx, hit, res, err, err_len)) {
        for (size_t k = 0; k < hit.size(); k++) {
            use(s->weights[hit[k]], before[k]);
        }
        hydra_swap_result ignored{};
        char msg[8];
        reset_graphs(s, ctx, hit, &ignored, msg, sizeof(msg));
        return -1;
    }
    for (size_t k = 0; k < hit.size(); k++) {
        s->src[hit[k]] = tgt[k].first;
        s->place[hit[k]] = tgt[k].second;
        res->bytes += ggml_nbytes(s->weights[hit[k]]);
    }
    res->swapped = (int32_t) hit.size();
    return 0;
}

size_t hydra_swap_count(const struct hydra_swap * s) {
    return s->weights.size();
}

void hydra_swap_weight(const struct hydra_swap * s, size_t i, const char ** name, int * src, int * place, const char ** device,
                       int64_t * bytes, int * loaded_buffer) {
    *name = s->names[i].c_str();
    *src = s->src[i];
    *place = s->place[i];
    *device = memory_of(s->weights[i]->buffer);
    *bytes = (int64_t) ggml_nbytes(s->weights[i]);
    *loaded_buffer = s->weights[i]->buffer == s->copies[i].at({0, HYDRA_HOME}).buffer;
}

void hydra_swap_layout(const struct hydra_swap * s, size_t i, const char ** type, int64_t ne[4], uintptr_t * data) {
    const ggml_tensor * t = s->weights[i];
    *type = ggml_type_name(t->type);
    for (int d = 0; d < 4; d++) {
        ne[d] = t->ne[d];
    }
    *data = (uintptr_t) t->data;
}

int64_t hydra_swap_offset(const struct hydra_swap * s, int src, size_t i) {
    return (int64_t) s->sources[src].offset[i];
}

int64_t hydra_swap_upload_us(struct hydra_swap * s, const int32_t * idx, int32_t n, int src) {
    char msg[8];
    std::map<ggml_backend_buffer_type_t, std::vector<pending>> groups;
    for (size_t i : weight_list(s, idx, n, msg, sizeof(msg))) {
        groups[home_buft(s, i, src)].push_back({i, {src, HYDRA_HOME}, nullptr});
    }
    if (groups.empty()) {
        return -1;
    }
    made m;
    for (auto & [buft, group] : groups) {
        if (alloc_group(s, group, buft, m) == nullptr) {
            undo(s, m);
            return -1;
        }
    }
    const source & so = s->sources[src];
    const auto t0 = std::chrono::steady_clock::now();
    for (auto & [buft, group] : groups) {
        for (auto & p : group) {
            ggml_backend_tensor_set(p.t, (const char *) so.map + so.offset[p.i], 0, ggml_nbytes(p.t));
        }
    }
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
    undo(s, m);
    return us;
}

void hydra_swap_resident(const struct hydra_swap * s, int64_t * allocated, int64_t * mapped) {
    *allocated = s->allocated;
    *mapped = s->mapped;
}
