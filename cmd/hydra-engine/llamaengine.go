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
// The ports act as the fork's do, through combined mode between two engines
// of one host (host/combined): --ggml-rpc-port lends this engine's weights
// on 127.0.0.1:PORT (lend_weights; the fork listens on every address, but
// what is lent is of this host only), --rpc-engine follows that peer
// (combined_peer), and the pattern names the weights the plugin binds to
// the peer's (combined_pattern, the =DEVICE suffix dropped, as llama-engine
// does).

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
		{names: []string{"--ggml-rpc-port"}, hint: "PORT", doc: "llama-engine's: lend this engine's weights to a COMBINED head of this host on 127.0.0.1:PORT (lend_weights)",
			apply: func(ls *lsArgs, v string) error {
				if err := portNumber(v, 1); err != nil {
					return err
				}
				ls.ggmlRPCPort = v
				ls.set("--ggml-rpc-port", "lend_weights", net.JoinHostPort("127.0.0.1", v))
				return nil
			}},
		{names: []string{"--rpc-engine"}, hint: "HOST:PORT", doc: "llama-engine's: this engine is a COMBINED head of the peer lending its weights there, on this host (combined_peer)",
			apply: func(ls *lsArgs, v string) error {
				if err := peerAddress(v); err != nil {
					return err
				}
				ls.rpcEngine = v
				ls.set("--rpc-engine", "combined_peer", v)
				return nil
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

// finishFork says at start what the fork's parameters given do here.
func (ls *lsArgs) finishFork() {
	if ls.ggmlRPCPort != "" {
		ls.notes = append(ls.notes, fmt.Sprintf("llama-engine --ggml-rpc-port %s: lending this engine's weights to combined heads of this host on 127.0.0.1:%s "+
			"(llama-engine listens on every address; what is lent here is of this host only)", ls.ggmlRPCPort, ls.ggmlRPCPort))
	}
	switch {
	case ls.rpcEngine != "" && ls.combinedPattern == "":
		ls.warnings = append(ls.warnings, "llama-engine --rpc-engine without --combined-ot-pattern: the plugin's default pattern (the routed experts) names the weights bound to the peer's")
	case ls.rpcEngine == "" && ls.combinedPattern != "":
		ls.notes = append(ls.notes, fmt.Sprintf("llama-engine --combined-ot-pattern %s: no effect here without a peer (--rpc-engine, as in llama-engine)", ls.combinedPattern))
	case ls.rpcEngine != "":
		ls.notes = append(ls.notes, fmt.Sprintf("llama-engine --combined-ot-pattern %s: passed to the plugin as %s, the weights it binds to the peer's in combined mode",
			ls.combinedPattern, llamaopt.OptCombinedPattern))
	}
}
