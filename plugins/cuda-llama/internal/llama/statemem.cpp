//go:build llama && cgo

// The parts of a sequence's state, measured through llama.cpp's memory
// modules (llama-memory-*.h, llama-kv-cache*.h): each part's serialisation
// is written to a counting writer, which keeps no byte. These internal
// classes change between llama.cpp versions; the tree is pinned
// (mk/llama-pin.mk) and the state tests catch a drift.

#include "statemem.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "llama-io.h"
#include "llama-kv-cache-iswa.h"
#include "llama-kv-cache.h"
#include "llama-memory-hybrid-idx.h"
#include "llama-memory-hybrid-iswa.h"
#include "llama-memory-hybrid.h"
#include "llama-memory-recurrent.h"
#include "llama-memory.h"

namespace {

// counter counts a serialisation's bytes and its largest tensor piece, and
// keeps the bytes written as fields (everything but the tensors' rows).
class counter : public llama_io_write_i {
public:
    void write(const void * p, size_t n) override {
        bytes += n;
        fields.insert(fields.end(), (const uint8_t *) p, (const uint8_t *) p + n);
    }
    void write_tensor(ggml_tensor *, size_t, size_t n) override {
        bytes += n;
        max_row = std::max(max_row, n);
    }
    size_t n_bytes() override { return bytes; }

    size_t bytes = 0, max_row = 0;
    std::vector<uint8_t> fields;
};

// row_fields is the fields among a part's rows: what follows its cells'
// metadata (head bytes of counts before them), or nothing with no cells.
std::vector<uint8_t> row_fields(const std::vector<uint8_t> & w, size_t count_at, size_t cell_meta) {
    if (w.size() < count_at + 4) {
        return {};
    }
    uint32_t cells;
    memcpy(&cells, w.data() + count_at, 4);
    const size_t head = count_at + 4 + (size_t) cells * cell_meta;
    if (cells == 0 || w.size() < head) {
        return {};
    }
    return std::vector<uint8_t>(w.begin() + (ptrdiff_t) head, w.end());
}

// leaf is one cache of a memory module, in serialisation order.
struct leaf {
    llama_kv_cache * kv = nullptr;
    llama_memory_recurrent * rec = nullptr;
    bool swa = false;
};

// leaves splits mem into the caches whose states it writes one after
// another; false for a module the plugin does not know.
bool leaves(llama_memory_i * mem, std::vector<leaf> & out, const char ** name) {
    if (dynamic_cast<llama_memory_hybrid_idx *>(mem) != nullptr) {
        *name = "hybrid_idx"; // writes an index cache of its own between the parts
        return false;
    }
    if (auto * h = dynamic_cast<llama_memory_hybrid_iswa *>(mem)) {
        *name = "hybrid_iswa";
        out.push_back({h->get_mem_attn()->get_base(), nullptr, false});
        out.push_back({h->get_mem_attn()->get_swa(), nullptr, true});
        out.push_back({nullptr, h->get_mem_recr(), false});
        return true;
    }
    if (auto * h = dynamic_cast<llama_memory_hybrid *>(mem)) {
        *name = "hybrid";
        out.push_back({h->get_mem_attn(), nullptr, false});
        out.push_back({nullptr, h->get_mem_recr(), false});
        return true;
    }
    if (auto * s = dynamic_cast<llama_kv_cache_iswa *>(mem)) {
        *name = "iswa";
        out.push_back({s->get_base(), nullptr, false});
        out.push_back({s->get_swa(), nullptr, true});
        return true;
    }
    if (auto * r = dynamic_cast<llama_memory_recurrent *>(mem)) {
        *name = "recurrent";
        out.push_back({nullptr, r, false});
        return true;
    }
    if (auto * kv = dynamic_cast<llama_kv_cache *>(mem)) {
        *name = "kv";
        out.push_back({kv, nullptr, false});
        return true;
    }
    *name = "unknown";
    return false;
}

// one_stream is the bytes of the one-stream state a cache of n_stream
// streams writes as bytes: the other streams' empty counts (4 bytes each) are
// not part of it (shim.cpp's one_stream_writer drops them).
size_t one_stream(size_t bytes, uint32_t n_stream) { return bytes - 4 * (n_stream - 1); }

} // namespace

extern "C" {

const char * hydra_memory_name(struct llama_context * ctx) {
    llama_memory_t mem = llama_get_memory(ctx);
    if (mem == nullptr) {
        return "none";
    }
    std::vector<leaf> ls;
    const char * name = "unknown";
    leaves(mem, ls, &name);
    return name;
}

int hydra_state_parts(struct llama_context * ctx, llama_seq_id seq, uint32_t n_stream, size_t size,
                      hydra_state_part * out, int max, uint8_t * fields, size_t fields_cap, char * err, size_t err_len) {
    try {
        llama_synchronize(ctx);
        llama_memory_t mem = llama_get_memory(ctx);
        std::vector<leaf> ls;
        const char * name = "none";
        if (mem == nullptr || !leaves(mem, ls, &name)) {
            snprintf(err, err_len, "llama.cpp's %s memory module, whose state the plugin does not know how to check", name);
            return -1;
        }
        if ((int) ls.size() > max) {
            snprintf(err, err_len, "a state of %zu parts", ls.size());
            return -1;
        }
        if (n_stream > 1 && (ls.size() != 1 || ls[0].kv == nullptr)) {
            snprintf(err, err_len, "a KV stream per sequence (kv_unified off) with llama.cpp's %s memory module", name);
            return -1;
        }
        size_t total = 0, used = 0;
        for (size_t i = 0; i < ls.size(); i++) {
            counter c;
            hydra_state_part & p = out[i];
            p = hydra_state_part{};
            if (ls[i].kv != nullptr) {
                ls[i].kv->state_write(c, seq, 0);
                p.kind = HYDRA_PART_KV;
                p.cell_meta = 12 + (ls[i].kv->has_cell_ext() ? (uint32_t) sizeof(llama_kv_cell_ext) : 0);
                p.capacity = ls[i].kv->get_size();
                p.swa = ls[i].swa ? 1 : 0;
                p.bytes = n_stream > 1 ? one_stream(c.bytes, n_stream) : c.bytes;
            } else {
                ls[i].rec->state_write(c, seq, 0);
                p.kind = HYDRA_PART_RECURRENT;
                p.cell_meta = 8;
                p.capacity = ls[i].rec->size;
                p.bytes = c.bytes;
            }
            p.max_row = c.max_row;
            total += p.bytes;
            // A KV part's cell count follows its stream count; a recurrent
            // part's comes first.
            const std::vector<uint8_t> f = n_stream > 1 ? std::vector<uint8_t>{}
                                                        : row_fields(c.fields, p.kind == HYDRA_PART_KV ? 4 : 0, p.cell_meta);
            if (!f.empty() && used + f.size() <= fields_cap) {
                memcpy(fields + used, f.data(), f.size());
                p.fields_off = (uint32_t) used;
                p.n_fields = (uint32_t) f.size();
                used += f.size();
            }
        }
        if (total != size) {
            snprintf(err, err_len, "the parts of llama.cpp's %s state add up to %zu bytes, the state is %zu", name, total, size);
            return -1;
        }
        return (int) ls.size();
    } catch (const std::exception & e) {
        snprintf(err, err_len, "%s", e.what());
        return -1;
    }
}

} // extern "C"
