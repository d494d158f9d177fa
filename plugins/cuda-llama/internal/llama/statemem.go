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

// maxRowFields bounds the bytes of all parts' rows' fields: 12 a layer for K
// and for V, so 64 KiB is over a thousand layers.
const maxRowFields = 64 << 10

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
	// Fields is the fields among its rows (a layer count, the V layout, each
	// layer's type and row size), which do not depend on the cells; nil with
	// no cells or with a KV stream per sequence.
	Fields []byte
}

// PartRule is what a restore's part may hold, checked while the state
// streams in (shim.cpp's state_guard) before llama.cpp acts on a field: its
// bytes are Base + cells × PerCell (cells > 0; Empty for none), its cell
// count within [MinCells, MaxCells], its positions within the sequence's,
// the fields among its rows exactly Fields (StatePart.Fields; nil: not
// checked, and a KV part's rows are then written under the context lock).
type PartRule struct {
	Kind                 int
	CellMeta             int64
	Base, PerCell, Empty int64
	MinCells, MaxCells   int
	Fields               []byte
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
	fields := (*C.uint8_t)(C.malloc(maxRowFields))
	defer C.free(unsafe.Pointer(fields))
	n := C.hydra_state_parts(c.p, C.llama_seq_id(seq), C.uint32_t(c.nStream), C.size_t(c.StateSize(seq)),
		&parts[0], C.int(len(parts)), fields, maxRowFields, &msg[0], C.size_t(len(msg)))
	if n < 0 {
		return nil, fmt.Errorf("%s", C.GoString(&msg[0]))
	}
	all := unsafe.Slice((*byte)(unsafe.Pointer(fields)), maxRowFields)
	out := make([]StatePart, n)
	for i := range out {
		p := parts[i]
		out[i] = StatePart{Kind: int(p.kind), CellMeta: int64(p.cell_meta), Capacity: int(p.capacity),
			SWA: p.swa != 0, Bytes: int64(p.bytes), MaxRow: int64(p.max_row)}
		if p.n_fields > 0 {
			out[i].Fields = append([]byte(nil), all[p.fields_off:p.fields_off+p.n_fields]...)
		}
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
		if len(r.Fields) > 0 {
			cs[i].fields, cs[i].n_fields = (*C.uint8_t)(C.CBytes(r.Fields)), C.uint64_t(len(r.Fields))
		}
	}
	return p, func() {
		for i := range cs {
			C.free(unsafe.Pointer(cs[i].fields))
		}
		C.free(unsafe.Pointer(p))
	}
}
