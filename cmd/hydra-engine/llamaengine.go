package main

// The three parameters of llama-engine, the Hydra fork of llama-server that
// node configurations run (docs/llama-server.md, Moving a node from
// llama-engine): the fork's COMBINED mode, in which a head runs a model's
// expert weights on a peer engine's GPU through ggml's RPC backend.
//
//	--ggml-rpc-port PORT          the peer: serve this engine's GPUs as a ggml-RPC backend on PORT
//	--rpc-engine HOST:PORT        the head: the peer's ggml-RPC server
//	--combined-ot-pattern RE=DEV  the head: the weights (by name) combined mode puts on the peer
//
// Each is read and checked here, so that a configuration written for the
// fork starts instead of being refused. The llama plugin's combined mode
// runs the experts on a device of this host (combined_peer), not through a
// ggml-RPC server, so only the pattern has an option of the plugin's that
// means the same (combined_pattern, passed on); the ports are kept by the
// engine and said at start not to act yet, and a SET_EXPERT_MODE "combined"
// is answered "solo" with that reason in the log.

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// maxCombinedPattern bounds --combined-ot-pattern: the fork's is 37 bytes,
// and the plugin compiles it (Go's regexp), whose cost grows with it.
const maxCombinedPattern = 1024

// combinedDevice is what follows a pattern's last '=': a ggml buffer type
// name (CPU, CUDA1, RPC[host:port]), as the plugin reads the suffix.
var combinedDevice = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.:\[\]-]*$`)

func lsForkParams() []lsParam {
	return []lsParam{
		{names: []string{"--ggml-rpc-port"}, hint: "PORT", doc: "llama-engine's: serve this engine's GPUs to a COMBINED head over ggml RPC; checked, reported at start as not acting yet",
			apply: func(ls *lsArgs, v string) error {
				ls.ggmlRPCPort = v
				return portNumber(v, 1)
			}},
		{names: []string{"--rpc-engine"}, hint: "HOST:PORT", doc: "llama-engine's: the COMBINED peer's ggml-RPC server; checked, reported at start as not acting yet (SET_EXPERT_MODE combined answers solo)",
			apply: func(ls *lsArgs, v string) error {
				ls.rpcEngine = v
				return peerAddress(v)
			}},
		{names: []string{"--combined-ot-pattern"}, hint: "REGEX=DEVICE", doc: "llama-engine's: the weights COMBINED mode puts on the peer: combined_pattern",
			apply: func(ls *lsArgs, v string) error {
				if err := combinedPattern(v); err != nil {
					return err
				}
				ls.combinedPattern = v
				ls.setOpt("--combined-ot-pattern", llamaopt.OptCombinedPattern, v)
				return nil
			}},
	}
}

// peerAddress checks HOST:PORT: a host name or IP address (an IPv6 one in
// brackets) and a port number.
func peerAddress(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil || host == "" || strings.ContainsAny(host, " \t/") {
		return errors.New("want HOST:PORT, the peer's ggml-RPC server (its --ggml-rpc-port), e.g. localhost:9506")
	}
	if err := portNumber(port, 1); err != nil {
		return fmt.Errorf("port %q: %w", port, err)
	}
	return nil
}

// combinedPattern checks REGEX=DEVICE, the form of an --override-tensor
// entry: a regular expression, compiled with Go's regexp (RE2, whose
// matching takes time linear in the name; no backreferences or lookaround),
// then '=' and a device name.
func combinedPattern(v string) error {
	if len(v) > maxCombinedPattern {
		return fmt.Errorf("%d bytes: at most %d", len(v), maxCombinedPattern)
	}
	i := strings.LastIndexByte(v, '=')
	if i < 0 || !combinedDevice.MatchString(strings.TrimSpace(v[i+1:])) {
		return fmt.Errorf(`want REGEX=DEVICE, e.g. blk\.([0-9]+)\.ffn_.*_exps\.weight=CPU, as llama-engine takes it`)
	}
	re := strings.TrimSpace(v[:i])
	if re == "" {
		return errors.New("the regular expression before '=' is empty")
	}
	if _, err := regexp.Compile(re); err != nil {
		return fmt.Errorf("%q is not a regular expression (RE2 syntax, no backreferences or lookaround): %w", re, err)
	}
	return nil
}

// finishFork says at start, for each of the fork's parameters given, what
// it does here and what does not act yet, and records the reason a
// SET_EXPERT_MODE "combined" will be answered "solo".
func (ls *lsArgs) finishFork() {
	if ls.ggmlRPCPort != "" {
		ls.warnings = append(ls.warnings, fmt.Sprintf("llama-engine --ggml-rpc-port %s: not acting yet: this engine serves no ggml-RPC backend "+
			"(the fork's embedded server exposing this node's GPUs to a COMBINED head), and nothing listens on port %s; "+
			"a head using this node as its --rpc-engine peer stays solo (INFO: rpc_backend_active false)", ls.ggmlRPCPort, ls.ggmlRPCPort))
	}
	switch {
	case ls.rpcEngine != "":
		ls.combinedWhy = fmt.Sprintf("--rpc-engine %s is not acting yet: combined mode through a peer's ggml-RPC server is not implemented here "+
			"(the llama plugin's combined mode uses a device of this host, combined_peer)", ls.rpcEngine)
		ls.warnings = append(ls.warnings, "llama-engine "+ls.combinedWhy+
			"; SET_EXPERT_MODE combined answers solo and INFO advertises no combined capability")
		if ls.combinedPattern == "" {
			ls.warnings = append(ls.warnings, "llama-engine --rpc-engine without --combined-ot-pattern: llama-engine too runs solo-only then")
		}
	case ls.combinedPattern != "":
		ls.notes = append(ls.notes, fmt.Sprintf("llama-engine --combined-ot-pattern %s: no effect here: combined mode needs a peer "+
			"(--rpc-engine, as in llama-engine; the plugin's own: combined_peer)", ls.combinedPattern))
	}
	if ls.combinedPattern != "" && ls.rpcEngine != "" {
		ls.notes = append(ls.notes, fmt.Sprintf("llama-engine --combined-ot-pattern %s: passed to the plugin as %s, the weights its combined mode "+
			"would place on the peer; not acting while there is none", ls.combinedPattern, llamaopt.OptCombinedPattern))
	}
}
