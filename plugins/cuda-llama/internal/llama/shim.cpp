//go:build llama && cgo

// Chunked streaming of one sequence's KV state, through llama.cpp's internal
// serialisation interfaces (llama-io.h, llama-memory.h). llama.cpp's own
// llama_state_seq_get_data wants the whole state in one buffer and
// ggml_backend_tensor_get's every tensor range synchronously; here the same
// bytes (same code path: llama_memory_i::state_write) go out chunk by chunk,
// in two passes: llama.cpp's walk of the cells, under the context lock,
// records the metadata it writes and the KV caches' ranges it reads (a
// plan), copying the rest (a recurrent state, whose cell other sequences'
// decodes move); the KV ranges are then read without the lock, while other
// sequences decode: the sequence's KV cells are its own while its slot is
// held, and nothing moves them while a transfer is under way (no context
// shift, no chunk moves).
//
//   - host-resident tensors (CPU) are memcpy'd straight into the chunk;
//   - GPU-resident tensors are read with ggml_backend_tensor_get_async on a
//     stream of our own: into pinned staging chunks from the device's host
//     buffer type, two chunks in flight (the GPU fills one while Go sends
//     the other, an event per chunk says when it is complete), or straight
//     into a ChunkWriter's buffer, one synchronisation a chunk. No CUDA
//     symbol is used: it is all ggml.
//
// Restores take the bytes llama.cpp asks for where the Go side lends them
// (hydraLoadNext): the data plane's own buffers (inplace_linux.go) or the
// restore ring a goroutine fills ahead (prefetch_linux.go); pinned on a GPU,
// so uploads are pinned host-to-device copies. llama.cpp hands each run of a
// K/V block to the reader as read_tensor(tensor, offset, size), and the
// reader uploads it with ggml_backend_tensor_set: a run held whole where it
// is contiguous in the stream, or, streamed (a run of at least the Go side's
// stream_min), piece by piece as the bytes arrive, so that no block needs to
// be held in memory whole.
//
// These internal interfaces change between llama.cpp versions; the tree is
// pinned (mk/llama-pin.mk) and the byte-identity tests catch a drift.

#include "shim.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama-io.h"
#include "llama-memory.h"
#include "statemem.h"

// Exported by the Go side (exports.go).
extern "C" {
int hydraSaveDeliver(uintptr_t h, void * p, size_t n);
int hydraSaveBuffer(uintptr_t h, size_t commit, uint8_t ** p, size_t * n);
int hydraLoadNext(uintptr_t h, size_t release, size_t need, uint8_t ** p, size_t * n);
void hydraLoadHold(uintptr_t h, int hold);
void hydraLog(int level, char * text);
}

namespace {

constexpr size_t kMiB = 1 << 20;

// go_error unwinds llama.cpp's serialisation after a Go callback failed; the
// Go side holds the real error.
struct go_error : std::runtime_error {
    go_error() : std::runtime_error("stopped by the Go side") {}
};

struct staging {
    uint8_t * ptr = nullptr;
    size_t cap = 0;
    ggml_backend_buffer_t buf = nullptr; // set when the memory is pinned, from ggml
};

struct dev_state {
    ggml_backend_t backend = nullptr;          // a stream of our own on the device
    ggml_backend_event_t ev[2] = {nullptr, nullptr}; // one per staging chunk; NULL: synchronise the stream
    bool failed = false;
};

} // namespace

struct hydra_io {
    ggml_backend_dev_t gpu = nullptr;
    ggml_backend_buffer_type_t host_buft = nullptr; // pinned host memory of the GPU, or NULL
    bool pinned = false;
    bool warned_pageable = false;
    std::map<ggml_backend_dev_t, dev_state> devs;
    staging save[2];
    // Streamed restores so far: the K/V blocks (a tensor's runs in a row)
    // with a streamed run, and the runs streamed.
    uint64_t streamed = 0, streamed_runs = 0;
};

// hydra_state_plan is a sequence's state as llama.cpp's walk of it wrote it:
// pieces of metadata (t NULL: bytes [off, off+size) of meta) and of tensor
// data (size bytes of t from off), in order.
struct hydra_state_plan {
    struct piece {
        ggml_tensor * t;
        size_t off, size;
    };
    std::vector<piece> pieces;
    std::vector<uint8_t> meta;
    size_t total = 0;
};

namespace {

void log_line(ggml_log_level level, const char * msg) {
    hydraLog((int) level, (char *) msg);
}

// reserve grows s to at least size bytes, keeping its first keep bytes. Pinned
// allocations are slow (tens of ms for 64 MiB), so buffers are kept and only
// ever grow.
void reserve(hydra_io * io, staging & s, size_t size, size_t keep) {
    if (s.cap >= size) {
        return;
    }
    size = (size + kMiB - 1) / kMiB * kMiB;
    staging n;
    if (io->host_buft != nullptr) {
        n.buf = ggml_backend_buft_alloc_buffer(io->host_buft, size);
        if (n.buf != nullptr) {
            n.ptr = (uint8_t *) ggml_backend_buffer_get_base(n.buf);
            io->pinned = true;
        } else if (!io->warned_pageable) {
            io->warned_pageable = true;
            log_line(GGML_LOG_LEVEL_WARN, "hydra: pinned staging allocation failed, using pageable memory (slower GPU copies)\n");
        }
    }
    if (n.ptr == nullptr) {
        n.ptr = (uint8_t *) std::aligned_alloc(4096, size);
        if (n.ptr == nullptr) {
            throw std::bad_alloc();
        }
    }
    n.cap = size;
    if (keep > 0) {
        memcpy(n.ptr, s.ptr, keep);
    }
    if (s.buf != nullptr) {
        ggml_backend_buffer_free(s.buf);
    } else {
        std::free(s.ptr);
    }
    s = n;
}

// async_dev returns the device state for async reads of t, or NULL when t is
// to be read synchronously (not in a GPU's own buffer type, e.g. split
// buffers, or the device could not give us a stream).
dev_state * async_dev(hydra_io * io, const ggml_tensor * t) {
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(t->buffer);
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ||
        buft != ggml_backend_dev_buffer_type(dev)) {
        return nullptr;
    }
    dev_state & d = io->devs[dev];
    if (d.failed) {
        return nullptr;
    }
    if (d.backend == nullptr) {
        d.backend = ggml_backend_dev_init(dev, nullptr);
        if (d.backend == nullptr) {
            d.failed = true;
            log_line(GGML_LOG_LEVEL_WARN, "hydra: no stream of our own on the KV device: synchronous state copies\n");
            return nullptr;
        }
        d.ev[0] = ggml_backend_event_new(dev);
        d.ev[1] = ggml_backend_event_new(dev);
    }
    return &d;
}

// save_writer receives llama.cpp's serialisation and cuts it into chunks.
class save_writer : public llama_io_write_i {
public:
    save_writer(hydra_io * io, uintptr_t h, size_t chunk, bool cw) : io(io), h(h), chunk(chunk), cw(cw) {}

    void write(const void * src, size_t size) override {
        const uint8_t * s = (const uint8_t *) src;
        while (size > 0) {
            room();
            const size_t n = std::min(size, cap - len);
            memcpy(cur + len, s, n);
            advance(n);
            s += n;
            size -= n;
        }
    }

    void write_tensor(ggml_tensor * t, size_t off, size_t size) override {
        const bool host = t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer);
        dev_state * d = host ? nullptr : async_dev(io, t);
        while (size > 0) {
            room();
            const size_t n = std::min(size, cap - len);
            uint8_t * dst = cur + len;
            if (host) {
                memcpy(dst, (const uint8_t *) t->data + off, n);
            } else if (d != nullptr) {
                ggml_backend_tensor_get_async(d->backend, t, dst, off, n);
                auto & u = used[slot];
                if (std::find(u.begin(), u.end(), d) == u.end()) {
                    u.push_back(d);
                }
            } else {
                ggml_backend_tensor_get(t, dst, off, n);
            }
            advance(n);
            off += n;
            size -= n;
        }
    }

    size_t n_bytes() override { return total; }

    // finish hands over what is left: the partial chunk, then nothing pending.
    void finish() {
        flush();
        deliver_pending();
    }

    // abandon waits for copies still landing in the staging chunks, so that
    // none writes into them after we return.
    void abandon() {
        for (int s = 0; s < 2; s++) {
            for (dev_state * d : used[s]) {
                ggml_backend_synchronize(d->backend);
            }
            used[s].clear();
        }
    }

private:
    hydra_io * io;
    uintptr_t h;
    size_t chunk;
    bool cw;
    size_t total = 0;

    uint8_t * cur = nullptr; // chunk being filled
    size_t cap = 0, len = 0;
    int slot = 0;                    // its staging chunk (plain mode)
    std::vector<dev_state *> used[2]; // devices with async copies into each staging chunk
    int pend = -1;                   // staging chunk in flight, waiting to be handed over
    size_t pend_len = 0;

    void room() {
        if (cur != nullptr && len < cap) {
            return;
        }
        if (cw) {
            uint8_t * p = nullptr;
            size_t n = 0;
            if (hydraSaveBuffer(h, 0, &p, &n) != 0 || p == nullptr || n == 0) {
                throw go_error();
            }
            cur = p;
            cap = std::min(n, chunk);
        } else {
            reserve(io, io->save[slot], chunk, 0);
            cur = io->save[slot].ptr;
            cap = chunk;
        }
        len = 0;
    }

    void advance(size_t n) {
        len += n;
        total += n;
        if (len == cap) {
            flush();
        }
    }

    void flush() {
        if (cur == nullptr || len == 0) {
            return;
        }
        const size_t n = len;
        cur = nullptr;
        len = 0;
        if (cw) {
            // A ChunkWriter lends one buffer at a time: its copies land
            // before it is committed.
            for (dev_state * d : used[slot]) {
                ggml_backend_synchronize(d->backend);
            }
            used[slot].clear();
            if (hydraSaveBuffer(h, n, nullptr, nullptr) != 0) {
                throw go_error();
            }
            return;
        }
        if (used[slot].empty()) {
            // Complete already: hand it over (after any older chunk).
            deliver_pending();
            deliver(slot, n);
            return;
        }
        // Copies into this chunk are in flight: mark their end, hand over the
        // older chunk while they land, and fill the other chunk next.
        for (dev_state * d : used[slot]) {
            if (d->ev[slot] != nullptr) {
                ggml_backend_event_record(d->ev[slot], d->backend);
            }
        }
        deliver_pending();
        pend = slot;
        pend_len = n;
        slot ^= 1;
    }

    void deliver_pending() {
        if (pend < 0) {
            return;
        }
        const int s = pend;
        pend = -1;
        for (dev_state * d : used[s]) {
            if (d->ev[s] != nullptr) {
                ggml_backend_event_synchronize(d->ev[s]);
            } else {
                ggml_backend_synchronize(d->backend);
            }
        }
        used[s].clear();
        deliver(s, pend_len);
    }

    void deliver(int s, size_t n) {
        if (hydraSaveDeliver(h, io->save[s].ptr, n) != 0) {
            throw go_error();
        }
    }
};

// read_later reports whether t's ranges may be read after the walk, without
// the context lock: a KV cache's K and V ("cache_[tag]k_l<N>",
// "cache_[tag]v_l<N>"), whose cells stay the sequence's while its slot is
// held. Any other tensor is copied during the walk: a recurrent state's
// cell moves when other sequences decode (llama_memory_recurrent::find_slot
// makes a batch's cells contiguous by swapping cells, an idle sequence's
// too).
bool read_later(const ggml_tensor * t) {
    const char * l = strrchr(t->name, '_');
    return strncmp(t->name, "cache_", 6) == 0 && l != nullptr && l > t->name + 6 && l[1] == 'l' &&
           (l[-1] == 'k' || l[-1] == 'v');
}

// plan_writer records llama.cpp's walk of a sequence's state: the metadata
// bytes it writes and the tensors' bytes read_later refuses, kept, and the
// other tensor ranges, by reference (adjacent ranges of one tensor merged),
// in order.
class plan_writer : public llama_io_write_i {
public:
    explicit plan_writer(hydra_state_plan & p) : p(p) {}

    void write(const void * src, size_t n) override {
        const size_t at = p.meta.size();
        p.meta.insert(p.meta.end(), (const uint8_t *) src, (const uint8_t *) src + n);
        add(nullptr, at, n);
    }

    void write_tensor(ggml_tensor * t, size_t off, size_t n) override {
        if (read_later(t)) {
            add(t, off, n);
            return;
        }
        const size_t at = p.meta.size();
        p.meta.resize(at + n);
        ggml_backend_tensor_get(t, p.meta.data() + at, off, n);
        add(nullptr, at, n);
    }

    size_t n_bytes() override { return p.total; }

private:
    hydra_state_plan & p;

    // add appends n bytes of t from off (t NULL: of meta) to the plan,
    // extending the last piece where they follow it.
    void add(ggml_tensor * t, size_t off, size_t n) {
        if (!p.pieces.empty() && p.pieces.back().t == t && p.pieces.back().off + p.pieces.back().size == off) {
            p.pieces.back().size += n;
        } else {
            p.pieces.push_back({t, off, n});
        }
        p.total += n;
    }
};

// The wire's state is one KV stream. With a KV stream per sequence
// (kv_unified off) llama.cpp writes a sequence's state as every stream's,
// all but the sequence's own empty (a 4-byte zero cell count each), and reads
// back only as many streams as its cache has. one_stream_writer drops the
// other streams' empty counts and says 1 stream; one_stream_reader says the
// cache's count and presents the other streams as empty after the state's
// bytes. So a state moves between engines of any slot count and either mode.
class one_stream_writer : public llama_io_write_i {
public:
    // size is the one-stream state's bytes; strm the sequence's stream.
    one_stream_writer(llama_io_write_i & out, uint32_t strm, size_t size) : out(out), lead(strm), size(size) {}

    void write(const void * src, size_t n) override {
        if (!counted) {
            expect(n == 4, "the stream count");
            const uint32_t one = 1;
            out.write(&one, sizeof(one));
            counted = true;
            return;
        }
        if (lead > 0 || out.n_bytes() >= size) {
            uint32_t v = 1;
            expect(n == 4 && (memcpy(&v, src, 4), v == 0), "another stream's empty cell count");
            lead -= lead > 0 ? 1 : 0;
            return;
        }
        out.write(src, n);
    }

    void write_tensor(ggml_tensor * t, size_t off, size_t n) override {
        expect(counted && lead == 0 && out.n_bytes() + n <= size, "the sequence's own stream");
        out.write_tensor(t, off, n);
    }

    size_t n_bytes() override { return out.n_bytes(); }

private:
    llama_io_write_i & out;
    uint32_t lead;  // the streams before the sequence's, whose counts are still to come
    size_t size;
    bool counted = false;

    static void expect(bool ok, const char * what) {
        if (!ok) {
            throw std::runtime_error(std::string("hydra: llama.cpp's per-stream state is not as expected at ") + what);
        }
    }
};

class one_stream_reader : public llama_io_read_i {
public:
    // size is the one-stream state's bytes in the source.
    one_stream_reader(llama_io_read_i & in, uint32_t n_stream, size_t size) : in(in), n_stream(n_stream), size(size) {}

    void read(void * dst, size_t n) override {
        if (!counted) {
            uint32_t v = 0;
            in.read(&v, sizeof(v));
            if (n != 4 || v != 1) {
                throw std::runtime_error("hydra: the state is not one KV stream");
            }
            memcpy(dst, &n_stream, 4);
            counted = true;
            return;
        }
        if (in.n_bytes() >= size) {
            if (n != 4) {
                throw std::runtime_error("hydra: llama.cpp reads past the state");
            }
            memset(dst, 0, 4); // another stream's cell count: empty
            return;
        }
        in.read(dst, n);
    }

    void read_tensor(ggml_tensor * t, size_t off, size_t n) override {
        if (in.n_bytes() + n > size) {
            throw std::runtime_error("hydra: llama.cpp reads past the state");
        }
        in.read_tensor(t, off, n);
    }

    size_t n_bytes() override { return in.n_bytes(); }

private:
    llama_io_read_i & in;
    uint32_t n_stream;
    size_t size;
    bool counted = false;
};

// state_guard checks a restore's structure as llama.cpp reads it, before
// llama.cpp acts on a field: each part's stream and cell counts, its cells'
// positions and sequence counts, and that the parts end where their counts
// say (llama.cpp trusts those fields: a count of 2^32-1 makes it reserve that
// many cells, an odd position corrupts the sequence). Fields are read 4 bytes
// at a time at known offsets of their part; a read across one is refused.
class state_guard {
public:
    state_guard(const hydra_part_rule * rules, int n, int32_t n_tokens) : rules(rules), n(n), n_tokens(n_tokens) {}

    bool active() const { return n > 0; }

    // field checks a read of size bytes at stream offset off, and reports
    // whether it is one of the fields among a part's rows (a layer count,
    // type or row size), which must be this model's where the rule has them:
    // llama.cpp frees the sequence's cells on a mismatch, which needs the
    // context lock, while a refusal here is made with it held.
    bool field(size_t off, const uint8_t * p, size_t size) {
        const hydra_part_rule & r = at(off, size);
        const size_t rel = off - start;
        if (rel >= head) {
            if (r.fields != nullptr && (fcur + size > r.n_fields || memcmp(p, r.fields + fcur, size) != 0)) {
                uint64_t got = 0, want = 0;
                memcpy(&got, p, std::min<size_t>(size, 8));
                if (fcur + size <= r.n_fields) {
                    memcpy(&want, r.fields + fcur, std::min<size_t>(size, 8));
                }
                failf("a layer count, type or row size among a part's rows that is not this model's "
                      "(byte %zu of their fields: %llu, this model's %llu)",
                      fcur, (unsigned long long) got, (unsigned long long) want);
            }
            fcur += size;
            return true;
        }
        if (rel + size > head) {
            fail("a read across the end of a part's cell metadata");
        }
        uint32_t v = 0;
        auto u32 = [&]() {
            if (size != 4) {
                fail("a field read that is not 4 bytes");
            }
            memcpy(&v, p, 4);
            return v;
        };
        if (r.kind == HYDRA_PART_KV && rel == 0) {
            if (u32() != 1) {
                failf("a KV part of %u streams, want 1", v);
            }
            return false;
        }
        const size_t cnt = r.kind == HYDRA_PART_KV ? 4 : 0;
        if (rel == cnt) {
            cells = u32();
            if (cells < r.min_cells || cells > r.max_cells) {
                failf("a part of %u cells, want %u to %u", cells, r.min_cells, r.max_cells);
            }
            size_part = cells == 0 ? r.empty : r.base + (uint64_t) cells * r.per_cell;
            head = cnt + 4 + (size_t) cells * r.cell_meta;
            return false;
        }
        const size_t c = (rel - cnt - 4) % r.cell_meta;
        if (c + size > r.cell_meta) {
            fail("a read across a cell's metadata");
        }
        if (c == 0) {
            const int32_t pos = (int32_t) u32();
            const bool ok = r.kind == HYDRA_PART_KV ? pos >= 0 && pos < n_tokens : pos == n_tokens - 1;
            if (!ok) {
                failf("a cell at position %d of a sequence of %d tokens", pos, n_tokens);
            }
        } else if (c == 4) {
            const uint32_t want = r.kind == HYDRA_PART_KV ? 1 : 0;
            if (u32() != want) {
                failf("a cell of %u sequences, want %u", v, want);
            }
        }
        return false;
    }

    // tensor checks a tensor read of size bytes at stream offset off: within
    // its part's rows.
    void tensor(size_t off, size_t size) {
        at(off, size);
        if (off - start < head || off - start + size > size_part) {
            fail("a tensor read outside its part's rows");
        }
    }

    // unlocked_rows reports whether the current part's rows may be written
    // without the context lock: a KV part (a recurrent cell moves when other
    // sequences decode) whose rows' fields are checked (a mismatch is refused
    // here, under the lock, before llama.cpp acts on it).
    bool unlocked_rows() const {
        return n > 0 && part < n && counted() && rules[part].kind == HYDRA_PART_KV && rules[part].fields != nullptr;
    }

    // done checks that the state ended where the last part does.
    void done(size_t consumed) {
        if (n > 0 && (part != n - 1 || !counted() || consumed != start + size_part)) {
            fail("a state that ends before its parts do");
        }
    }

private:
    const hydra_part_rule * rules;
    int n;
    int32_t n_tokens;
    int part = 0;
    size_t start = 0;          // the current part's first byte
    size_t head = 8;           // its fields before the rows (known once its cells are)
    uint64_t size_part = 0;    // its bytes, 0 until its cell count is read
    uint32_t cells = 0;
    size_t fcur = 0;           // the part's rows' fields read so far

    bool counted() const { return size_part > 0; }

    // at moves on to the part holding off and returns its rule.
    const hydra_part_rule & at(size_t off, size_t size) {
        while (counted() && off >= start + size_part) {
            start += size_part;
            part++;
            size_part = 0;
            head = 8;
            fcur = 0;
        }
        if (part >= n) {
            fail("a read past the state's last part");
        }
        if (!counted() && off - start + size > (rules[part].kind == HYDRA_PART_KV ? 8u : 4u)) {
            fail("a read before the part's cell count");
        }
        return rules[part];
    }

    [[noreturn]] static void fail(const char * what) {
        throw std::runtime_error(std::string("hydra: the state's structure is not this model's: ") + what);
    }

    template <typename... A> [[noreturn]] static void failf(const char * f, A... a) {
        char buf[256];
        snprintf(buf, sizeof(buf), f, a...);
        fail(buf);
    }
};

// finite_check refuses a restored K/V or recurrent run holding a value no
// model's cache can: an f16, bf16 or f32 Inf or NaN, or a q8_0/q4_0 block
// whose f16 scale is one. A NaN in one sequence's cells reaches the others'
// attention through masked products (0 × NaN), so the check guards the
// bystanders, not only the sequence restored. Runs start at an element or
// block boundary (llama.cpp reads whole rows or elements); pieces of a
// streamed run may split one, which the check carries over.
class finite_check {
public:
    // start begins a run of t's bytes at offset off within the tensor.
    void start(const ggml_tensor * t, size_t off) {
        elem = field = 0;
        switch (t->type) {
        case GGML_TYPE_F16: elem = field = 2; exp16 = 0x7c00; break;
        case GGML_TYPE_BF16: elem = field = 2; exp16 = 0x7f80; break;
        case GGML_TYPE_F32: elem = field = 4; break;
        case GGML_TYPE_Q8_0: elem = 34; field = 2; exp16 = 0x7c00; break;
        case GGML_TYPE_Q4_0: elem = 18; field = 2; exp16 = 0x7c00; break;
        default: return; // other types: not checked
        }
        pos = off % elem;
        if (pos > 0 && pos < field) {
            pos = field; // a field cut by the run's start cannot be read whole: skip it
        }
    }

    // feed checks the run's next n bytes.
    void feed(const uint8_t * p, size_t n) {
        if (elem == 0) {
            return;
        }
        while (n > 0) {
            if (pos == 0 && n >= elem) { // whole elements: the fast loop
                const size_t m = n / elem;
                scan(p, m);
                p += m * elem;
                n -= m * elem;
                continue;
            }
            if (pos < field) {
                const size_t k = std::min(field - pos, n);
                memcpy(carry + pos, p, k);
                pos += k, p += k, n -= k;
                if (pos == field) {
                    scan(carry, 1, field);
                }
                continue;
            }
            const size_t k = std::min(elem - pos, n);
            pos += k, p += k, n -= k;
            if (pos == elem) {
                pos = 0;
            }
        }
    }

private:
    size_t elem = 0, field = 0, pos = 0;
    uint16_t exp16 = 0;
    uint8_t carry[4] = {};

    // scan checks m elements (or m fields of stride bytes) from p.
    void scan(const uint8_t * p, size_t m, size_t stride = 0) {
        stride = stride ? stride : elem;
        bool bad;
        if (stride == field) {
            bad = field == 4 ? nonfinite32(p, m) : nonfinite16(p, m, exp16);
        } else {
            bad = false;
            for (size_t i = 0; i < m; i++) {
                uint16_t v;
                memcpy(&v, p + i * stride, 2);
                bad |= (v & exp16) == exp16;
            }
        }
        if (bad) {
            throw std::runtime_error("hydra: the state holds an Inf or NaN, which no model's cache holds");
        }
    }

    // nonfinite16 reports an all-ones exponent (mask e) among m 16-bit
    // values, four at a time: a lane of (x & E) ^ E is zero exactly there.
    __attribute__((optimize("O3"))) static bool nonfinite16(const uint8_t * p, size_t m, uint16_t e) {
        const uint64_t E = 0x0001000100010001ull * e, ONE = 0x0001000100010001ull, HI = 0x8000800080008000ull;
        uint64_t acc = 0;
        size_t i = 0;
        for (; i + 4 <= m; i += 4) {
            uint64_t x;
            memcpy(&x, p + 2 * i, 8);
            const uint64_t t = (x & E) ^ E;
            acc |= (t - ONE) & ~t & HI;
        }
        for (; i < m; i++) {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            acc |= (v & e) == e;
        }
        return acc != 0;
    }

    __attribute__((optimize("O3"))) static bool nonfinite32(const uint8_t * p, size_t m) {
        uint32_t acc = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t v;
            memcpy(&v, p + 4 * i, 4);
            acc |= (v & 0x7f800000u) == 0x7f800000u;
        }
        return acc != 0;
    }
};

// load_reader serves llama.cpp's reads from the Go side's restore ring or
// the data plane's buffers (hydraLoadNext). Fields are copied out; a K/V run
// (read_tensor) is uploaded from where it lies: in one ggml_backend_tensor_set
// once it is contiguous there, or, streamed (stream_min > 0 and a run of at
// least stream_min bytes), piece by piece as the bytes arrive, in pieces of at
// least piece_min bytes where the stream holds them.
class load_reader : public llama_io_read_i {
public:
    load_reader(hydra_io * io, uintptr_t h, size_t stream_min, size_t piece_min, state_guard & guard)
        : io(io), h(h), stream_min(stream_min), piece_min(std::max<size_t>(piece_min, 1)), guard(guard) {}

    void read(void * dst, size_t size) override {
        held_through([&] {
            const size_t off = consumed;
            consumed += size;
            uint8_t * d = (uint8_t *) dst;
            pieces(size, [&](const uint8_t * p, size_t k) {
                memcpy(d, p, k);
                d += k;
            });
            if (!(guard.active() && guard.field(off, (const uint8_t *) dst, size))) {
                hold(true); // llama.cpp acts on this field
            }
        });
    }

    void read_tensor(ggml_tensor * t, size_t off, size_t size) override {
        held_through([&] { upload(t, off, size); });
    }

    size_t n_bytes() override { return consumed; }

    // refusal is why a read refused the state ("" if none did): llama.cpp
    // catches what a read throws among a part's rows and says only that the
    // restore failed.
    const std::string & refusal() const { return why; }

    // hold takes the context lock back (on) or lets it go, through the Go side.
    void hold(bool on) {
        if (on != held) {
            hydraLoadHold(h, on ? 1 : 0);
            held = on;
        }
    }

private:
    hydra_io * io;
    uintptr_t h;
    size_t stream_min, piece_min;
    state_guard & guard;
    finite_check finite;
    const uint8_t * cur = nullptr;
    size_t avail = 0, taken = 0, consumed = 0;
    const ggml_tensor * last_streamed = nullptr; // the tensor of the last streamed run: its block's
    bool held = true;                            // the context lock, which the caller holds at first
    std::string why;                             // the first refusal

    // held_through runs f, taking the lock back before anything it throws
    // reaches llama.cpp, which frees the sequence's cells on a failed read,
    // and keeps a refusal's reason.
    template <typename F> void held_through(F && f) {
        try {
            f();
        } catch (const go_error &) {
            hold(true);
            throw;
        } catch (const std::exception & e) {
            if (why.empty()) {
                why = e.what();
            }
            hold(true);
            throw;
        } catch (...) {
            hold(true);
            throw;
        }
    }

    // upload writes a K/V run into tensor t, from where it lies.
    void upload(ggml_tensor * t, size_t off, size_t size) {
        if (guard.active()) {
            guard.tensor(consumed, size);
            if (guard.unlocked_rows()) {
                hold(false);
            }
        }
        consumed += size;
        finite.start(t, off);
        if (stream_min > 0 && size >= stream_min) {
            if (t != last_streamed) {
                io->streamed++;
                last_streamed = t;
            }
            io->streamed_runs++;
            pieces(size, [&](const uint8_t * p, size_t k) {
                finite.feed(p, k);
                ggml_backend_tensor_set(t, p, off, k);
                off += k;
            });
        } else {
            if (avail < size) {
                more(size);
            }
            finite.feed(cur, size);
            ggml_backend_tensor_set(t, cur, off, size);
            cur += size;
            avail -= size;
            taken += size;
        }
    }

    // more hands back what was taken since the last call and gets at least
    // size bytes (usually more: what the ring holds already).
    void more(size_t size) {
        uint8_t * p = nullptr;
        size_t n = 0;
        if (hydraLoadNext(h, taken, size, &p, &n) != 0 || p == nullptr || n < size) {
            throw go_error();
        }
        cur = p;
        avail = n;
        taken = 0;
    }

    // pieces takes the next size bytes of the stream from the ring in
    // contiguous pieces of at least piece_min bytes (where the stream still
    // holds that many), handing each to f(p, k) before the ring may reuse it.
    template <typename F> void pieces(size_t size, F && f) {
        while (size > 0) {
            if (avail == 0) {
                more(std::min(size, piece_min));
            }
            const size_t k = std::min(avail, size);
            f(cur, k);
            cur += k;
            avail -= k;
            taken += k;
            size -= k;
        }
    }
};

void set_err(char * err, size_t err_len, const char * msg) {
    if (err != nullptr && err_len > 0) {
        snprintf(err, err_len, "%s", msg);
    }
}

void log_cb(ggml_log_level level, const char * text, void * /* user */) {
    hydraLog((int) level, (char *) text);
}

// memory_of finishes ctx's queued work, as llama.cpp's own state calls do,
// and returns its memory module.
llama_memory_t memory_of(struct llama_context * ctx) {
    llama_synchronize(ctx);
    llama_memory_t mem = llama_get_memory(ctx);
    if (mem == nullptr) {
        throw std::runtime_error("the context has no memory module");
    }
    return mem;
}

} // namespace

extern "C" {

hydra_io * hydra_io_new(ggml_backend_dev_t gpu) {
    hydra_io * io = new (std::nothrow) hydra_io();
    if (io != nullptr && gpu != nullptr) {
        io->gpu = gpu;
        io->host_buft = ggml_backend_dev_host_buffer_type(gpu);
    }
    return io;
}

int hydra_io_pinned(const hydra_io * io) { return io->pinned ? 1 : 0; }

uint64_t hydra_io_streamed(const hydra_io * io, uint64_t * runs) {
    *runs = io->streamed_runs;
    return io->streamed;
}

hydra_state_plan * hydra_state_plan_new(struct llama_context * ctx, llama_seq_id seq, uint32_t n_stream, size_t size,
                                        char * err, size_t err_len) {
    hydra_state_plan * p = new (std::nothrow) hydra_state_plan();
    if (p == nullptr) {
        set_err(err, err_len, "out of memory for a state's plan");
        return nullptr;
    }
    try {
        // As llama_state_seq_get_data: finish queued work before reading.
        llama_synchronize(ctx);
        llama_memory_t mem = llama_get_memory(ctx);
        plan_writer w(*p);
        if (mem != nullptr && n_stream > 1) {
            one_stream_writer one(w, (uint32_t) seq, size);
            mem->state_write(one, seq, 0);
        } else if (mem != nullptr) {
            mem->state_write(w, seq, 0);
        }
        return p;
    } catch (const std::exception & e) {
        delete p;
        set_err(err, err_len, e.what());
        return nullptr;
    }
}

void hydra_state_plan_free(hydra_state_plan * p) { delete p; }

int64_t hydra_state_plan_save(hydra_io * io, const hydra_state_plan * p, uintptr_t handle, size_t chunk, int chunk_writer,
                              char * err, size_t err_len) {
    save_writer w(io, handle, chunk, chunk_writer != 0);
    try {
        for (const auto & pc : p->pieces) {
            if (pc.t == nullptr) {
                w.write(p->meta.data() + pc.off, pc.size);
            } else {
                w.write_tensor(pc.t, pc.off, pc.size);
            }
        }
        w.finish();
        return (int64_t) w.n_bytes();
    } catch (const std::exception & e) {
        w.abandon();
        set_err(err, err_len, e.what());
        return -1;
    }
}

int64_t hydra_state_load(hydra_io * io, struct llama_context * ctx, llama_seq_id seq, uint32_t n_stream, size_t size,
                         uintptr_t handle, size_t stream_min, size_t piece_min,
                         const hydra_part_rule * rules, int n_rules, int32_t n_tokens, char * err, size_t err_len) {
    state_guard guard(rules, n_stream > 1 ? 0 : n_rules, n_tokens);
    load_reader r(io, handle, stream_min, piece_min, guard);
    try {
        llama_memory_t mem = memory_of(ctx);
        if (n_stream > 1) {
            one_stream_reader one(r, n_stream, size);
            mem->state_read(one, seq, 0);
        } else {
            mem->state_read(r, seq, 0);
        }
        r.hold(true);
        guard.done(r.n_bytes());
        return (int64_t) r.n_bytes();
    } catch (const std::exception & e) {
        r.hold(true);
        set_err(err, err_len, r.refusal().empty() ? e.what() : r.refusal().c_str());
        return -1;
    }
}

void hydra_log_install(void) { llama_log_set(log_cb, nullptr); }

} // extern "C"
