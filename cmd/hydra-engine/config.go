package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/hashicorp/go-hclog"
	"go.yaml.in/yaml/v3"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
	"github.com/hydra-engine/hydra-engine/transport"
)

// Config is the engine's configuration. Each setting comes from, in rising
// precedence: the defaults, the YAML file given by --config (or
// HYDRA_CONFIG), the environment variable HYDRA_<KEY>, and the flag. A list
// given by a higher layer replaces the lower one; backend_opts merge key by
// key. See docs/operators.md.
type Config struct {
	RPC             []string          `mapstructure:"rpc"`
	HTTP            string            `mapstructure:"http"`
	Backend         string            `mapstructure:"backend"`
	PluginDir       string            `mapstructure:"plugin_dir"`
	BackendOpts     map[string]string `mapstructure:"backend_opts"`
	Slots           int               `mapstructure:"slots"`
	Model           string            `mapstructure:"model"`
	LogFormat       string            `mapstructure:"log_format"`
	LogLevel        string            `mapstructure:"log_level"`
	IdleTimeout     time.Duration     `mapstructure:"idle_timeout"`
	ChunkTimeout    time.Duration     `mapstructure:"chunk_timeout"`
	ShutdownGrace   time.Duration     `mapstructure:"shutdown_grace"`
	DataPlane       string            `mapstructure:"data_plane"`
	StateChunkSize  uint64            `mapstructure:"state_chunk_size"`
	SocketBuffer    int               `mapstructure:"socket_buffer"`
	BackendSHA256   string            `mapstructure:"backend_sha256"`
	TLSCert         string            `mapstructure:"tls_cert"`
	TLSKey          string            `mapstructure:"tls_key"`
	TLSClientCA     string            `mapstructure:"tls_client_ca"`
	RPCAllow        []string          `mapstructure:"rpc_allow"`
	RPCInsecure     bool              `mapstructure:"rpc_insecure"`
	APIKey          []string          `mapstructure:"api_key"`
	APIKeyFile      string            `mapstructure:"api_key_file"`
	PublicMetrics   bool              `mapstructure:"public_metrics"`
	MaxConns        int               `mapstructure:"max_conns"`
	PayloadBudget   uint64            `mapstructure:"payload_budget"`
	MinTransferRate uint64            `mapstructure:"min_transfer_rate"`
	TransferFloor   uint64            `mapstructure:"state_transfer_floor"`
	StateShmDir     string            `mapstructure:"state_shm_dir"`
	// LendWeights and CombinedPeer are combined mode between two engines of
	// one host (host/combined): the peer lends its weights on a loopback
	// HOST:PORT, the head follows the peer there.
	LendWeights     string            `mapstructure:"lend_weights"`
	CombinedPeer    string            `mapstructure:"combined_peer"`
	Sampler         map[string]string `mapstructure:"sampler"`
	SlotSimilarity  float64           `mapstructure:"slot_prompt_similarity"`
	ReasoningFormat string            `mapstructure:"reasoning_format"`
	// ReasoningBudget and ReasoningBudgetMessage are llama-server's
	// --reasoning-budget (-1: unbounded) and --reasoning-budget-message.
	ReasoningBudget        int    `mapstructure:"reasoning_budget"`
	ReasoningBudgetMessage string `mapstructure:"reasoning_budget_message"`
	SPMInfill              bool   `mapstructure:"spm_infill"`

	// apiKeys are APIKey and the lines of APIKeyFile, read by validate: the
	// keys the HTTP side requires (not a setting of its own).
	apiKeys []string
	// presets are the models a request may switch to (llama-server mode's
	// --models-preset).
	presets []modelPreset
	// llamaServer is set in llama-server mode (llamaserver.go), whose rules
	// differ: no RPC listener is needed, and its errors speak of the node
	// configuration.
	llamaServer bool
}

// defaultSlotPromptSimilarity is llama-server's --slot-prompt-similarity
// default.
const defaultSlotPromptSimilarity = 0.1

// defaultConfig is what an engine started with no configuration runs with.
func defaultConfig() Config {
	return Config{
		RPC:             []string{"tcp://127.0.0.1:9510"},
		Backend:         "mock",
		BackendOpts:     map[string]string{},
		RPCAllow:        []string{},
		APIKey:          []string{},
		Slots:           4,
		LogFormat:       "text",
		LogLevel:        "info",
		IdleTimeout:     host.DefaultIdleTimeout,
		ChunkTimeout:    host.DefaultChunkTimeout,
		ShutdownGrace:   30 * time.Second,
		DataPlane:       "auto",
		StateChunkSize:  host.DefaultStateChunkSize,
		MaxConns:        host.DefaultMaxConns,
		PayloadBudget:   host.DefaultPayloadBudget,
		MinTransferRate: host.DefaultMinTransferRate,
		Sampler:         map[string]string{},
		SlotSimilarity:  defaultSlotPromptSimilarity,
		ReasoningFormat: "deepseek",
		ReasoningBudget: -1,
	}
}

// removedSettings are settings that earlier versions had: each is refused
// with its reason, from the file, the environment and the command line, so an
// operator's old configuration fails clearly instead of as a typo.
var removedSettings = map[string]string{
	"ring_depth":   "the shm data plane sizes its ring itself",
	"splice_put":   "restores from TCP and Unix sockets are always spliced where the plugin takes pipes",
	"splice_pipes": "a spliced restore always fills two pipes in turn",
	"relay_unix":   "restores from Unix sockets are never relayed",
	"put_warm_kib": "the restore ring is always warmed ahead of the socket's copy",
}

// removedError is the error for a removed setting given as key (or its flag).
func removedError(key, as string) error {
	return fmt.Errorf("%s is no longer a setting: %s (docs/design/data-plane.md)", as, removedSettings[key])
}

// checkRemovedFlags refuses removed settings on the command line, before
// the flag package would call them undefined.
func checkRemovedFlags(args []string) error {
	for _, a := range args {
		if a == "--" {
			return nil
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		key := strings.ReplaceAll(name, "-", "_")
		if _, ok := removedSettings[key]; ok && strings.HasPrefix(a, "-") {
			return removedError(key, "--"+name)
		}
	}
	return nil
}

// checkRemovedKeys refuses removed settings in a file's layer or the
// environment.
func checkRemovedKeys(layer map[string]any, getenv func(string) (string, bool)) error {
	for key := range removedSettings {
		if _, ok := layer[key]; ok {
			return removedError(key, key)
		}
		if _, ok := getenv(envName(key)); ok {
			return removedError(key, envName(key))
		}
	}
	return nil
}

// settings pairs each configuration key with its flag, in the order
// --print-config shows them. The environment variable is HYDRA_ + KEY.
var settings = []struct{ key, flag string }{
	{"rpc", "rpc"},
	{"http", "http"},
	{"backend", "backend"},
	{"plugin_dir", "plugin-dir"},
	{"backend_opts", "backend-opt"},
	{"slots", "slots"},
	{"model", "model"},
	{"log_format", "log-format"},
	{"log_level", "log-level"},
	{"idle_timeout", "idle-timeout"},
	{"chunk_timeout", "chunk-timeout"},
	{"shutdown_grace", "shutdown-grace"},
	{"data_plane", "data-plane"},
	{"state_chunk_size", "state-chunk-size"},
	{"socket_buffer", "socket-buffer"},
	{"backend_sha256", "backend-sha256"},
	{"tls_cert", "tls-cert"},
	{"tls_key", "tls-key"},
	{"tls_client_ca", "tls-client-ca"},
	{"rpc_allow", "rpc-allow"},
	{"rpc_insecure", "rpc-insecure"},
	{"api_key", "api-key"},
	{"api_key_file", "api-key-file"},
	{"public_metrics", "public-metrics"},
	{"max_conns", "max-conns"},
	{"payload_budget", "payload-budget"},
	{"min_transfer_rate", "min-transfer-rate"},
	{"state_transfer_floor", "state-transfer-floor"},
	{"state_shm_dir", "state-shm-dir"},
	{"lend_weights", "lend-weights"},
	{"combined_peer", "combined-peer"},
	{"sampler", "sampler"},
	{"slot_prompt_similarity", "slot-prompt-similarity"},
	{"reasoning_format", "reasoning-format"},
	{"reasoning_budget", "reasoning-budget"},
	{"reasoning_budget_message", "reasoning-budget-message"},
	{"spm_infill", "spm-infill"},
}

func envName(key string) string { return "HYDRA_" + strings.ToUpper(key) }

// envConfigFile names the config file when --config is not given.
const envConfigFile = "HYDRA_CONFIG"

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
func (l *listFlag) Get() any           { return []string(*l) }

// invocation is a parsed command line: the configuration and what to do.
type invocation struct {
	cfg         Config
	sources     map[string]string // key → where its value came from
	printConfig bool
	showVersion bool
	notes       []string // said once in the log at start (llamaserver.go)
	warnings    []string // the same, at WARN
}

// newFlagSet declares the flags. Their values are only read for the flags
// given (fs.Visit), so the defaults here are for -help alone.
func newFlagSet(d Config, configFile *string, printConfig, showVersion *bool) *flag.FlagSet {
	fs := flag.NewFlagSet("hydra-engine", flag.ContinueOnError)
	// Each flag needs storage of its own: Get reads it back after Parse.
	v := d
	var rpc, opts, allow, keys, sampler listFlag
	fs.Var(&rpc, "rpc", "Hydra RPC listener URL, tcp://HOST:PORT or unix:///PATH (repeatable; default "+strings.Join(d.RPC, ",")+")")
	fs.StringVar(&v.HTTP, "http", d.HTTP, "HTTP listen address for /health, /slots, /metrics and the OpenAI API (empty: off)")
	fs.StringVar(&v.Backend, "backend", d.Backend, "backend plugin: a name (hydra-plugin-NAME in --plugin-dir or beside this binary) or a path")
	fs.StringVar(&v.PluginDir, "plugin-dir", d.PluginDir, "directory searched first for hydra-plugin-NAME")
	fs.Var(&opts, "backend-opt", "backend option key=value, passed to the plugin (repeatable)")
	fs.IntVar(&v.Slots, "slots", d.Slots, "number of slots (sequences)")
	fs.StringVar(&v.Model, "model", d.Model, "model file for the backend")
	fs.StringVar(&v.LogFormat, "log-format", d.LogFormat, "log format: text or json")
	fs.StringVar(&v.LogLevel, "log-level", d.LogLevel, "log level: trace, debug, info, warn, error")
	fs.DurationVar(&v.IdleTimeout, "idle-timeout", d.IdleTimeout, "close connections idle this long between requests")
	fs.DurationVar(&v.ChunkTimeout, "chunk-timeout", d.ChunkTimeout, "cut a peer that stalls this long inside a request or reply")
	fs.DurationVar(&v.ShutdownGrace, "shutdown-grace", d.ShutdownGrace, "on SIGTERM/SIGINT, let in-flight requests finish for this long")
	fs.StringVar(&v.DataPlane, "data-plane", d.DataPlane, "how state bytes travel to and from the plugin: auto, shm or grpc")
	fs.Uint64Var(&v.StateChunkSize, "state-chunk-size", d.StateChunkSize, "initial state_chunk_size in bytes (64 KiB to 64 MiB; CONFIGURE changes it)")
	fs.IntVar(&v.SocketBuffer, "socket-buffer", d.SocketBuffer, "SO_SNDBUF/SO_RCVBUF in bytes for accepted connections; 0: 4 MiB on Unix sockets, kernel autotuning on TCP; -1: kernel defaults (capped by net.core.wmem_max/rmem_max)")
	fs.StringVar(&v.BackendSHA256, "backend-sha256", d.BackendSHA256, "pin the plugin executable: refuse to launch it unless its SHA-256 (hex) matches")
	fs.StringVar(&v.TLSCert, "tls-cert", d.TLSCert, "certificate (PEM) of the tls:// listeners")
	fs.StringVar(&v.TLSKey, "tls-key", d.TLSKey, "private key (PEM) of the tls:// listeners")
	fs.StringVar(&v.TLSClientCA, "tls-client-ca", d.TLSClientCA, "CA (PEM) that tls:// clients' certificates must chain to (mutual TLS); empty: no client certificates")
	fs.Var(&allow, "rpc-allow", "peer addresses or CIDR prefixes allowed on the tcp:// and tls:// RPC listeners (repeatable or comma-separated; empty: any peer)")
	fs.BoolVar(&v.RPCInsecure, "rpc-insecure", d.RPCInsecure, "allow an RPC listener reachable from other hosts without --rpc-allow or client certificates")
	fs.Var(&keys, "api-key", "API key HTTP clients must send as Authorization: Bearer KEY (repeatable; /health stays open)")
	fs.StringVar(&v.APIKeyFile, "api-key-file", d.APIKeyFile, "file of API keys, one per line, added to --api-key")
	fs.BoolVar(&v.PublicMetrics, "public-metrics", d.PublicMetrics, "serve /metrics without an API key")
	fs.IntVar(&v.MaxConns, "max-conns", d.MaxConns, "connections open at once per listener (RPC and HTTP); more are answered busy and closed")
	fs.Uint64Var(&v.PayloadBudget, "payload-budget", d.PayloadBudget, "bytes of request payloads buffered in memory at once, over all connections and HTTP bodies")
	fs.Uint64Var(&v.MinTransferRate, "min-transfer-rate", d.MinTransferRate, "bytes per second a request or reply must move at least, over windows of 10 s (--chunk-timeout if shorter) spent waiting on the socket; 0: no minimum")
	fs.Uint64Var(&v.TransferFloor, "state-transfer-floor", d.TransferFloor, "bytes per second below which a state transfer of 64 MiB or more is logged as a warning, with whether the backend or the socket set its pace; 0: none")
	fs.StringVar(&v.StateShmDir, "state-shm-dir", d.StateShmDir, "shared-memory directory (a tmpfs) where STATE_EXPORT writes a slot's state for another engine on this host and STATE_IMPORT reads one; both engines need the same; empty: "+host.DefaultStateShmDir)
	fs.StringVar(&v.LendWeights, "lend-weights", d.LendWeights, "combined mode's peer: lend this engine's weights to a head on this host, listening on HOST:PORT, a loopback address (llama-engine's --ggml-rpc-port)")
	fs.StringVar(&v.CombinedPeer, "combined-peer", d.CombinedPeer, "combined mode's head: bind the combined pattern's weights to those of the engine lending them on HOST:PORT, on this host (llama-engine's --rpc-engine)")
	fs.Var(&sampler, "sampler", "engine-wide sampler default key=value, a CONFIGURE sampler key: temperature, top_k, top_p, min_p, repeat_penalty, … (repeatable)")
	fs.StringVar(&v.ReasoningFormat, "reasoning-format", d.ReasoningFormat, "deepseek: a chat reply's <think> block streams as reasoning_content, apart from content (llama-server's); none: all is content")
	fs.IntVar(&v.ReasoningBudget, "reasoning-budget", d.ReasoningBudget, "tokens a chat reply may reason before its template's end tag is forced (llama-server's): -1 unbounded, 0 no reasoning; a request's reasoning_budget_tokens wins")
	fs.StringVar(&v.ReasoningBudgetMessage, "reasoning-budget-message", d.ReasoningBudgetMessage, "text forced before the end tag when a reasoning budget runs out (llama-server's); a request's reasoning_budget_message wins")
	fs.BoolVar(&v.SPMInfill, "spm-infill", d.SPMInfill, "/infill prompts put the suffix before the prefix (llama-server's --spm-infill), for models trained so")
	fs.Float64Var(&v.SlotSimilarity, "slot-prompt-similarity", d.SlotSimilarity, "how much of a slot's prompt an HTTP request's prompt must share to be given that slot, 0 to 1 (llama-server's; 0: off)")
	fs.StringVar(configFile, "config", "", "YAML configuration file (default $"+envConfigFile+"; flags and HYDRA_* variables override it)")
	fs.BoolVar(printConfig, "print-config", false, "print the effective configuration as YAML, with each value's source, and exit")
	fs.BoolVar(showVersion, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: hydra-engine [flags]\n"+
			"       hydra-engine %[1]s [llama-server flags]   llama-server's command line (docs/llama-server.md; hydra-engine %[1]s --help)\n"+
			"       (also as %[2]s, and under either name as the executable)\n\nflags:\n",
			llamaServerCommand, llamaEngineCommand)
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nbackend options of cuda-llama (--backend cuda-llama --backend-opt KEY=VALUE):\n%s", llamaopt.Help())
	}
	return fs
}

// parseInvocation builds the configuration from the command line args, the
// environment (getenv) and the config file they name: defaults < file <
// environment < flags.
func parseInvocation(args []string, getenv func(string) (string, bool), stderr io.Writer) (*invocation, error) {
	inv := &invocation{cfg: defaultConfig(), sources: map[string]string{}}
	if err := checkRemovedFlags(args); err != nil {
		return nil, err
	}
	var configFile string
	fs := newFlagSet(inv.cfg, &configFile, &inv.printConfig, &inv.showVersion)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, st := range settings {
		inv.sources[st.key] = "default"
	}
	if configFile == "" {
		configFile, _ = getenv(envConfigFile)
	}
	if err := inv.applyFile(configFile, getenv); err != nil {
		return nil, err
	}
	if err := inv.applyEnv(getenv); err != nil {
		return nil, err
	}
	if err := inv.applyFlags(fs); err != nil {
		return nil, err
	}
	if err := inv.cfg.validate(); err != nil {
		return nil, err
	}
	return inv, nil
}

// applyFile applies the YAML file at path, if any.
func (inv *invocation) applyFile(path string, getenv func(string) (string, bool)) error {
	var layer map[string]any
	if path != "" {
		var err error
		if layer, err = readConfigFile(path); err != nil {
			return err
		}
	}
	if err := checkRemovedKeys(layer, getenv); err != nil {
		return err
	}
	if err := inv.apply(layer, func(string) string { return "file " + path }, true); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// applyEnv applies the HYDRA_* variables.
func (inv *invocation) applyEnv(getenv func(string) (string, bool)) error {
	env := map[string]any{}
	for _, st := range settings {
		if v, ok := getenv(envName(st.key)); ok {
			env[st.key] = v
		}
	}
	if err := inv.apply(env, func(k string) string { return "env " + envName(k) }, false); err != nil {
		return fmt.Errorf("environment: %w", err)
	}
	return nil
}

// applyFlags applies the flags given on the command line.
func (inv *invocation) applyFlags(fs *flag.FlagSet) error {
	flags := map[string]any{}
	flagOf := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		for _, st := range settings {
			if st.flag == f.Name {
				flags[st.key] = f.Value.(flag.Getter).Get()
				flagOf[st.key] = f.Name
			}
		}
	})
	if err := inv.apply(flags, func(k string) string { return "flag --" + flagOf[k] }, false); err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	return nil
}

// readConfigFile reads a YAML mapping of settings; an empty file is none.
func readConfigFile(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return m, nil
}

// apply decodes one layer onto the configuration. strict (the file) rejects
// unknown keys, catching typos; env and flags only ever hold known ones.
func (inv *invocation) apply(layer map[string]any, source func(key string) string, strict bool) error {
	if len(layer) == 0 {
		return nil
	}
	// A list replaces, where mapstructure would overwrite element-wise.
	for key, list := range map[string]*[]string{"rpc": &inv.cfg.RPC, "rpc_allow": &inv.cfg.RPCAllow, "api_key": &inv.cfg.APIKey} {
		if _, ok := layer[key]; ok {
			*list = nil
		}
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		Result:           &inv.cfg,
		ErrorUnused:      strict,
		WeaklyTypedInput: true, // environment values are all strings
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			durationHook, keyValueHook, mapstructure.StringToSliceHookFunc(",")),
	})
	if err != nil {
		return err
	}
	if err := dec.Decode(layer); err != nil {
		return err
	}
	for _, st := range settings {
		if _, ok := layer[st.key]; !ok {
			continue
		}
		if prev := inv.sources[st.key]; (st.key == "backend_opts" || st.key == "sampler") && prev != "default" {
			inv.sources[st.key] = prev + ", " + source(st.key) // merged, not replaced
		} else {
			inv.sources[st.key] = source(st.key)
		}
	}
	return nil
}

var durationType = reflect.TypeFor[time.Duration]()

// durationHook reads durations as Go duration strings ("90s", "15m"); a bare
// number is refused rather than taken as nanoseconds.
func durationHook(from, to reflect.Type, data any) (any, error) {
	if to != durationType {
		return data, nil
	}
	switch v := data.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration (e.g. 90s, 15m)", v)
		}
		return d, nil
	case time.Duration:
		return v, nil
	default:
		return nil, fmt.Errorf("%v is not a duration: give a unit, e.g. \"%vs\"", v, v)
	}
}

// keyValueHook reads backend options and sampler defaults given as "k=v"
// strings: a list from repeated flags, or a comma-separated string from the
// environment.
func keyValueHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeFor[map[string]string]() {
		return data, nil
	}
	var kvs []string
	switch v := data.(type) {
	case string:
		for kv := range strings.SplitSeq(v, ",") {
			if kv = strings.TrimSpace(kv); kv != "" {
				kvs = append(kvs, kv)
			}
		}
	case []string:
		kvs = v
	default:
		return data, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		m[k] = v
	}
	return m, nil
}

// maxSlots is llama.cpp's LLAMA_MAX_SEQ: the most sequences one context holds.
const maxSlots = 256

func (c *Config) validate() error {
	if len(c.RPC) == 0 && !c.llamaServer { // llama-server mode serves HTTP alone without --rpc-port
		return errors.New("rpc: at least one listener is needed")
	}
	if c.Backend == "" {
		return errors.New("backend: empty")
	}
	if c.Slots < 1 || c.Slots > maxSlots {
		return fmt.Errorf("slots must be in [1, %d], got %d", maxSlots, c.Slots)
	}
	if err := checkCombinedAddrs(c.LendWeights, c.CombinedPeer); err != nil {
		return err
	}
	switch c.DataPlane {
	case "auto", "shm", "grpc":
	default:
		return fmt.Errorf("data_plane must be auto, shm or grpc, got %q", c.DataPlane)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("log_format must be text or json, got %q", c.LogFormat)
	}
	if hclog.LevelFromString(c.LogLevel) == hclog.NoLevel {
		return fmt.Errorf("log_level %q is not a level", c.LogLevel)
	}
	for k, d := range map[string]time.Duration{"idle_timeout": c.IdleTimeout, "chunk_timeout": c.ChunkTimeout} {
		if d <= 0 {
			return fmt.Errorf("%s must be positive, got %v", k, d)
		}
	}
	if c.ShutdownGrace < 0 {
		return fmt.Errorf("shutdown_grace must not be negative, got %v", c.ShutdownGrace)
	}
	if c.StateChunkSize != host.ClampStateChunkSize(c.StateChunkSize) {
		return fmt.Errorf("state_chunk_size must be in [%d, %d], got %d", host.MinStateChunkSize, host.MaxStateChunkSize, c.StateChunkSize)
	}
	for k := range c.BackendOpts {
		if k == "" {
			return errors.New("backend_opts: empty key")
		}
	}
	if err := host.NewTunables().ApplySampler(c.Sampler); err != nil {
		return err // checked here, so that a bad value stops the engine before it binds
	}
	if c.ReasoningFormat != "deepseek" && c.ReasoningFormat != "none" {
		return fmt.Errorf("reasoning_format must be deepseek or none, got %q", c.ReasoningFormat)
	}
	if c.ReasoningBudget < -1 || c.ReasoningBudget > math.MaxInt32 {
		return fmt.Errorf("reasoning_budget must be -1 (unbounded) or a count of tokens in [0, %d], got %d", math.MaxInt32, c.ReasoningBudget)
	}
	if !(c.SlotSimilarity >= 0 && c.SlotSimilarity <= 1) {
		return fmt.Errorf("slot_prompt_similarity must be in [0, 1], got %v", c.SlotSimilarity)
	}
	if c.BackendSHA256 != "" {
		if b, err := hex.DecodeString(c.BackendSHA256); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("backend_sha256 must be 64 hex digits, got %q", c.BackendSHA256)
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("tls_cert and tls_key go together")
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		return errors.New("tls_client_ca needs tls_cert and tls_key")
	}
	tlsListener := false
	for _, u := range c.RPC {
		tlsListener = tlsListener || strings.HasPrefix(strings.ToLower(u), "tls://")
	}
	if tlsListener && c.TLSCert == "" {
		return errors.New("a tls:// listener needs tls_cert and tls_key")
	}
	if err := c.checkRPCAccess(); err != nil {
		return err
	}
	return c.loadAPIKeys()
}

// printConfig writes the configuration as a YAML file that --config
// accepts, each value followed by its source.
func printConfig(w io.Writer, inv *invocation) error {
	fields := map[string]any{}
	if err := mapstructure.Decode(inv.cfg, &fields); err != nil {
		return err
	}
	root := &yaml.Node{Kind: yaml.MappingNode,
		HeadComment: "hydra-engine " + version + ": effective configuration (precedence: flags > HYDRA_* env > file > defaults)"}
	for _, st := range settings {
		v := fields[st.key]
		switch x := v.(type) {
		case time.Duration:
			v = x.String()
		case map[string]string:
			if len(x) == 0 {
				v = map[string]string{} // "{}" rather than null
			}
		}
		if st.key == "api_key" {
			v = redactKeys(inv.cfg.APIKey)
		}
		var val yaml.Node
		if err := val.Encode(v); err != nil {
			return err
		}
		key := &yaml.Node{Kind: yaml.ScalarNode, Value: st.key}
		if val.Kind == yaml.ScalarNode || len(val.Content) == 0 {
			val.LineComment = inv.sources[st.key]
		} else {
			key.LineComment = inv.sources[st.key] // after "key:", above the block
		}
		root.Content = append(root.Content, key, &val)
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return err
	}
	return enc.Close()
}

// Who may connect (docs/operators.md, Security).

// resolveTimeout bounds resolving a listener's host name to decide whether
// other hosts can reach it.
const resolveTimeout = 5 * time.Second

// checkRPCAccess parses rpc_allow and refuses an RPC listener that other
// hosts can reach when nothing says who may connect: Hydra RPC has no
// credentials, and whoever connects can read or overwrite any slot's KV
// state. Unix sockets are governed by their file mode instead.
func (c *Config) checkRPCAccess() error {
	allow, err := transport.ParseAllowList(c.RPCAllow)
	if err != nil {
		return fmt.Errorf("rpc_allow: %w", err)
	}
	if len(allow) > 0 || c.RPCInsecure {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	for _, u := range c.RPC {
		network, _, err := transport.ParseURL(u)
		if err != nil {
			return fmt.Errorf("rpc %s: %w", u, err)
		}
		if network == "unix" || (network == "tls" && c.TLSClientCA != "") {
			continue
		}
		local, err := transport.LoopbackOnly(ctx, u)
		if err != nil {
			return fmt.Errorf("rpc %s: %w", u, err)
		}
		if !local {
			return openRPCError(u, network, c.llamaServer)
		}
	}
	return nil
}

// openRPCError says why a listener reachable from other hosts is refused
// and names the three ways to say who may connect. In llama-server mode it
// also gives the line to add to a node configuration, since an operator
// there writes YAML for a node agent rather than the engine's flags.
func openRPCError(u, network string, llamaServer bool) error {
	why := "Hydra RPC has no credentials"
	if network == "tls" {
		why = "without tls_client_ca TLS authenticates no client"
	}
	node := ""
	if llamaServer {
		node = ". In a hydra-head node configuration, add under llama.params the line\n    rpc-allow: 10.0.0.0/8\n" +
			"with the coordinators' addresses or networks (comma-separated) in place of 10.0.0.0/8; " +
			"see docs/llama-server.md, Moving a node from llama-engine"
	}
	return fmt.Errorf("rpc %s can be reached from other hosts and %s: anyone who connects can read or overwrite "+
		"any slot's KV state. Say who may connect: --rpc-allow ADDR|CIDR (rpc_allow, HYDRA_RPC_ALLOW) admits those peers only; "+
		"a tls:// listener with --tls-client-ca requires client certificates; --rpc-insecure (HYDRA_RPC_INSECURE=true) "+
		"accepts any peer. Or listen on 127.0.0.1 or a unix:// socket. See docs/operators.md, Security%s", u, why, node)
}

// redactedPrefix starts what --print-config shows for api_key. A key
// starting with it is refused, so a printed configuration given back to the
// engine fails instead of serving with a placeholder for a key.
const redactedPrefix = "<redacted"

// redactKeys is api_key as --print-config shows it: how many, never which.
func redactKeys(keys []string) any {
	switch len(keys) {
	case 0:
		return []string{}
	case 1:
		return redactedPrefix + ": 1 key>"
	default:
		return fmt.Sprintf("%s: %d keys>", redactedPrefix, len(keys))
	}
}

// loadAPIKeys checks api_key and reads api_key_file: c.apiKeys holds both.
func (c *Config) loadAPIKeys() error {
	var keys []string
	for _, k := range c.APIKey {
		switch {
		case strings.TrimSpace(k) == "":
			return errors.New("api_key: an empty key")
		case strings.HasPrefix(k, redactedPrefix):
			return errors.New("api_key: this is the placeholder --print-config shows, not a key: give the keys themselves (api_key_file keeps them out of the configuration)")
		}
		keys = append(keys, strings.TrimSpace(k))
	}
	if c.APIKeyFile != "" {
		fileKeys, err := readAPIKeyFile(c.APIKeyFile)
		if err != nil {
			return err
		}
		keys = append(keys, fileKeys...)
	}
	c.apiKeys = keys
	return nil
}

// readAPIKeyFile reads one key per line; blank lines and lines starting
// with # are skipped. A file without a key is an error: an operator who
// names a key file means the API to need one.
func readAPIKeyFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("api_key_file: %w: give a file of HTTP API keys, one per line, readable by the engine's user "+
			"(or set api_key_file empty, HYDRA_API_KEY_FILE=, to serve HTTP without keys)", err)
	}
	var keys []string
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			keys = append(keys, line)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("api_key_file %s holds no key (one key per line; blank lines and # comments are skipped)", path)
	}
	return keys, nil
}

// httpOptions are the HTTP side's keys and metrics setting. An HTTP API
// that other hosts reach without a key is served, since containers publish
// it that way and a key only guards slots and completions, but said once in
// a warning (RPC, which reads and writes KV state, is refused instead).
func httpOptions(c *Config, logger hclog.Logger) httpapi.Options {
	if c.openHTTP() {
		logger.Warn("the HTTP API is served to other hosts without an API key: anyone who reaches it can run completions "+
			"and erase slots; set api_key_file (--api-key-file) or bind http to 127.0.0.1 (docs/operators.md, Security)", "http", c.HTTP)
	}
	opts := httpapi.Options{APIKeys: c.apiKeys, PublicMetrics: c.PublicMetrics, SlotPromptSimilarity: c.SlotSimilarity,
		SplitReasoning: c.ReasoningFormat == "deepseek", ReasoningBudgetMessage: c.ReasoningBudgetMessage,
		SPMInfill: c.SPMInfill}
	if c.ReasoningBudget >= 0 {
		n := int32(c.ReasoningBudget)
		opts.ReasoningBudget = &n
	}
	return opts
}

// openHTTP reports whether the HTTP listener can be reached from other
// hosts without an API key.
func (c *Config) openHTTP() bool {
	if c.HTTP == "" || len(c.apiKeys) > 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	local, err := transport.HostLoopbackOnly(ctx, c.HTTP)
	return err != nil || !local
}
