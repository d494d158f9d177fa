// C interface of statemem.cpp: what a sequence's state is made of, for every
// memory module whose serialisation the plugin streams, and the rules a
// restore's structure is checked against while it streams (shim.cpp).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

// A part of a sequence's state: llama.cpp's composite memories (sliding
// window, hybrid) write their caches' states one after another.
enum {
    HYDRA_PART_KV = 0,        // an attention KV cache: u32 n_stream, u32 cells, cell metas, rows
    HYDRA_PART_RECURRENT = 1, // a recurrent state: u32 cells, cell metas, R and S rows
};

// hydra_state_part is one part as sequence seq's state holds it now.
typedef struct {
    int32_t kind;
    uint32_t cell_meta; // bytes of one cell's metadata (pos, n_seq_id, [ext], seq ids of one sequence)
    uint32_t capacity;  // the cells the part's cache has (a sliding window's is smaller than n_ctx)
    uint32_t swa;       // 1: a sliding-window cache (it keeps only the window's cells)
    uint64_t bytes;     // the part's bytes in the state now
    uint64_t max_row;   // its largest tensor piece (a row of one cell)
    // The fields among its rows (a layer count, the V layout, each layer's
    // type and row size), which do not depend on the cells: fields[fields_off,
    // fields_off + n_fields) of hydra_state_parts's buffer; n_fields 0 with no
    // cells, with a KV stream per sequence, or where the buffer is full.
    uint32_t fields_off, n_fields;
} hydra_state_part;

// hydra_state_parts describes sequence seq's state in the order llama.cpp
// writes it, at most max parts, their rows' fields in fields (fields_cap
// bytes). Returns the count, or -1 with a message in err (a memory module
// the plugin does not know how to check).
int hydra_state_parts(struct llama_context * ctx, llama_seq_id seq, uint32_t n_stream, size_t size,
                      hydra_state_part * out, int max, uint8_t * fields, size_t fields_cap, char * err, size_t err_len);

// hydra_memory_name names the context's memory module ("kv", "iswa",
// "hybrid", "hybrid_iswa", "recurrent", or what it is not).
const char * hydra_memory_name(struct llama_context * ctx);

// hydra_part_rule is what a restore's part may hold: its bytes are base +
// cells × per_cell (cells > 0; empty bytes for none), its cell count within [min_cells, max_cells], its
// positions within [0, n_tokens) (a recurrent cell's: n_tokens − 1), and
// the fields among its rows exactly the n_fields bytes at fields (this
// model's, hydra_state_part's); with none (NULL, 0) they are not checked.
typedef struct {
    int32_t kind;
    uint32_t cell_meta;
    uint64_t base, per_cell, empty;
    uint32_t min_cells, max_cells;
    const uint8_t * fields;
    uint64_t n_fields;
} hydra_part_rule;

#ifdef __cplusplus
}
#endif
