//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "statemem.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// A state's part kinds (statemem.h's HYDRA_PART_*).
const (
	PartKV        = C.HYDRA_PART_KV        // an attention KV cache
	PartRecurrent = C.HYDRA_PART_RECURRENT // a recurrent state
)

// maxStateParts bounds the parts of a state (a hybrid sliding-window model
// has three).
const maxStateParts = 4

// StatePart is one part of a sequence's state as it is now: llama.cpp's
// composite memories (sliding window, hybrid) write their caches' states one
// after another.
type StatePart struct {
	Kind     int   // PartKV or PartRecurrent
	CellMeta int64 // bytes of one cell's metadata
	Capacity int   // the cells the part's cache has (a sliding window's is smaller than n_ctx)
	SWA      bool  // a sliding-window cache (it keeps only the window's cells)
	Bytes    int64 // the part's bytes in the state now
	MaxRow   int64 // its largest tensor piece (a row of one cell)
}

// PartRule is what a restore's part may hold, checked while the state
// streams in (shim.cpp's state_guard) before llama.cpp acts on a field: its
// bytes are Base + cells × PerCell (cells > 0; Empty for none), its cell
// count within [MinCells, MaxCells], its positions within the sequence's.
type PartRule struct {
	Kind                 int
	CellMeta             int64
	Base, PerCell, Empty int64
	MinCells, MaxCells   int
}

// MemoryName is llama.cpp's memory module (kv, iswa, hybrid, hybrid_iswa,
// recurrent), what a state's layout names.
func (c *Context) MemoryName() string { return C.GoString(C.hydra_memory_name(c.p)) }

// StateParts measures the parts of sequence seq's state, in the order
// llama.cpp writes them; an error where the plugin does not know how to
// check the memory module's state.
func (c *Context) StateParts(seq int) ([]StatePart, error) {
	var parts [maxStateParts]C.hydra_state_part
	var msg [512]C.char
	n := C.hydra_state_parts(c.p, C.llama_seq_id(seq), C.uint32_t(c.nStream), C.size_t(c.StateSize(seq)),
		&parts[0], C.int(len(parts)), &msg[0], C.size_t(len(msg)))
	if n < 0 {
		return nil, fmt.Errorf("%s", C.GoString(&msg[0]))
	}
	out := make([]StatePart, n)
	for i := range out {
		p := parts[i]
		out[i] = StatePart{Kind: int(p.kind), CellMeta: int64(p.cell_meta), Capacity: int(p.capacity),
			SWA: p.swa != 0, Bytes: int64(p.bytes), MaxRow: int64(p.max_row)}
	}
	return out, nil
}

// cRules is rules in C, for hydra_state_load; free it after the load.
func cRules(rules []PartRule) (*C.hydra_part_rule, func()) {
	if len(rules) == 0 {
		return nil, func() {}
	}
	p := (*C.hydra_part_rule)(C.calloc(C.size_t(len(rules)), C.size_t(unsafe.Sizeof(C.hydra_part_rule{}))))
	cs := unsafe.Slice(p, len(rules))
	for i, r := range rules {
		cs[i] = C.hydra_part_rule{kind: C.int32_t(r.Kind), cell_meta: C.uint32_t(r.CellMeta), base: C.uint64_t(r.Base),
			per_cell: C.uint64_t(r.PerCell), empty: C.uint64_t(r.Empty), min_cells: C.uint32_t(r.MinCells), max_cells: C.uint32_t(r.MaxCells)}
	}
	return p, func() { C.free(unsafe.Pointer(p)) }
}
