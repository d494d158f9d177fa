package llamaopt

import (
	"errors"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// combined_peer takes ggml's device names and the reference's cuda:N;
// combined_pattern drops an =DEVICE suffix, as the reference does, but not
// an "=" inside the expression.
func TestCombinedOptions(t *testing.T) {
	for _, tc := range []struct{ peer, pattern, wantPeer, wantPattern string }{
		{"cuda:1", "", "CUDA1", ""},
		{"CUDA0", `blk\.\d+\.ffn_.*_exps=CUDA1`, "CUDA0", `blk\.\d+\.ffn_.*_exps`},
		{"cpu", `blk\.[0-3]\.ffn_.*_exps=RPC[10.0.0.2:50052]`, "cpu", `blk\.[0-3]\.ffn_.*_exps`},
		{"Vulkan:0", `ffn_(?=up)`, "VULKAN0", `ffn_(?=up)`},
	} {
		opts := map[string]string{OptCombinedPeer: tc.peer}
		if tc.pattern != "" {
			opts[OptCombinedPattern] = tc.pattern
		}
		o, err := Parse(opts)
		if err != nil || o.Peer != tc.wantPeer || o.Pattern != tc.wantPattern {
			t.Errorf("%v: peer %q, pattern %q, %v", opts, o.Peer, o.Pattern, err)
		}
	}
	for key, v := range map[string]string{OptCombinedPeer: " ", OptCombinedPattern: "=CUDA1"} {
		if _, err := Parse(map[string]string{key: v}); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), key) {
			t.Errorf("%s=%q: %v", key, v, err)
		}
	}
}
