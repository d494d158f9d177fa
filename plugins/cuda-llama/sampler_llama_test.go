//go:build llama && cgo

package cudallama

import (
	"math"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// TestRepeatLastNClamped: a penalty window beyond the slot's context (which
// the host refuses, but the plugin must not trust) decodes as the whole
// sequence does, instead of llama.cpp allocating a ring of 2^31 tokens.
func TestRepeatLastNClamped(t *testing.T) {
	b := load(t, tiny(t), 1, nil)
	sp := iface.SamplerParams{RepeatPenalty: 1.5, FrequencyPenalty: 0.3, IgnoreEOS: true}
	var runs [][]int32
	for _, n := range []int32{-1, math.MaxInt32} {
		sp.RepeatLastN = n
		prefill(t, b, 0, story)
		toks, _ := decode(t, b, 0, 24, sp)
		runs = append(runs, toks)
	}
	if !slices.Equal(runs[0], runs[1]) {
		t.Errorf("repeat_last_n 2^31-1 decodes %v, the whole sequence (-1) %v", runs[1], runs[0])
	}
}
