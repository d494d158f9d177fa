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
	for _, r := range p.Rules() {
		mp.Overrides = append(mp.Overrides, llama.Override{Pattern: r.Pattern, Device: r.Device})
	}
	m, err := llama.LoadModel(path, mp)
	if oe := (*llama.OverrideError)(nil); errors.As(err, &oe) {
		return llama.Model{}, fmt.Errorf("%w: placement (%s, %s): %s", iface.ErrBadRequest, llamaopt.OptOverrideTensor, llamaopt.OptNCPUMoE, oe.Msg)
	}
	return m, err
}

// fitMoELayers makes n_cpu_moe beyond the model's blocks name every block,
// as llama-server applies it (its rules for blocks the model lacks match
// nothing), and says so; the metadata is read in milliseconds.
func fitMoELayers(path string, p *llamaopt.PlacementOptions) (note string) {
	if p.NCPUMoE == 0 {
		return ""
	}
	n := llama.GGUFBlockCount(path)
	if n < 0 || int64(p.NCPUMoE) <= n {
		return ""
	}
	note = fmt.Sprintf("option %s=%d: the model has %d blocks: every block's expert weights stay in host memory, as llama-server applies it",
		llamaopt.OptNCPUMoE, p.NCPUMoE, n)
	p.NCPUMoE = int(n)
	return note
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
