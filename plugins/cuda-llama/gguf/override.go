package gguf

import (
	"regexp"
	"strings"
)

// TypeOverride gives the big matrices whose names match Pattern the weight
// type Type. Values depend only on the seed and the tensor's name, so a
// model with overrides holds, for those matrices, exactly the bytes of the
// model written at Type: an oracle of a swap of those weights.
type TypeOverride struct {
	Pattern *regexp.Regexp // searched in the tensor's name
	Type    WeightType
}

// overridden applies the overrides to the big matrices of ts (norms and
// routers keep F32 whatever the overrides say, as llama.cpp's quantize keeps
// them).
func (c Config) overridden(ts []tensor) []tensor {
	for i, t := range ts {
		if !t.matrix() {
			continue
		}
		for _, o := range c.Overrides {
			if o.Pattern.MatchString(t.name) {
				ts[i].typ = o.Type.ggmlType()
				break
			}
		}
	}
	return ts
}

// matrix reports whether t is one of the big matrices Config.Type sets, by
// the rule of llama.cpp's quantize (which keeps the rest in F32): a weight
// of two or more dimensions, not a norm, a MoE router or a DeltaNet's
// small convolution.
func (t tensor) matrix() bool {
	return len(t.dims) >= 2 && strings.HasSuffix(t.name, ".weight") && !strings.HasSuffix(t.name, "_norm.weight") &&
		!strings.HasSuffix(t.name, ".ffn_gate_inp.weight") && !strings.HasSuffix(t.name, ".ssm_conv1d.weight")
}
