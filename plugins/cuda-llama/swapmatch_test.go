package cudallama

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var weightNames = []string{"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight",
	"blk.10.ffn_gate_exps.weight", "output.weight"}

func TestMatchWeights(t *testing.T) {
	for _, c := range []struct {
		pattern string
		want    []int
	}{
		{`.*`, []int{0, 1, 2, 3, 4, 5}},
		{`ffn_.*_exps`, []int{2, 3, 4}},
		{`^blk\.1\.`, []int{3}},
		{`blk\.1`, []int{3, 4}}, // searched, not anchored
		{`blk\.(0|10)\.ffn_(up|gate)_exps`, []int{2, 4}},
		{`\d+\.attn`, []int{1}},
		{`nothing`, nil},
	} {
		got, err := matchWeights(c.pattern, weightNames)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("matchWeights(%q) = %v %v, want %v", c.pattern, got, err, c.want)
		}
	}
	for _, bad := range []string{`blk\.(0`, `(?=exps)`, `(a)\1`, `[z-a]`} {
		if _, err := matchWeights(bad, weightNames); err == nil || !strings.Contains(err.Error(), "not a regular expression") {
			t.Errorf("matchWeights(%q): %v, want it refused", bad, err)
		}
	}
}

// TestMatchWeightsPathological: a pattern std::regex backtracks on
// exponentially is matched in linear time, and 50,000 nested groups (which
// overflowed std::regex's stack) are refused by regexp's nesting limit.
func TestMatchWeightsPathological(t *testing.T) {
	names := make([]string, 0, 1000)
	for i := range 1000 {
		names = append(names, strings.Repeat("a", 40)+"_blk."+strings.Repeat("x", i%50))
	}
	start := time.Now()
	got, err := matchWeights(strings.Repeat("(.*)*", 12)+"!", names)
	if err != nil || len(got) != 0 {
		t.Errorf("(.*)*×12!: %v %v, want no match", got, err)
	}
	_, err = matchWeights(strings.Repeat("(", 50000)+"a"+strings.Repeat(")", 50000), names)
	if err == nil || !strings.Contains(err.Error(), "nest") || len(err.Error()) > 300 {
		t.Errorf("50,000 nested groups: %v, want refused for nesting, briefly", err)
	}
	t.Logf("(.*)*×12! over %d names: %v; 50,000 nested: %v", len(names), time.Since(start), err)
}
