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

// matrix reports whether t is one of the big matrices Config.Type sets:
// not a norm (all ones) nor a MoE router.
func (t tensor) matrix() bool {
	return t.scale != 0 && !strings.HasSuffix(t.name, ".ffn_gate_inp.weight")
}
