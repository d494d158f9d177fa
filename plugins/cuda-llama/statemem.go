//go:build llama && cgo

package cudallama

/*
#include <stdlib.h>
#include "statemem.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// maxStateParts bounds the parts of a state (a hybrid sliding-window model
// has three).
const maxStateParts = 4

// memoryName is llama.cpp's memory module (kv, iswa, hybrid, hybrid_iswa,
// recurrent), what a state's layout names.
func (c *lctx) memoryName() string { return C.GoString(C.hydra_memory_name(c.c)) }

// stateParts measures the parts of sequence seq's state.
func (c *lctx) stateParts(seq int) ([]measuredPart, error) {
	var parts [maxStateParts]C.hydra_state_part
	var msg [512]C.char
	n := C.hydra_state_parts(c.c, C.llama_seq_id(seq), C.uint32_t(c.nStream), C.size_t(c.StateSize(seq)),
		&parts[0], C.int(len(parts)), &msg[0], C.size_t(len(msg)))
	if n < 0 {
		return nil, fmt.Errorf("%s", C.GoString(&msg[0]))
	}
	out := make([]measuredPart, n)
	for i := range out {
		p := parts[i]
		out[i] = measuredPart{kind: partKind(p.kind), cellMeta: int64(p.cell_meta), capacity: int(p.capacity),
			swa: p.swa != 0, bytes: int64(p.bytes), maxRow: int64(p.max_row)}
	}
	return out, nil
}

// cRules is rules in C, for hydra_state_load; free it after the load.
func cRules(rules []partRule) (*C.hydra_part_rule, func()) {
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
