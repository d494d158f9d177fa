//go:build llama && cgo

package cudallama

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

// TestSwapQuantPathologicalPatterns: patterns std::regex backtracked on
// exponentially or overflowed its stack on are answered at once (no match;
// nested beyond regexp's limit, refused), nothing moves, and the plugin
// swaps as before after them.
func TestSwapQuantPathologicalPatterns(t *testing.T) {
	b := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, swapOptions(t))
	weights := b.eng.Load().swap.weights()
	for _, tc := range []struct{ name, pattern, want string }{
		{"(.*)*×12!", strings.Repeat("(.*)*", 12) + "!", "matches none of the model's weights"},
		{"2,000 nested groups (within the host's 4 KiB)", strings.Repeat("(", 2000) + "a" + strings.Repeat(")", 2000), "nests too deeply"},
		{"50,000 nested groups", strings.Repeat("(", 50000) + "a" + strings.Repeat(")", 50000), "nests too deeply"},
	} {
		start := time.Now()
		_, err := b.SwapQuant(context.Background(), "q8", tc.pattern)
		took := time.Since(start)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 400 {
			t.Errorf("%s: %v, want a bad request saying %q, briefly", tc.name, err, tc.want)
		}
		t.Logf("%s: %v after %v", tc.name, err, took)
	}
	if !slices.Equal(b.eng.Load().swap.weights(), weights) {
		t.Error("refused patterns moved weights")
	}
	if res, err := b.SwapQuant(context.Background(), "q8", expertWeights); err != nil || res.Swapped == 0 {
		t.Fatalf("a swap after them: %+v %v", res, err)
	}
	prefill(t, b, 0, story)
}
