// C interface of shim.cpp: chunked streaming of a llama.cpp sequence's state
// through llama.cpp's internal llama_io_write_i / llama_io_read_i, and the log
// bridge. Plain C, so cgo can call it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "ggml-backend.h"
#include "llama.h"
#include "statemem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hydra_io hydra_io;

// hydra_io_new prepares state streaming. gpu is the first GPU device in use,
// or NULL on CPU: its host buffer type gives the pinned staging buffers, and
// KV tensors in its memory are read with async copies and events.
hydra_io * hydra_io_new(ggml_backend_dev_t gpu);

// hydra_io_pinned reports whether the staging buffers allocated so far are
// pinned (from the GPU's host buffer type).
int hydra_io_pinned(const hydra_io * io);

// hydra_io_streamed counts the K/V blocks restores have streamed (uploaded
// piece by piece), and in runs the runs of them llama.cpp read (one a block,
// or one per run of contiguous cells where it scatters a block).
uint64_t hydra_io_streamed(const hydra_io * io, uint64_t * runs);

// A sequence's state is saved in two passes. hydra_state_plan_new walks it
// as llama_state_seq_get_data does (the memory's serialisation after its
// 8-byte head: magic, source sequence id) and records the metadata written
// and the KV caches' ranges read, copying any other tensor's bytes (a
// recurrent state's cell moves when other sequences decode); from a cache of n_stream > 1 KV streams (one
// per sequence) it is recorded as one stream of size bytes, the sequence's
// own (what a one-stream cache writes; size is unused with one stream). The
// caller holds the context lock. NULL with a message in err on failure.
typedef struct hydra_state_plan hydra_state_plan;
hydra_state_plan * hydra_state_plan_new(struct llama_context * ctx, llama_seq_id seq, uint32_t n_stream, size_t size,
                                        char * err, size_t err_len);
void hydra_state_plan_free(hydra_state_plan * plan);

// hydra_state_plan_save writes the plan's bytes, reading the recorded
// ranges, in pieces of at most chunk bytes; it needs no context lock while
// the sequence's cells stay its own (its slot held, no cells moved). With
// chunk_writer 0 the pieces are staged in buffers the shim owns and handed
// to the Go callback hydraSaveDeliver; with 1 the Go side supplies each
// chunk buffer (hydraSaveBuffer) and the state is written straight into it.
// Returns the bytes produced, or -1 with a message in err.
int64_t hydra_state_plan_save(hydra_io * io, const hydra_state_plan * plan, uintptr_t handle, size_t chunk,
                              int chunk_writer, char * err, size_t err_len);

// hydra_state_load restores sequence seq from bytes the Go callback
// hydraLoadNext lends in place (the restore ring or the data plane's buffers,
// pinned on a GPU). With stream_min > 0, K/V runs of at least stream_min
// bytes are streamed: uploaded in pieces of at least piece_min bytes where
// the stream holds them, as they arrive. Returns the state bytes
// llama.cpp consumed, or -1 with a message in err; on failure the sequence
// may be half-restored and the caller must clear it. The state is one KV
// stream of size bytes, restored into sequence seq's own stream of a cache of
// n_stream. With one stream, the state's structure is checked against the
// n_rules rules of its parts (statemem.h) for a sequence of n_tokens as
// llama.cpp reads it, before it acts on a field.
//
// The caller holds the context lock. The restore lets it go
// (hydraLoadHold(handle, 0)) while it writes the rows of a KV part whose rule
// has its fields: they land in cells the part's metadata gave the sequence,
// which other sequences' decodes neither take nor read unmasked. It takes it
// back (hydraLoadHold(handle, 1)) before llama.cpp acts on anything else: the
// next part's metadata, a refusal (llama.cpp frees the cells), the return.
int64_t hydra_state_load(hydra_io * io, struct llama_context * ctx, llama_seq_id seq, uint32_t n_stream, size_t size,
                         uintptr_t handle, size_t stream_min, size_t piece_min,
                         const hydra_part_rule * rules, int n_rules, int32_t n_tokens, char * err, size_t err_len);

// hydra_log_install routes llama.cpp's and ggml's logs to the Go callback
// hydraLog.
void hydra_log_install(void);

#ifdef __cplusplus
}
#endif
