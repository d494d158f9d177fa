//go:build llama && cgo

package cudallama

/*
#include <stdlib.h>
#include "placement.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// overrideList is llama.cpp's tensor_buft_overrides for a load, in C memory
// with the pattern strings it points to: llama.cpp keeps the pointers and
// reads them while llama_model_load_from_file runs, so the list is freed
// only after the load returns (nothing reads it later: the model keeps just
// whether there were overrides).
type overrideList struct {
	rules []llamaopt.PlacementRule
	list  *C.struct_llama_model_tensor_buft_override // len(rules)+1 entries, the last {NULL, NULL}
	strs  []*C.char                                  // the patterns and devices
}

// newOverrideList checks p against the model file and the devices ggml has
// and builds its override list; nil (no list) when p places nothing.
func newOverrideList(path string, p llamaopt.PlacementOptions) (*overrideList, error) {
	if err := checkMoELayers(path, p.NCPUMoE); err != nil {
		return nil, err
	}
	rules := p.Rules()
	if len(rules) == 0 {
		return nil, nil
	}
	o := &overrideList{rules: rules}
	patterns, devices := o.cStrings(func(r llamaopt.PlacementRule) string { return r.Pattern }), o.cStrings(func(r llamaopt.PlacementRule) string { return r.Device })
	o.list = (*C.struct_llama_model_tensor_buft_override)(C.malloc(C.size_t(len(rules)+1) * C.size_t(unsafe.Sizeof(C.struct_llama_model_tensor_buft_override{}))))
	var msg [512]C.char
	if C.hydra_placement_resolve(&patterns[0], &devices[0], C.size_t(len(rules)), o.list, &msg[0], C.size_t(len(msg))) < 0 {
		o.free()
		return nil, fmt.Errorf("%w: placement (%s, %s): %s", iface.ErrBadRequest, llamaopt.OptOverrideTensor, llamaopt.OptNCPUMoE, C.GoString(&msg[0]))
	}
	return o, nil
}

// cStrings copies one field of every rule into C memory o frees.
func (o *overrideList) cStrings(field func(llamaopt.PlacementRule) string) []*C.char {
	out := make([]*C.char, len(o.rules))
	for i, r := range o.rules {
		out[i] = C.CString(field(r))
		o.strs = append(o.strs, out[i])
	}
	return out
}

// params is the list for llama_model_params, nil for none.
func (o *overrideList) params() *C.struct_llama_model_tensor_buft_override {
	if o == nil {
		return nil
	}
	return o.list
}

func (o *overrideList) free() {
	if o == nil {
		return
	}
	C.free(unsafe.Pointer(o.list))
	for _, s := range o.strs {
		C.free(unsafe.Pointer(s))
	}
}

// checkMoELayers refuses n_cpu_moe beyond the model's layers before the
// model loads (its metadata is read in milliseconds; a load takes minutes).
func checkMoELayers(path string, nCPUMoE int) error {
	if nCPUMoE == 0 {
		return nil
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	if n := int64(C.hydra_gguf_block_count(cs)); n >= 0 && int64(nCPUMoE) > n {
		return fmt.Errorf("%w: option %s=%d: the model has %d layers", iface.ErrBadRequest, llamaopt.OptNCPUMoE, nCPUMoE, n)
	}
	return nil
}

// tensorPlacement is where a loaded model's weight is: the buffer holding
// it and its memory ("CPU" for host memory, else the device's name), and
// the index of the rule that placed it (-1: none).
type tensorPlacement struct {
	name, buffer, memory string
	rule                 int
}

// placements lists the model's weights and where they are, assigned to the
// rules as llama.cpp matched them.
func placements(m *C.struct_llama_model, rules []llamaopt.PlacementRule) []tensorPlacement {
	n := int(C.hydra_model_tensor_count(m))
	if n == 0 {
		return nil
	}
	ruleOf := assignRules(m, rules, n)
	out := make([]tensorPlacement, n)
	for i := range out {
		var name, buffer, memory *C.char
		C.hydra_model_tensor(m, C.size_t(i), &name, &buffer, &memory)
		out[i] = tensorPlacement{name: C.GoString(name), buffer: C.GoString(buffer), memory: C.GoString(memory), rule: int(ruleOf[i])}
	}
	return out
}

// assignRules is, for each of the model's n weights, the index of the rule
// that placed it, or -1.
func assignRules(m *C.struct_llama_model, rules []llamaopt.PlacementRule, n int) []C.int {
	ruleOf := make([]C.int, n)
	if len(rules) == 0 {
		for i := range ruleOf {
			ruleOf[i] = -1
		}
		return ruleOf
	}
	patterns := make([]*C.char, len(rules))
	for i, r := range rules {
		patterns[i] = C.CString(r.Pattern)
	}
	C.hydra_placement_assign(m, &patterns[0], C.size_t(len(rules)), &ruleOf[0])
	for _, s := range patterns {
		C.free(unsafe.Pointer(s))
	}
	return ruleOf
}

// logPlacement reports, once the model is loaded, what each rule placed
// and where it landed, one line per rule, and warns of a rule that matched
// no weight (a pattern's typo would otherwise go unnoticed).
func logPlacement(m *C.struct_llama_model, rules []llamaopt.PlacementRule) {
	if len(rules) == 0 {
		return
	}
	byRule := make([][]string, len(rules))
	for _, t := range placements(m, rules) {
		if t.rule >= 0 {
			byRule[t.rule] = append(byRule[t.rule], t.name+" in "+t.buffer)
		}
	}
	for i, r := range rules {
		if len(byRule[i]) == 0 {
			llamaLogText(logWarn, fmt.Sprintf("hydra: placement %s placed no weight of the model (no name matched, or an earlier rule took them)\n", r))
			continue
		}
		llamaLogText(logInfo, fmt.Sprintf("hydra: placement %s: %d weights: %s\n", r, len(byRule[i]), strings.Join(byRule[i], ", ")))
	}
}
