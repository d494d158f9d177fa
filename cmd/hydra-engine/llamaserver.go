package main

// llama-server's command line on hydra-engine (docs/llama-server.md). A
// Hydra node agent starts its engine as `BINARY --host H --port P
// --rpc-port R --KEY VALUE …` from a configuration written for
// llama-server, whose flags collide with the engine's own (--slots is a
// count here and a switch there), so that command line is read in a mode of
// its own: `hydra-engine llama-server …`, or an executable named
// llama-server or llama-engine (the Hydra fork's binary). Each parameter is honoured with llama-server's meaning,
// mapped onto the engine's settings and the llama plugin's options, or
// accepted with one log line saying why it has no effect here; any other is
// refused, as llama-server refuses it. The HYDRA_* variables and the file
// HYDRA_CONFIG names still apply beneath the command line.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// llamaServerCommand is the subcommand, and the executable name, that reads
// llama-server's command line.
const llamaServerCommand = "llama-server"

// llamaEngineCommand reads it too: the name of the Hydra fork's binary
// (llama-server's parameters and three of its own), which node
// configurations run, so that an operator can put this engine in its place
// without changing the configuration.
const llamaEngineCommand = "llama-engine"

// isLlamaServerName reports whether name (an executable's base name or a
// subcommand) selects llama-server's command line.
func isLlamaServerName(name string) bool {
	return name == llamaServerCommand || name == llamaEngineCommand
}

// parseCommandLine parses argv: llama-server's command line when the
// executable is named llama-server or llama-engine, or the first argument
// is one of those subcommands, the engine's flags otherwise.
func parseCommandLine(argv []string, getenv func(string) (string, bool), stderr io.Writer) (*invocation, error) {
	switch {
	case len(argv) > 0 && isLlamaServerName(filepath.Base(argv[0])):
		return parseLlamaServer(argv[1:], getenv, stderr)
	case len(argv) > 1 && isLlamaServerName(argv[1]):
		return parseLlamaServer(argv[2:], getenv, stderr)
	case len(argv) > 0:
		return parseInvocation(argv[1:], getenv, stderr)
	}
	return parseInvocation(nil, getenv, stderr)
}

// llamaServerBackend is the plugin this mode runs unless HYDRA_BACKEND or
// the file names another: llama-server's models are llama.cpp's.
const llamaServerBackend = "cuda-llama"

// The stop a node agent gives its engine: hydra-head sends SIGTERM and
// SIGKILLs the engine nodeAgentStopWait later (internal/process/manager.go),
// so this mode's shutdown grace leaves room, within that, for the cut HTTP
// requests to end (httpCutWait) and for the plugin to exit on its own before
// it is killed with its process group (go-plugin waits pluginExitWait).
const (
	nodeAgentStopWait        = 10 * time.Second
	pluginExitWait           = 2 * time.Second
	llamaServerShutdownGrace = 5 * time.Second
)

// parseLlamaServer builds the configuration from llama-server's command
// line over the defaults, the file HYDRA_CONFIG names and the HYDRA_*
// variables.
func parseLlamaServer(args []string, getenv func(string) (string, bool), stderr io.Writer) (*invocation, error) {
	ls, err := readLlamaServerArgs(args)
	if err != nil {
		return nil, err
	}
	if ls.help {
		printLlamaServerHelp(stderr)
		return nil, flag.ErrHelp
	}
	inv := &invocation{cfg: defaultConfig(), sources: map[string]string{}, showVersion: ls.version, printConfig: ls.printConfig}
	for _, st := range settings {
		inv.sources[st.key] = "default"
	}
	inv.cfg.Backend, inv.sources["backend"] = llamaServerBackend, "default (llama-server mode)"
	// llama-server opens no port beside HTTP: Hydra RPC listens only where
	// --rpc-port (or HYDRA_RPC, the file) says, so that two engines on one
	// host do not collide on a port nobody asked for.
	inv.cfg.RPC, inv.sources["rpc"] = nil, "default (llama-server mode: none without --rpc-port)"
	inv.cfg.ShutdownGrace, inv.sources["shutdown_grace"] = llamaServerShutdownGrace, "default (llama-server mode: within the node agent's 10s)"
	inv.cfg.llamaServer = true
	configFile, _ := getenv(envConfigFile)
	if err := inv.applyFile(configFile, getenv); err != nil {
		return nil, err
	}
	if err := inv.applyEnv(getenv); err != nil {
		return nil, err
	}
	if err := inv.apply(ls.layer(), ls.source, false); err != nil {
		return nil, fmt.Errorf("llama-server parameters: %w", err)
	}
	splitByDefault(inv)
	cacheByDefault(inv)
	if err := inv.cfg.validate(); err != nil {
		return nil, err
	}
	if ls.presets != nil {
		if inv.cfg.presets, err = presetsOf(*ls.presets, inv.cfg.BackendOpts); err != nil {
			return nil, err
		}
	}
	inv.notes, inv.warnings = ls.notes, ls.warnings
	if stop := inv.cfg.ShutdownGrace + httpCutWait + pluginExitWait; stop > nodeAgentStopWait {
		inv.warnings = append(inv.warnings, fmt.Sprintf("shutdown_grace %s (%s): a node agent that sends SIGTERM kills the engine "+
			"%s later (hydra-head does), before the grace, the cut requests' %s and the plugin's exit (up to %s) are over; "+
			"leave it at llama-server mode's %s or keep it at most %s", inv.cfg.ShutdownGrace, inv.sources["shutdown_grace"],
			nodeAgentStopWait, httpCutWait, pluginExitWait, llamaServerShutdownGrace, nodeAgentStopWait-httpCutWait-pluginExitWait))
	}
	if len(inv.cfg.RPC) == 0 {
		inv.notes = append(inv.notes, "llama-server mode: no Hydra RPC listener: none is opened without --rpc-port (or HYDRA_RPC)")
	}
	return inv, nil
}

// llamaEnvNotes are the start-up lines for the LLAMA_* variables in environ
// (KEY=VALUE entries): llama-server reads its parameters from such
// variables (LLAMA_ARG_*, and older ones like LLAMA_CHAT_TEMPLATE_KWARGS),
// this mode only from the command line, and the plugin is not given them,
// so each one present is said to have no effect rather than passed over.
// The values are not logged: LLAMA_API_KEY holds a key.
func llamaEnvNotes(environ []string) []string {
	var notes []string
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "LLAMA_") {
			notes = append(notes, fmt.Sprintf("environment %s: no effect here: llama-server mode reads llama-server's parameters "+
				"from the command line only, not from LLAMA_* variables (llama-server too takes a parameter given there over its variable)", k))
		}
	}
	slices.Sort(notes)
	return notes
}

// splitByDefault gives the llama plugin llama-server's default KV layout:
// --ctx-size split between the slots unless --kv-unified (the plugin's own
// default is one shared pool).
func splitByDefault(inv *invocation) {
	if inv.cfg.Backend != llamaServerBackend {
		return
	}
	if _, ok := inv.cfg.BackendOpts[llamaopt.OptKVUnified]; !ok {
		if inv.cfg.BackendOpts == nil {
			inv.cfg.BackendOpts = map[string]string{}
		}
		inv.cfg.BackendOpts[llamaopt.OptKVUnified] = "false"
	}
}

// llamaServerCacheRAM is llama-server's --cache-ram default, in MiB.
const llamaServerCacheRAM = "8192"

// cacheByDefault gives the llama plugin llama-server's prompt cache when
// --cache-ram is not given (the plugin's own default is none).
func cacheByDefault(inv *invocation) {
	if inv.cfg.Backend != llamaServerBackend {
		return
	}
	if _, ok := inv.cfg.BackendOpts[llamaopt.OptCacheRAM]; !ok {
		if inv.cfg.BackendOpts == nil {
			inv.cfg.BackendOpts = map[string]string{}
		}
		inv.cfg.BackendOpts[llamaopt.OptCacheRAM] = llamaServerCacheRAM
	}
}

// lsArgs is a llama-server command line as it is read: the engine
// settings, backend options and sampler defaults it sets, and the notes to
// log at start.
type lsArgs struct {
	settings map[string]any    // configuration keys
	opts     map[string]string // backend_opts
	sampler  map[string]string
	setBy    map[string][]string // configuration key → the parameters that set it
	host     string
	port     string
	rpcPort  string
	notes    []string
	warnings []string        // notes at WARN: what was asked for and does not act yet
	noted    map[string]bool // parameters whose no-effect line is in notes

	// llama-engine's parameters (llamaengine.go).
	ggmlRPCPort, rpcEngine, combinedPattern string

	presets *presetFile // --models-preset, read

	help, version, printConfig bool
}

// readLlamaServerArgs reads the arguments as llama-server does: --key VALUE
// or --key=VALUE, '_' read as '-' in long names, a switch bare or followed
// by a boolean, --no-KEY turning one off. No positional arguments.
func readLlamaServerArgs(args []string) (*lsArgs, error) {
	ls := &lsArgs{settings: map[string]any{}, opts: map[string]string{}, sampler: map[string]string{},
		setBy: map[string][]string{}, noted: map[string]bool{}}
	for i := 0; i < len(args); i++ {
		name, value, hasValue := splitLlamaArg(args[i])
		p, negated := lookupLlamaParam(name)
		if p == nil {
			return nil, unknownLlamaArg(args[i])
		}
		value, used, err := p.valueOf(name, value, hasValue, negated, args[i+1:])
		if err != nil {
			return nil, err
		}
		i += used
		if err := ls.use(p, name, value); err != nil {
			return nil, fmt.Errorf("llama-server %s %s: %w", name, value, err)
		}
	}
	ls.finish()
	return ls, nil
}

// splitLlamaArg splits --key=value and reads '_' in a long name as '-'.
func splitLlamaArg(a string) (name, value string, hasValue bool) {
	name, value, hasValue = strings.Cut(a, "=")
	if strings.HasPrefix(name, "--") {
		name = strings.ReplaceAll(name, "_", "-")
	}
	return name, value, hasValue
}

func unknownLlamaArg(a string) error {
	if !strings.HasPrefix(a, "-") {
		return fmt.Errorf("llama-server: unexpected argument %q: llama-server takes no positional arguments (a value with no parameter before it?)", a)
	}
	return fmt.Errorf("llama-server: unknown parameter %s: not one llama-server mode knows (hydra-engine %s --help lists them; docs/llama-server.md)",
		a, llamaServerCommand)
}

// lsKind says how a parameter takes its value.
type lsKind int

const (
	lsValue  lsKind = iota // --key VALUE
	lsSwitch               // --key [BOOL], --no-key
)

// lsParam is one llama-server parameter this mode knows.
type lsParam struct {
	names []string // llama-server's spellings, the long one first
	neg   []string // a switch's off spellings
	kind  lsKind
	hint  string // the value, for --help
	bare  string // a value's default when none follows ("": one is required)
	doc   string // what it becomes here, for --help
	// apply honours the parameter; nil means it has no effect here, why
	// says why (the startup log line).
	apply func(ls *lsArgs, v string) error
	why   string
}

// valueOf is the parameter's value and how many of the following
// arguments it took.
func (p *lsParam) valueOf(name, value string, hasValue, negated bool, rest []string) (string, int, error) {
	if p.kind == lsSwitch {
		return switchValue(name, value, hasValue, negated, rest)
	}
	switch {
	case hasValue:
		return value, 0, nil
	case len(rest) > 0 && (p.bare == "" || !strings.HasPrefix(rest[0], "-") || rest[0] == "-1"):
		return rest[0], 1, nil
	case p.bare != "":
		return p.bare, 0, nil
	}
	return "", 0, fmt.Errorf("llama-server %s: expects a value (%s %s)", name, name, p.hint)
}

// switchValue is "true" or "false": bare on, --no- off, and a boolean
// given with = or as the next argument (the node agent writes false that
// way) taken for its word.
func switchValue(name, value string, hasValue, negated bool, rest []string) (string, int, error) {
	on, used := !negated, 0
	switch {
	case hasValue:
		b, ok := llamaBool(value)
		if !ok {
			return "", 0, fmt.Errorf("llama-server %s=%s: want a boolean (on, off, true, false, 1, 0, enabled, disabled)", name, value)
		}
		on = b != negated
	case !negated && len(rest) > 0:
		if b, ok := llamaBool(rest[0]); ok {
			on, used = b, 1
		}
	}
	return strconv.FormatBool(on), used, nil
}

// llamaBool reads llama.cpp's boolean words (common_arg_utils' truthy and
// falsey), in any case.
func llamaBool(v string) (value, ok bool) {
	switch strings.ToLower(v) {
	case "on", "enabled", "true", "1":
		return true, true
	case "off", "disabled", "false", "0":
		return false, true
	}
	return false, false
}

// use honours the parameter or notes that it has no effect.
func (ls *lsArgs) use(p *lsParam, name, value string) error {
	if p.apply != nil {
		return p.apply(ls, value)
	}
	given := name
	switch {
	case p.kind == lsValue:
		given += " " + value
	case value == "false" && !slices.Contains(p.neg, name):
		given += " false"
	}
	ls.note(p, given, p.why)
	return nil
}

// note adds p's line to the notes, once.
func (ls *lsArgs) note(p *lsParam, given, why string) {
	if ls.noted[p.names[0]] {
		return
	}
	ls.noted[p.names[0]] = true
	ls.notes = append(ls.notes, fmt.Sprintf("llama-server %s: no effect here: %s", given, why))
}

// finish turns the listener parameters into settings and notes the
// placement asked for. llama-server always serves HTTP, on 127.0.0.1:8080
// unless told otherwise; Hydra RPC (--rpc-port) listens on the same host.
func (ls *lsArgs) finish() {
	host, port := ls.host, ls.port
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "8080"
	}
	ls.settings["http"] = net.JoinHostPort(host, port)
	ls.setBy["http"] = append(ls.setBy["http"], "--host", "--port")
	if ls.rpcPort != "" {
		ls.settings["rpc"] = []string{"tcp://" + net.JoinHostPort(host, ls.rpcPort)}
		ls.setBy["rpc"] = append(ls.setBy["rpc"], "--host", "--rpc-port")
	}
	var placed []string
	for _, k := range []string{llamaopt.OptNGPULayers, llamaopt.OptNCPUMoE, llamaopt.OptOverrideTensor} {
		if v, ok := ls.opts[k]; ok {
			placed = append(placed, k+"="+v)
		}
	}
	if len(placed) > 0 {
		ls.notes = append(ls.notes, "llama-server placement: "+strings.Join(placed, " ")+
			" (the plugin logs, at debug level, the weights each rule placed and where)")
	}
	ls.finishFork()
}

// layer is the configuration layer the command line makes.
func (ls *lsArgs) layer() map[string]any {
	layer := map[string]any{}
	for k, v := range ls.settings {
		layer[k] = v
	}
	if len(ls.opts) > 0 {
		layer["backend_opts"] = ls.opts
	}
	if len(ls.sampler) > 0 {
		layer["sampler"] = ls.sampler
	}
	return layer
}

// source names, for --print-config, the parameters that set key.
func (ls *lsArgs) source(key string) string {
	by := slices.Compact(slices.Sorted(slices.Values(ls.setBy[key])))
	return "llama-server " + strings.Join(by, ", ")
}

// set records a configuration setting.
func (ls *lsArgs) set(param, key string, v any) {
	ls.settings[key] = v
	ls.setBy[key] = append(ls.setBy[key], param)
}

// setOpt records a backend option.
func (ls *lsArgs) setOpt(param, key, v string) {
	ls.opts[key] = v
	ls.setBy["backend_opts"] = append(ls.setBy["backend_opts"], param)
}

// setSampler records a sampler default.
func (ls *lsArgs) setSampler(param, key, v string) {
	ls.sampler[key] = v
	ls.setBy["sampler"] = append(ls.setBy["sampler"], param)
}

// lookupLlamaParam finds the parameter a spelling names, and whether it
// is a switch's off spelling.
func lookupLlamaParam(name string) (*lsParam, bool) {
	e, ok := llamaParamIndex()[name]
	return e.p, ok && e.negated
}

type lsEntry struct {
	p       *lsParam
	negated bool
}

var llamaParamIndex = sync.OnceValue(func() map[string]lsEntry {
	idx := map[string]lsEntry{}
	params := llamaServerParams()
	for i := range params {
		p := &params[i]
		for _, n := range p.names {
			idx[n] = lsEntry{p: p}
		}
		for _, n := range p.neg {
			idx[n] = lsEntry{p: p, negated: true}
		}
	}
	return idx
})

// printLlamaServerHelp lists the parameters and what each does here.
func printLlamaServerHelp(w io.Writer) {
	fmt.Fprintf(w, "usage: hydra-engine %s [llama-server parameters]\n\n"+
		"llama-server's command line on hydra-engine: each parameter is honoured with llama-server's meaning\n"+
		"or accepted with a log line saying why it has no effect here; others are refused. HYDRA_* variables\n"+
		"and the file HYDRA_CONFIG names apply beneath. The table with the reasons: docs/llama-server.md.\n"+
		"Also read under the name %s. Listeners: HTTP always (default 127.0.0.1:8080); Hydra RPC only with\n"+
		"--rpc-port (or HYDRA_RPC). On SIGTERM, requests in progress get %s (HYDRA_SHUTDOWN_GRACE), then are cut,\n"+
		"so that the engine and its plugin are gone within a node agent's %s.\n\n",
		llamaServerCommand, llamaEngineCommand, llamaServerShutdownGrace, nodeAgentStopWait)
	for _, p := range llamaServerParams() {
		spell := strings.Join(append(slices.Clone(p.names), p.neg...), ", ")
		if p.hint != "" {
			spell += " " + p.hint
		}
		doc := p.doc
		if p.apply == nil {
			doc = "no effect here: " + p.why
		}
		fmt.Fprintf(w, "  %s\n        %s\n", spell, doc)
	}
}

// The parameters, in docs/llama-server.md's order.
func llamaServerParams() []lsParam {
	return slices.Concat(lsListenerParams(), lsModelParams(), lsPlacementParams(), lsSpecParams(), lsChatParams(), lsEmbeddingParams(),
		lsSamplingParams(), lsServerParams(), lsForkParams())
}

func lsListenerParams() []lsParam {
	return []lsParam{
		{names: []string{"--host"}, hint: "HOST", doc: "the HTTP listener's address, and Hydra RPC's (default 127.0.0.1)", apply: func(ls *lsArgs, v string) error {
			if strings.HasSuffix(v, ".sock") {
				return errors.New("HTTP on a Unix socket is not served here: give an IP address (Hydra RPC's Unix sockets: HYDRA_RPC)")
			}
			ls.host = v
			return nil
		}},
		{names: []string{"--port"}, hint: "PORT", doc: "the HTTP listener's port (default 8080): http", apply: func(ls *lsArgs, v string) error {
			ls.port = v
			return portNumber(v, 0)
		}},
		{names: []string{"--rpc-port"}, hint: "PORT", doc: "Hydra RPC on tcp://HOST:PORT (not llama-server's): rpc; without it, no Hydra RPC listener", apply: func(ls *lsArgs, v string) error {
			ls.rpcPort = v
			return portNumber(v, 1)
		}},
		{names: []string{"--api-key"}, hint: "KEY[,KEY…]", doc: "HTTP API keys, comma-separated or repeated: api_key", apply: func(ls *lsArgs, v string) error {
			keys, _ := ls.settings["api_key"].([]string)
			ls.set("--api-key", "api_key", append(keys, strings.Split(v, ",")...))
			return nil
		}},
		{names: []string{"--api-key-file"}, hint: "FNAME", doc: "a file of HTTP API keys, one a line: api_key_file", apply: setting("--api-key-file", "api_key_file")},
		{names: []string{"--rpc-allow"}, hint: "ADDR|CIDR[,…]", doc: "peers allowed on Hydra RPC (not llama-server's): rpc_allow", apply: func(ls *lsArgs, v string) error {
			allow, _ := ls.settings["rpc_allow"].([]string)
			ls.set("--rpc-allow", "rpc_allow", append(allow, strings.Split(v, ",")...))
			return nil
		}},
		{names: []string{"--rpc-insecure"}, kind: lsSwitch, doc: "Hydra RPC open to any peer (not llama-server's): rpc_insecure", apply: func(ls *lsArgs, v string) error {
			ls.set("--rpc-insecure", "rpc_insecure", v == "true")
			return nil
		}},
	}
}

func lsModelParams() []lsParam {
	return []lsParam{
		{names: []string{"--model", "-m"}, hint: "FNAME", doc: "the GGUF model: model", apply: setting("--model", "model")},
		{names: []string{"--ctx-size", "-c"}, hint: "N", doc: "KV cells of all slots together: n_ctx", apply: func(ls *lsArgs, v string) error {
			n, err := integer(v, 0)
			if err == nil && n == 0 {
				err = errors.New("0 (the model's training context) is not supported here: give the size")
			}
			ls.setOpt("--ctx-size", llamaopt.OptNCtx, v)
			return err
		}},
		{names: []string{"--parallel", "-np"}, hint: "N", doc: "slots (sequences): slots", apply: func(ls *lsArgs, v string) error {
			_, err := integer(v, 1)
			ls.set("--parallel", "slots", v)
			return err
		}},
		{names: []string{"--alias", "-a"}, hint: "STRING", doc: "the model's name in the API: alias", apply: opt("--alias", llamaopt.OptAlias)},
		{names: []string{"--mmap"}, neg: []string{"--no-mmap"}, kind: lsSwitch, doc: "memory-map the model: use_mmap", apply: opt("--mmap", llamaopt.OptMmap)},
		{names: []string{"--threads", "-t"}, hint: "N", doc: "CPU threads for generation (<= 0: every CPU): n_threads", apply: threads("--threads", llamaopt.OptNThreads)},
		{names: []string{"--threads-batch", "-tb"}, hint: "N", doc: "CPU threads for prompts (<= 0: every CPU): n_threads_batch", apply: threads("--threads-batch", llamaopt.OptNThreadsBatch)},
		{names: []string{"--batch-size", "-b"}, hint: "N", doc: "logical batch: n_batch", apply: intOpt("--batch-size", llamaopt.OptNBatch, 1)},
		{names: []string{"--ubatch-size", "-ub"}, hint: "N", doc: "physical batch: n_ubatch", apply: intOpt("--ubatch-size", llamaopt.OptNUBatch, 1)},
		{names: []string{"--flash-attn", "-fa"}, hint: "[on|off|auto]", bare: "on", doc: "flash attention: flash_attn", apply: func(ls *lsArgs, v string) error {
			mode, err := onOffAuto(v)
			ls.setOpt("--flash-attn", llamaopt.OptFlashAttn, mode)
			return err
		}},
		{names: []string{"--cache-type-k", "-ctk"}, hint: "TYPE", doc: "K cache type: cache_type_k", apply: lowerOpt("--cache-type-k", llamaopt.OptCacheTypeK)},
		{names: []string{"--cache-type-v", "-ctv"}, hint: "TYPE", doc: "V cache type: cache_type_v", apply: lowerOpt("--cache-type-v", llamaopt.OptCacheTypeV)},
		{names: []string{"--kv-unified", "-kvu"}, neg: []string{"--no-kv-unified"}, kind: lsSwitch, doc: "one KV pool for all slots: kv_unified", apply: opt("--kv-unified", llamaopt.OptKVUnified)},
		{names: []string{"--context-shift"}, neg: []string{"--no-context-shift"}, kind: lsSwitch, doc: "shift a full slot's context: context_shift", apply: opt("--context-shift", llamaopt.OptContextShift)},
		{names: []string{"--swa-full"}, kind: lsSwitch, doc: "full-size sliding-window caches: swa_full", apply: opt("--swa-full", llamaopt.OptSWAFull)},
		{names: []string{"--cache-reuse"}, hint: "N", doc: "min chunk reused from the cache by KV shifting: cache_reuse", apply: intOpt("--cache-reuse", llamaopt.OptCacheReuse, 0)},
		{names: []string{"--cache-ram", "-cram"}, hint: "N", doc: "host-memory prompt cache in MiB (< 0: no limit, 0: off; not given: 8192, as llama-server): cache_ram",
			apply: func(ls *lsArgs, v string) error {
				n, err := integer(v, math.MinInt64)
				if n < 0 { // llama-server reads any negative size as no limit
					v = "-1"
				}
				ls.setOpt("--cache-ram", llamaopt.OptCacheRAM, v)
				return err
			}},
		{names: []string{"--ctx-checkpoints", "-ctxcp", "--swa-checkpoints"}, hint: "N",
			doc: "context checkpoints a slot keeps where its memory cannot be cut (hybrid, recurrent, sliding window; <= 0: none; default 32): ctx_checkpoints",
			apply: func(ls *lsArgs, v string) error {
				n, err := integer(v, math.MinInt64)
				if n < 0 { // llama-server takes none for any count below one
					v = "0"
				}
				ls.setOpt("--ctx-checkpoints", llamaopt.OptCtxCheckpoints, v)
				return err
			}},
		{names: []string{"--checkpoint-min-step", "-cms"}, hint: "N", doc: "least spacing in tokens between a slot's checkpoints (default 8192, 0: none): checkpoint_min_step",
			apply: intOpt("--checkpoint-min-step", llamaopt.OptCheckpointMinStep, 0)},
		{names: []string{"--checkpoint-ram"}, hint: "N", doc: "host memory in MiB every slot's checkpoints share, the oldest dropped first (not llama-server's; -1: no limit; default 8192): checkpoint_ram",
			apply: intOpt("--checkpoint-ram", llamaopt.OptCheckpointRAM, -1)},
		{names: []string{"--cache-idle-slots"}, neg: []string{"--no-cache-idle-slots"}, kind: lsSwitch,
			why: "idle slots are not saved when a task starts; a slot's sequence goes into the prompt cache (cache_ram) when another prompt takes its slot"},
		{names: []string{"--rope-scaling"}, hint: "{none,linear,yarn}", doc: "RoPE scaling: rope_scaling", apply: func(ls *lsArgs, v string) error {
			ls.setOpt("--rope-scaling", llamaopt.OptRopeScaling, v)
			if !slices.Contains([]string{"none", "linear", "yarn"}, v) {
				return errors.New("want none, linear or yarn")
			}
			return nil
		}},
		{names: []string{"--rope-scale"}, hint: "N", doc: "RoPE context scaling factor: rope_scale", apply: floatOpt("--rope-scale", llamaopt.OptRopeScale)},
		{names: []string{"--yarn-orig-ctx"}, hint: "N", doc: "YaRN's original context (0: the model's): yarn_orig_ctx", apply: intOpt("--yarn-orig-ctx", llamaopt.OptYarnOrigCtx, 0)},
	}
}

func lsPlacementParams() []lsParam {
	return []lsParam{
		{names: []string{"--n-gpu-layers", "-ngl", "--gpu-layers"}, hint: "N|all", doc: "layers on the GPU: n_gpu_layers", apply: func(ls *lsArgs, v string) error {
			ls.setOpt("--n-gpu-layers", llamaopt.OptNGPULayers, v)
			if v == "auto" {
				return errors.New("auto (fitting the model to free memory) is not done here: give a layer count or all")
			}
			if v != "all" {
				_, err := integer(v, -1)
				return err
			}
			return nil
		}},
		{names: []string{"--n-cpu-moe", "-ncmoe"}, hint: "N", doc: "the first N layers' experts in host memory: n_cpu_moe", apply: intOpt("--n-cpu-moe", llamaopt.OptNCPUMoE, 0)},
		{names: []string{"--override-tensor", "-ot"}, hint: "PATTERN=TYPE,…", doc: "weights by name pattern in a device's memory: override_tensor", apply: func(ls *lsArgs, v string) error {
			if prev := ls.opts[llamaopt.OptOverrideTensor]; prev != "" {
				v = prev + "," + v // repeated, as llama-server appends
			}
			ls.setOpt("--override-tensor", llamaopt.OptOverrideTensor, v)
			return nil
		}},
	}
}

func lsChatParams() []lsParam {
	return []lsParam{
		{names: []string{"--jinja"}, neg: []string{"--no-jinja"}, kind: lsSwitch, doc: "Jinja chat templates: jinja", apply: opt("--jinja", llamaopt.OptJinja)},
		{names: []string{"--chat-template-file"}, hint: "JINJA_TEMPLATE_FILE", doc: "the chat template: chat_template_file", apply: func(ls *lsArgs, v string) error {
			abs, err := readableFile(v)
			ls.setOpt("--chat-template-file", llamaopt.OptChatTemplateFile, abs)
			return err
		}},
		{names: []string{"--chat-template-kwargs"}, hint: "JSON", doc: "the template's extra variables: chat_template_kwargs", apply: func(ls *lsArgs, v string) error {
			var obj map[string]any
			if err := json.Unmarshal([]byte(v), &obj); err != nil || obj == nil {
				return errors.New(`want a JSON object, e.g. {"enable_thinking": false}`)
			}
			ls.setOpt("--chat-template-kwargs", llamaopt.OptChatTemplateKwargs, v)
			return nil
		}},
		{names: []string{"--reasoning", "-rea"}, hint: "[on|off|auto]", doc: "the model's thinking, on, off or as its template decides: reasoning", apply: func(ls *lsArgs, v string) error {
			mode, err := onOffAuto(v)
			ls.setOpt("--reasoning", llamaopt.OptReasoning, mode)
			return err
		}},
		{names: []string{"--reasoning-format"}, hint: "FORMAT", doc: "deepseek (or auto): a <think> block as reasoning_content; none: all content: reasoning_format", apply: func(ls *lsArgs, v string) error {
			f := strings.ToLower(v)
			if f == "auto" {
				f = "deepseek"
			}
			if f != "deepseek" && f != "none" {
				return fmt.Errorf("--reasoning-format %q: want auto, deepseek or none", v)
			}
			ls.set("--reasoning-format", "reasoning_format", f)
			return nil
		}},
		{names: []string{"--reasoning-budget"}, hint: "N", doc: "tokens a chat reply may reason before the end tag is forced (-1: unbounded, 0: none): reasoning_budget", apply: func(ls *lsArgs, v string) error {
			_, err := integer(v, -1)
			ls.set("--reasoning-budget", "reasoning_budget", v)
			return err
		}},
		{names: []string{"--reasoning-budget-message"}, hint: "MESSAGE", doc: "text forced before the end tag when the budget runs out: reasoning_budget_message", apply: setting("--reasoning-budget-message", "reasoning_budget_message")},
	}
}

func lsSamplingParams() []lsParam {
	return []lsParam{
		{names: []string{"--temp"}, hint: "N", doc: "default temperature (negative: 0, as llama-server clamps): sampler temperature", apply: func(ls *lsArgs, v string) error {
			f, err := number(v)
			ls.setSampler("--temp", "temperature", strconv.FormatFloat(max(f, 0), 'g', -1, 64))
			return err
		}},
		{names: []string{"--top-k"}, hint: "N", doc: "default top-k (0: off): sampler top_k", apply: samplerInt("--top-k", "top_k")},
		{names: []string{"--top-p"}, hint: "N", doc: "default top-p (1: off): sampler top_p", apply: samplerFloat("--top-p", "top_p")},
		{names: []string{"--min-p"}, hint: "N", doc: "default min-p (0: off): sampler min_p", apply: samplerFloat("--min-p", "min_p")},
		{names: []string{"--repeat-penalty"}, hint: "N", doc: "default repeat penalty (1: off): sampler repeat_penalty", apply: samplerFloat("--repeat-penalty", "repeat_penalty")},
		{names: []string{"--repeat-last-n"}, hint: "N", doc: "tokens the penalties look back on (-1: all): sampler repeat_last_n", apply: samplerInt("--repeat-last-n", "repeat_last_n")},
		{names: []string{"--presence-penalty"}, hint: "N", doc: "default presence penalty: sampler presence_penalty", apply: samplerFloat("--presence-penalty", "presence_penalty")},
		{names: []string{"--frequency-penalty"}, hint: "N", doc: "default frequency penalty: sampler frequency_penalty", apply: samplerFloat("--frequency-penalty", "frequency_penalty")},
		{names: []string{"--seed", "-s"}, hint: "SEED", doc: "default seed (-1: random, the engine's default): sampler seed", apply: func(ls *lsArgs, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < -1 || n > 1<<32-1 {
				return errors.New("want -1 or a seed in [0, 4294967295]")
			}
			if n != -1 && n != 1<<32-1 { // LLAMA_DEFAULT_SEED asks for a random one
				ls.setSampler("--seed", "seed", v)
			}
			return nil
		}},
		{names: []string{"--slot-prompt-similarity", "-sps"}, hint: "SIMILARITY", doc: "prompt share that picks a slot (0: off): slot_prompt_similarity", apply: func(ls *lsArgs, v string) error {
			_, err := number(v)
			ls.set("--slot-prompt-similarity", "slot_prompt_similarity", v)
			return err
		}},
	}
}

func lsServerParams() []lsParam {
	return []lsParam{
		{names: []string{"--timeout", "-to"}, hint: "N", doc: "seconds a socket read or write may stall: chunk_timeout", apply: func(ls *lsArgs, v string) error {
			_, err := integer(v, 1)
			ls.set("--timeout", "chunk_timeout", v+"s")
			return err
		}},
		{names: []string{"--log-verbosity", "-lv", "--verbosity"}, hint: "N", doc: "log threshold, 1 error … 4 debug: log_level", apply: func(ls *lsArgs, v string) error {
			n, err := integer(v, 0)
			ls.set("--log-verbosity", "log_level", logLevelOf(n))
			return err
		}},
		{names: []string{"--verbose", "-v", "--log-verbose"}, kind: lsSwitch, doc: "log everything: log_level trace", apply: func(ls *lsArgs, v string) error {
			if v == "true" {
				ls.set("--verbose", "log_level", "trace")
			}
			return nil
		}},
		{names: []string{"--metrics"}, kind: lsSwitch,
			why: "/metrics is always served (behind the API key unless public_metrics): the hydra_engine_* metrics and llama-server's llamacpp:* series that mean the same here (docs/operators.md)"},
		{names: []string{"--slots"}, neg: []string{"--no-slots"}, kind: lsSwitch,
			why: "/slots is always served (behind the API key)"},
		{names: []string{"--cont-batching", "-cb"}, neg: []string{"--no-cont-batching", "-nocb"}, kind: lsSwitch,
			why: "the llama plugin's scheduler decides how slots share llama.cpp's batches; there is no switch"},
		{names: []string{"--cache-prompt"}, neg: []string{"--no-cache-prompt"}, kind: lsSwitch,
			why: "prompt caching is not a switch: what a slot keeps of its KV between requests is the plugin's to decide (cache_reuse)"},
		{names: []string{"--perf"}, neg: []string{"--no-perf"}, kind: lsSwitch,
			why: "libllama's timings are off in the plugin; hydra_engine_token_seconds_total and tokens_per_second in /metrics measure speed"},
		{names: []string{"--log-prefix"}, kind: lsSwitch,
			why: "the engine's log lines carry their own timestamp, level and source (log_format text or json)"},
		{names: []string{"--prio"}, hint: "N",
			why: "the engine leaves scheduling priority to the service manager (systemd's Nice=, CPUSchedulingPolicy=)"},
		{names: []string{"--prio-batch"}, hint: "N",
			why: "the engine leaves scheduling priority to the service manager (systemd's Nice=, CPUSchedulingPolicy=)"},
		{names: []string{"--models-preset"}, hint: "PATH", doc: "router mode's presets: a request naming a preset's alias loads it", apply: func(ls *lsArgs, v string) error {
			f, err := readPresetFile(v)
			if err != nil {
				return err
			}
			ls.presets = &f
			ls.notes = append(ls.notes, fmt.Sprintf("llama-server --models-preset %s: %s (%s): a request naming one's alias switches the engine to it, emptying the slots",
				v, plural(len(f.presets), "preset"), strings.Join(f.names(), ", ")))
			return nil
		}},
		{names: []string{"--models-max"}, hint: "N",
			why: "one model is resident at a time: a request naming another preset replaces it (the plugin process is relaunched with it)"},
		{names: []string{"--help", "-h", "--usage"}, kind: lsSwitch, doc: "this list", apply: func(ls *lsArgs, v string) error {
			ls.help = v == "true"
			return nil
		}},
		{names: []string{"--version"}, kind: lsSwitch, doc: "the engine's version", apply: func(ls *lsArgs, v string) error {
			ls.version = v == "true"
			return nil
		}},
		{names: []string{"--print-config"}, kind: lsSwitch, doc: "print the effective configuration and exit (not llama-server's)", apply: func(ls *lsArgs, v string) error {
			ls.printConfig = v == "true"
			return nil
		}},
	}
}

// Parameter appliers.

func setting(param, key string) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error { ls.set(param, key, v); return nil }
}

func opt(param, key string) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error { ls.setOpt(param, key, v); return nil }
}

func lowerOpt(param, key string) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error { ls.setOpt(param, key, strings.ToLower(v)); return nil }
}

func intOpt(param, key string, lo int64) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error {
		_, err := integer(v, lo)
		ls.setOpt(param, key, v)
		return err
	}
}

func floatOpt(param, key string) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error {
		_, err := number(v)
		ls.setOpt(param, key, v)
		return err
	}
}

// threads maps llama-server's thread counts, where zero or less means
// every CPU.
func threads(param, key string) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("not an integer")
		}
		if n <= 0 {
			v = strconv.Itoa(runtime.NumCPU())
		}
		ls.setOpt(param, key, v)
		return nil
	}
}

func samplerInt(param, key string) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error {
		_, err := integer(v, -1<<31)
		ls.setSampler(param, key, v)
		return err
	}
}

func samplerFloat(param, key string) func(*lsArgs, string) error {
	return func(ls *lsArgs, v string) error {
		_, err := number(v)
		ls.setSampler(param, key, v)
		return err
	}
}

// Value checks: the command line's types, ranges the engine and the plugin
// check themselves.

func integer(v string, lo int64) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		return 0, errors.New("not an integer")
	case n < lo:
		return 0, fmt.Errorf("must be at least %d", lo)
	}
	return n, nil
}

func number(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, errors.New("not a number")
	}
	return f, nil
}

func portNumber(v string, lo int64) error {
	n, err := integer(v, lo)
	if err == nil && n > 65535 {
		err = errors.New("not a port: at most 65535")
	}
	return err
}

// onOffAuto reads llama.cpp's on|off|auto words (auto also -1).
func onOffAuto(v string) (string, error) {
	if b, ok := llamaBool(v); ok {
		if b {
			return "on", nil
		}
		return "off", nil
	}
	if strings.EqualFold(v, "auto") || v == "-1" {
		return "auto", nil
	}
	return v, errors.New("want on, off or auto")
}

// readableFile is path made absolute (the plugin may run elsewhere), once
// it is known to be a file the engine can read.
func readableFile(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return abs, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return abs, fmt.Errorf("%s is not a regular file", abs)
	}
	return abs, nil
}

// plural is "1 thing" or "n things".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// logLevelOf maps llama.cpp's log verbosity (0 output, 1 error, 2 warning,
// 3 info, 4 debug) onto the engine's levels.
func logLevelOf(n int64) string {
	switch {
	case n <= 1:
		return "error"
	case n == 2:
		return "warn"
	case n == 3:
		return "info"
	}
	return "debug"
}
