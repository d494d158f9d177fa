//go:build llama && cgo

package cudallama

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// loadWeights checks the placement p against the model file and loads it
// with p's overrides; an override llama.cpp cannot use is a bad request,
// and a load llama.cpp refuses is llama.ErrLoad.
func loadWeights(path string, mp llama.ModelParams, p llamaopt.PlacementOptions) (llama.Model, error) {
	if err := checkMoELayers(path, p.NCPUMoE); err != nil {
		return llama.Model{}, err
	}
	for _, r := range p.Rules() {
		mp.Overrides = append(mp.Overrides, llama.Override{Pattern: r.Pattern, Device: r.Device})
	}
	m, err := llama.LoadModel(path, mp)
	if oe := (*llama.OverrideError)(nil); errors.As(err, &oe) {
		return llama.Model{}, fmt.Errorf("%w: placement (%s, %s): %s", iface.ErrBadRequest, llamaopt.OptOverrideTensor, llamaopt.OptNCPUMoE, oe.Msg)
	}
	return m, err
}

// checkMoELayers refuses n_cpu_moe beyond the model's layers before the
// model loads (its metadata is read in milliseconds; a load takes minutes).
func checkMoELayers(path string, nCPUMoE int) error {
	if nCPUMoE == 0 {
		return nil
	}
	if n := llama.GGUFBlockCount(path); n >= 0 && int64(nCPUMoE) > n {
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
func placements(m llama.Model, rules []llamaopt.PlacementRule) []tensorPlacement {
	patterns := make([]string, len(rules))
	for i, r := range rules {
		patterns[i] = r.Pattern
	}
	ruleOf := m.MatchRules(patterns)
	var out []tensorPlacement
	for i, t := range m.Tensors() {
		out = append(out, tensorPlacement{name: t.Name, buffer: t.Buffer, memory: t.Memory, rule: ruleOf[i]})
	}
	return out
}

// logPlacement reports, once the model is loaded, what each rule placed
// and where it landed, one line per rule, and warns of a rule that matched
// no weight (a pattern's typo would otherwise go unnoticed).
func logPlacement(m llama.Model, rules []llamaopt.PlacementRule) {
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
