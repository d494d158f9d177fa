//go:build llama && cgo

package cudallama

import (
	"cmp"
	"fmt"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Combined mode on one host: SET_EXPERT_MODE "combined" places the weights
// matching combined_pattern (the routed experts) on the peer device,
// copying them there on the first activation and keeping the copies, so
// that ggml's scheduler runs the operations reading them on the peer
// (operations follow their weights' buffers) while attention and the KV
// cache stay home; "solo" puts them back. Both are a swap of the weights'
// copies (swap.go), engine-wide, done only while every slot is idle.

// combinedConfig is the peer of combined mode as Load found it.
type combinedConfig struct {
	device    string // the peer, as ggml names it (as configured when absent)
	reachable bool   // the context runs on it
	pattern   string
	matches   int // weights the pattern matches
}

// setCombined resolves the peer device and checks the pattern. A pattern
// that does not compile fails Load; a peer the context does not run on (not
// on this host, or not a device llama.cpp uses), or a pattern matching no
// weight, leaves combined mode unavailable (it answers "solo", as the
// reference engine does without a peer) and says so in the log.
func (x *swapper) setCombined(lc *lctx, o llamaopt.CombinedOptions) error {
	if o.Peer == "" {
		return nil
	}
	c := combinedConfig{device: o.Peer, pattern: cmp.Or(o.Pattern, llamaopt.DefaultCombinedPattern)}
	hit, err := matchWeights(c.pattern, x.names)
	if err != nil {
		return fmt.Errorf("%w: option %s: %w", iface.ErrBadRequest, llamaopt.OptCombinedPattern, err)
	}
	n := len(hit)
	c.matches = n
	if name, err := x.sw.SetPeer(lc.binding(), o.Peer); err != nil {
		x.log.Warn("combined mode unavailable: "+err.Error(), llamaopt.OptCombinedPeer, o.Peer)
	} else {
		c.reachable, c.device = true, name
	}
	if n == 0 {
		x.log.Warn("combined mode unavailable: the pattern matches none of the model's weights", llamaopt.OptCombinedPattern, c.pattern)
	}
	x.combined = c
	return nil
}

// unavailable says why combined mode cannot be had, "" when it can.
func (x *swapper) unavailable() string {
	if x == nil {
		return "no peer is configured (" + llamaopt.OptCombinedPeer + ")"
	}
	switch c := x.combined; {
	case c.device == "":
		return "no peer is configured (" + llamaopt.OptCombinedPeer + ")"
	case !c.reachable:
		return "the peer device " + c.device + " is not one the context runs on"
	case c.matches == 0:
		return "the pattern " + c.pattern + " matches none of the model's weights"
	}
	return ""
}

// modeNow is the mode active.
func (x *swapper) modeNow() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.mode
}

// setExpertMode switches to mode and returns the mode really active: what
// it was when the switch cannot be made (no peer, the peer
// out of memory), the reason in the log, so a caller asking for "combined"
// learns from "solo" that it did not get it (the reference's fail-open).
func (e *engine) setExpertMode(mode string) string {
	x := e.swap
	current := "solo"
	if x != nil {
		current = x.modeNow()
	}
	if mode == current {
		return current
	}
	if why := x.unavailable(); mode == "combined" && why != "" {
		e.log.Info("expert mode stays solo: "+why, "requested", mode)
		return current
	}
	// Between two of the scheduler's steps: the experts' bytes are the same
	// wherever they sit, so busy slots decode on with them in their new
	// place, their sequences and logits kept (where the two devices' kernels
	// round alike, token for token as without the switch).
	start := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	place := placeHome
	if mode == "combined" {
		place = placePeer
	}
	res, err := x.apply(e.ctx.binding(), x.combined.pattern, keep, place)
	if err != nil {
		e.log.Warn("expert mode stays "+current+": "+err.Error(), "requested", mode, "peer", x.combined.device)
		return current
	}
	e.logApplied("expert mode "+mode, res, time.Since(start), "peer", x.combined.device, "pattern", x.combined.pattern)
	return x.modeNow()
}

// layerSplit is where the model's layers are, as INFO's layer_split and
// split_mode say it.
func layerSplit(m *model) (layers, mode string) {
	s := m.m.LayerSplit()
	return s.Runs, map[int]string{0: "none", 1: "layer", 2: "row"}[s.Mode]
}

// deviceMemory is a ggml device's free and total memory (bytes), ok false
// when there is no such device.
func deviceMemory(name string) (free, total int64, ok bool) { return llama.DeviceMemory(name) }
