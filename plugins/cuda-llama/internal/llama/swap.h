// C interface of swap.cpp: re-pointing a loaded model's weights to other
// copies of them — another quantisation of the same model (SWAP_QUANT) or
// a copy on a peer device (SET_EXPERT_MODE combined) — and rebuilding the
// context's graphs after. Plain C, so cgo can call it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// A weight's copy: where its bytes come from (source 0 is the loaded file,
// 1… the donors in the order added) and its place (home: where llama.cpp
// placed it; peer: on the peer device).
enum { HYDRA_HOME = 0, HYDRA_PEER = 1, HYDRA_KEEP = -1 };

struct hydra_swap;

// hydra_swap_new records the model's weights as llama.cpp placed them and
// indexes the loaded file (path) as source 0. use_mmap says whether
// weights in plain host memory may be used in place from a mapping of
// their file, as llama.cpp's own load with use_mmap does. NULL with the
// reason in err.
struct hydra_swap * hydra_swap_new(struct llama_model * model, const char * path, bool use_mmap, char * err, size_t err_len);

// hydra_swap_add_donor checks donor — the same model in another
// quantisation, loaded with no_alloc and the base's placement — against the
// base (architecture, weight names and shapes, in llama.cpp's order) and
// adds its file as the next source: the buffer type llama.cpp chose for each
// weight is kept, not the donor model, which the caller frees. Returns the
// source's index, or -1 with the first mismatch in err.
int hydra_swap_add_donor(struct hydra_swap * s, const struct llama_model * donor, const char * path, char * err, size_t err_len);

// hydra_swap_set_peer names the device combined mode places weights on
// (ggml device name, any case): one the context's scheduler runs, or the
// operations reading them could not be placed. -1 with the reason in err.
int hydra_swap_set_peer(struct hydra_swap * s, struct llama_context * ctx, const char * device, char * err, size_t err_len);

// What hydra_swap_apply did.
struct hydra_swap_result {
    int32_t swapped;    // weights matched, now re-pointed
    int64_t bytes;      // their bytes now
    int64_t allocated;  // bytes of the buffers this call allocated (kept for the next time)
    int64_t uploaded;   // bytes this call copied into them
    int64_t in_place;   // bytes this call bound in place from a mapped file
    int32_t stayed;     // of the weights asked onto the peer, those already in its buffer type
    int32_t ops;        // operations of the decode graph reading the matched weights
    int32_t ops_local;  // of them, those the scheduler runs on the device holding their weight
    int64_t upload_us, reset_us;
};

// hydra_swap_apply makes the weights idx names (n of them, indices as
// hydra_swap_weight numbers them, ascending: the caller matches the names,
// in Go's linear-time regexp) the copies of source src (HYDRA_KEEP: each
// keeps its own) at place (HYDRA_KEEP: each keeps its own), making copies it
// lacks (kept for good: swapping back and forth allocates nothing more),
// then rebuilds the context's graphs (a graph reused across moved weights
// would read freed or foreign memory). All or nothing: 0, or -1 with every
// weight as it was and the reason in err. Needs the context idle.
int hydra_swap_apply(struct hydra_swap * s, struct llama_context * ctx, const int32_t * idx, int32_t n, int src, int place,
                     struct hydra_swap_result * res, char * err, size_t err_len);

// hydra_swap_count is the number of weights, hydra_swap_weight weight i's
// name, source, place, the device holding it ("CPU" for host memory), its
// bytes now, and whether it is in the buffer llama.cpp loaded it into.
size_t hydra_swap_count(const struct hydra_swap * s);
void hydra_swap_weight(const struct hydra_swap * s, size_t i, const char ** name, int * src, int * place, const char ** device,
                       int64_t * bytes, int * loaded_buffer);

// hydra_swap_layout is weight i's layout now: ggml's name of its type, its
// ne (4 dimensions), and the address of its bytes (in device memory for a
// weight on a device).
void hydra_swap_layout(const struct hydra_swap * s, size_t i, const char ** type, int64_t ne[4], uintptr_t * data);

// hydra_swap_offset is where weight i's bytes are in source src's file.
int64_t hydra_swap_offset(const struct hydra_swap * s, int src, size_t i);

// hydra_swap_upload_us times copying source src's bytes of the weights idx
// names (n, ascending) from its mapping into a scratch buffer of each
// weight's home buffer type (freed after): the plain host-to-device copy an
// upload is measured against. -1 if idx is empty or not weights, or memory
// runs out.
int64_t hydra_swap_upload_us(struct hydra_swap * s, const int32_t * idx, int32_t n, int src);

// hydra_swap_resident is what the copies take: bytes of buffers allocated,
// and bytes bound in place from mapped files.
void hydra_swap_resident(const struct hydra_swap * s, int64_t * allocated, int64_t * mapped);

#ifdef __cplusplus
}
#endif
