package llamaopt

import (
	"fmt"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Placement options: which memory holds which weights, through llama.cpp's
// tensor buffer type overrides (llama_model_params.tensor_buft_overrides),
// as llama-server's --override-tensor and --n-cpu-moe.
const (
	// OptOverrideTensor is PATTERN=DEVICE[,PATTERN=DEVICE…]: the weights
	// whose names match PATTERN (a regular expression searched in the name,
	// ECMAScript syntax, as llama.cpp reads it) are kept in DEVICE's memory,
	// DEVICE being a ggml buffer type name: CPU, CUDA0, CUDA1, …
	OptOverrideTensor = "override_tensor"
	// OptNCPUMoE keeps the expert weights of the first N layers in host
	// memory (llama-server's --n-cpu-moe); the rest follow n_gpu_layers.
	OptNCPUMoE = "n_cpu_moe"
)

// CPUDevice is the buffer type of host memory, the device n_cpu_moe names.
const CPUDevice = "CPU"

// PlacementRule keeps the weights whose names match pattern in device's
// memory.
type PlacementRule struct {
	Pattern, Device string
}

func (r PlacementRule) String() string { return r.Pattern + "=" + r.Device }

// PlacementOptions are the parsed placement options; the zero value places
// every weight where n_gpu_layers puts it.
type PlacementOptions struct {
	Overrides []PlacementRule // override_tensor, in its order
	NCPUMoE   int
}

// placementOptions are the options of this file, in the table.
var placementOptions = []option{
	{key: OptOverrideTensor, def: "none", doc: "PATTERN=DEVICE[,...]: weights whose names match stay in DEVICE's memory (llama-server's --override-tensor)",
		parse: parseOverrideTensor},
	{key: OptNCPUMoE, def: "0", doc: "the first N layers' expert weights stay in host memory (llama-server's --n-cpu-moe)",
		parse: intField(func(o *Options) *int { return &o.NCPUMoE }, 0, maxLayers)},
}

// maxLayers bounds n_cpu_moe before the model says how many layers it has.
const maxLayers = 1 << 16

// parseOverrideTensor reads PATTERN=DEVICE entries separated by commas, as
// llama-server splits them; a pattern may hold '=', the device cannot, so
// each entry is cut at its last one. Whether the device exists and the
// pattern compiles is for Load to say, with the devices ggml has.
func parseOverrideTensor(o *Options, key, v string) error {
	var rules []PlacementRule
	for entry := range strings.SplitSeq(v, ",") {
		entry = strings.TrimSpace(entry)
		i := strings.LastIndexByte(entry, '=')
		if i <= 0 || i == len(entry)-1 {
			return fmt.Errorf("%w: option %s: %q is not PATTERN=DEVICE (e.g. %s=%s, entries separated by commas)",
				iface.ErrBadRequest, key, entry, `blk\.[0-3]\.ffn_.*_exps`, CPUDevice)
		}
		rules = append(rules, PlacementRule{Pattern: entry[:i], Device: strings.TrimSpace(entry[i+1:])})
	}
	o.Overrides = rules
	return nil
}

// Rules are the overrides in the order llama.cpp tries them (the first
// pattern that matches a weight decides): override_tensor's, then
// n_cpu_moe's, so an explicit override wins.
func (p PlacementOptions) Rules() []PlacementRule {
	rules := append([]PlacementRule(nil), p.Overrides...)
	for i := range p.NCPUMoE {
		rules = append(rules, PlacementRule{Pattern: expertsPattern(i), Device: CPUDevice})
	}
	return rules
}

// expertsPattern matches layer i's expert weights, as llama.cpp's
// llm_ffn_exps_block_regex does for --n-cpu-moe (common/common.h): gate,
// up, down and fused gate_up experts, "_ch" variants included; the dot
// after the layer number keeps layer 1 from matching layer 10.
func expertsPattern(i int) string {
	return fmt.Sprintf(`blk\.%d\.ffn_(up|down|gate|gate_up)_(ch|)exps`, i)
}
