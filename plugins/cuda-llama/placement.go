package cudallama

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

// placementRule keeps the weights whose names match pattern in device's
// memory.
type placementRule struct {
	pattern, device string
}

func (r placementRule) String() string { return r.pattern + "=" + r.device }

// placementOptions are the parsed placement options; the zero value places
// every weight where n_gpu_layers puts it.
type placementOptions struct {
	overrides []placementRule // override_tensor, in its order
	nCPUMoE   int
}

// placementParsers are the options of this file, merged into optionParsers.
var placementParsers = map[string]optionParser{
	OptOverrideTensor: parseOverrideTensor,
	OptNCPUMoE:        intField(func(o *options) *int { return &o.nCPUMoE }, 0, maxLayers),
}

// maxLayers bounds n_cpu_moe before the model says how many layers it has.
const maxLayers = 1 << 16

// parseOverrideTensor reads PATTERN=DEVICE entries separated by commas, as
// llama-server splits them; a pattern may hold '=', the device cannot, so
// each entry is cut at its last one. Whether the device exists and the
// pattern compiles is for Load to say, with the devices ggml has.
func parseOverrideTensor(o *options, key, v string) error {
	var rules []placementRule
	for entry := range strings.SplitSeq(v, ",") {
		entry = strings.TrimSpace(entry)
		i := strings.LastIndexByte(entry, '=')
		if i <= 0 || i == len(entry)-1 {
			return fmt.Errorf("%w: option %s: %q is not PATTERN=DEVICE (e.g. %s=%s, entries separated by commas)",
				iface.ErrBadRequest, key, entry, `blk\.[0-3]\.ffn_.*_exps`, CPUDevice)
		}
		rules = append(rules, placementRule{pattern: entry[:i], device: strings.TrimSpace(entry[i+1:])})
	}
	o.overrides = rules
	return nil
}

// rules are the overrides in the order llama.cpp tries them (the first
// pattern that matches a weight decides): override_tensor's, then
// n_cpu_moe's, so an explicit override wins.
func (p placementOptions) rules() []placementRule {
	rules := append([]placementRule(nil), p.overrides...)
	for i := range p.nCPUMoE {
		rules = append(rules, placementRule{pattern: expertsPattern(i), device: CPUDevice})
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
