package llamaopt

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Options of SET_EXPERT_MODE "combined": the routed experts' matrix
// products run on a peer device of this host.
const (
	// OptCombinedPeer is the peer device: a ggml device name (CUDA1, CPU,
	// any case) or the reference engine's spelling cuda:1.
	OptCombinedPeer = "combined_peer"
	// OptCombinedPattern is a regular expression (Go's regexp, RE2 syntax)
	// searched in the weights' names: those combined mode places on the
	// peer. An "=DEVICE" suffix, as in an override_tensor entry, is dropped.
	OptCombinedPattern = "combined_pattern"

	// DefaultCombinedPattern matches the routed experts of every layer.
	DefaultCombinedPattern = `blk\.\d+\.ffn_(up|down|gate)_exps`
)

// CombinedOptions are the parsed combined options; the zero value has no
// peer.
type CombinedOptions struct {
	Peer    string // ggml device name, "" none
	Pattern string // "" DefaultCombinedPattern
}

// combinedOptions are the options of this file, in the table.
var combinedOptions = []option{
	{key: OptCombinedPeer, def: "none", doc: `the device SET_EXPERT_MODE "combined" runs the experts on: CUDA1, cuda:1, CPU`,
		parse: parseCombinedPeer},
	{key: OptCombinedPattern, def: `blk\.\d+\.ffn_(up|down|gate)_exps`, doc: "the weights combined mode moves (Go regexp, searched in the name; an =DEVICE suffix is dropped)",
		parse: parseCombinedPattern},
}

// deviceSpelling is the reference's DEVICE:N (cuda:1), which ggml names
// DEVICEN (CUDA1).
var deviceSpelling = regexp.MustCompile(`^([A-Za-z]+):([0-9]+)$`)

func parseCombinedPeer(o *Options, key, v string) error {
	if v == "" {
		return fmt.Errorf("%w: option %s: needs a device (CUDA1, cuda:1, CPU)", iface.ErrBadRequest, key)
	}
	if m := deviceSpelling.FindStringSubmatch(v); m != nil {
		v = strings.ToUpper(m[1]) + m[2]
	}
	o.Peer = v
	return nil
}

// deviceSuffix is what follows a pattern's last "=" when it names a device
// (CUDA1, RPC[host:port]) rather than continues the expression.
var deviceSuffix = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.:\[\]-]*$`)

func parseCombinedPattern(o *Options, key, v string) error {
	if i := strings.LastIndexByte(v, '='); i >= 0 && deviceSuffix.MatchString(strings.TrimSpace(v[i+1:])) {
		v = strings.TrimSpace(v[:i])
	}
	if v == "" {
		return fmt.Errorf("%w: option %s: needs a regular expression (default %s)", iface.ErrBadRequest, key, DefaultCombinedPattern)
	}
	o.Pattern = v
	return nil
}
