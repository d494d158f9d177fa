//go:build llama && cgo

// Chunked streaming of one sequence's KV state, through llama.cpp's internal
// serialisation interfaces (llama-io.h, llama-memory.h). llama.cpp's own
// llama_state_seq_get_data wants the whole state in one buffer and
// ggml_backend_tensor_get's every tensor range synchronously; here the same
// bytes (same code path: llama_memory_i::state_write) go out chunk by chunk:
//
//   - host-resident tensors (CPU) are memcpy'd straight into the chunk;
//   - GPU-resident tensors are read with ggml_backend_tensor_get_async into
//     pinned staging chunks from the device's host buffer type, two chunks in
//     flight: the GPU fills one while Go sends the other, an event per chunk
//     says when it is complete. No CUDA symbol is used: it is all ggml.
//
// Restores take the bytes llama.cpp asks for (one contiguous block per layer)
// in place from the Go side's restore ring (prefetch_linux.go), which a
// goroutine fills ahead while the block before is uploaded; pinned on a GPU,
// so the upload is a fast pinned host-to-device copy.
//
// These internal interfaces change between llama.cpp versions; the module is
// pinned in go.mod and the byte-identity tests catch a drift.

#include "shim.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <stdexcept>
#include <vector>

#include "llama-io.h"
#include "llama-memory.h"

// Exported by the Go side (stream.go, log.go).
extern "C" {
int hydraSaveDeliver(uintptr_t h, void * p, size_t n);
int hydraSaveBuffer(uintptr_t h, size_t commit, uint8_t ** p, size_t * n);
int hydraLoadNext(uintptr_t h, size_t release, size_t need, uint8_t ** p, size_t * n);
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

    void write_tensor(const ggml_tensor * t, size_t off, size_t size) override {
        const bool host = t->buffer == nullptr || ggml_backend_buffer_is_host(t->buffer);
        // A ChunkWriter hands us one buffer at a time, so there is nothing to
        // overlap with: read synchronously straight into it.
        dev_state * d = (host || cw) ? nullptr : async_dev(io, t);
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

// load_reader serves llama.cpp's reads in place from the Go side's restore
// ring: each pointer stays valid until the next read, as llama.cpp expects.
class load_reader : public llama_io_read_i {
public:
    explicit load_reader(uintptr_t h) : h(h) {}

    const uint8_t * read(size_t size) override {
        if (avail < size) {
            // Hand back what was taken since the last call, get at least
            // size bytes (usually more: what the ring holds already).
            uint8_t * p = nullptr;
            size_t n = 0;
            if (hydraLoadNext(h, taken, size, &p, &n) != 0 || p == nullptr || n < size) {
                throw go_error();
            }
            cur = p;
            avail = n;
            taken = 0;
        }
        const uint8_t * p = cur;
        cur += size;
        avail -= size;
        taken += size;
        consumed += size;
        return p;
    }

    void read_to(void * dst, size_t size) override { memcpy(dst, read(size), size); }

    size_t n_bytes() override { return consumed; }

private:
    uintptr_t h;
    const uint8_t * cur = nullptr;
    size_t avail = 0, taken = 0, consumed = 0;
};

void set_err(char * err, size_t err_len, const char * msg) {
    if (err != nullptr && err_len > 0) {
        snprintf(err, err_len, "%s", msg);
    }
}

void log_cb(ggml_log_level level, const char * text, void * /* user */) {
    hydraLog((int) level, (char *) text);
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

int64_t hydra_state_save(hydra_io * io, struct llama_context * ctx, llama_seq_id seq, uintptr_t handle,
                         size_t chunk, int chunk_writer, char * err, size_t err_len) {
    save_writer w(io, handle, chunk, chunk_writer != 0);
    try {
        // As llama_state_seq_get_data: finish queued work before reading.
        llama_synchronize(ctx);
        llama_memory_t mem = llama_get_memory(ctx);
        if (mem != nullptr) {
            mem->state_write(w, seq, 0);
        }
        w.finish();
        return (int64_t) w.n_bytes();
    } catch (const std::exception & e) {
        w.abandon();
        set_err(err, err_len, e.what());
        return -1;
    }
}

int64_t hydra_state_load(struct llama_context * ctx, llama_seq_id seq, uintptr_t handle, char * err, size_t err_len) {
    load_reader r(handle);
    try {
        llama_synchronize(ctx);
        llama_memory_t mem = llama_get_memory(ctx);
        if (mem == nullptr) {
            throw std::runtime_error("the context has no memory module");
        }
        mem->state_read(r, seq, 0);
        return (int64_t) r.n_bytes();
    } catch (const std::exception & e) {
        set_err(err, err_len, e.what());
        return -1;
    }
}

void hydra_log_install(void) { llama_log_set(log_cb, nullptr); }

} // extern "C"
