package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// nodeArgs is the line a Hydra node agent writes for the global and
// per-node parameters of real node configurations: --host, --port,
// --rpc-port, then --KEY VALUE, a true boolean as a bare --KEY. template is
// the chat template file.
func nodeArgs(template string) []string {
	return []string{
		"--host", "127.0.0.1", "--port", "8080", "--rpc-port", "9510",
		"--flash-attn", "on", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--kv-unified", "--cont-batching",
		"--cache-prompt", "--cache-reuse", "64", "--prio", "3", "--prio-batch", "1", "--rope-scaling", "yarn",
		"--rope-scale", "5", "--yarn-orig-ctx", "32768", "--reasoning", "on", "--jinja", "--timeout", "1800",
		"--chat-template-kwargs", `{"preserve_thinking": true}`, "--log-prefix", "false", "--metrics", "--slots",
		"--perf", "--log-verbosity", "4", "--context-shift",
		"--model", "/models/qwen3-35b-a3b.gguf", "--chat-template-file", template, "--n-cpu-moe", "8",
		"--n-gpu-layers", "all", "--override-tensor", `token_embd\.weight=CPU,output\.weight=CPU,output_norm\.weight=CPU`,
		"--ctx-size", "320000", "--parallel", "2", "--temp", "0.86", "--repeat-penalty", "1.06", "--top-k", "20",
		"--top-p", "0.95", "--slot-prompt-similarity", "0.4",
	}
}

func templateFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "chat.jinja")
	if err := os.WriteFile(p, []byte("{{ messages }}"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func parseLS(t *testing.T, args ...string) *invocation {
	t.Helper()
	inv, err := parseLlamaServer(args, envOf(nil), io.Discard)
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return inv
}

// The node agent's line becomes these settings, options, sampler defaults
// and one log line for each parameter without effect.
func TestLlamaServerNodeLine(t *testing.T) {
	tmpl := templateFile(t)
	inv := parseLS(t, nodeArgs(tmpl)...)
	c := inv.cfg
	if c.HTTP != "127.0.0.1:8080" || !slices.Equal(c.RPC, []string{"tcp://127.0.0.1:9510"}) || c.Backend != "cuda-llama" ||
		c.Model != "/models/qwen3-35b-a3b.gguf" || c.Slots != 2 || c.LogLevel != "debug" || c.ChunkTimeout != 1800*time.Second ||
		c.SlotSimilarity != 0.4 {
		t.Errorf("settings %+v", c)
	}
	wantOpts := map[string]string{
		"flash_attn": "on", "cache_type_k": "q8_0", "cache_type_v": "q8_0", "kv_unified": "true", "cache_reuse": "64",
		"rope_scaling": "yarn", "rope_scale": "5", "yarn_orig_ctx": "32768", "reasoning": "on", "jinja": "true",
		"chat_template_kwargs": `{"preserve_thinking": true}`, "context_shift": "true", "chat_template_file": tmpl,
		"n_cpu_moe": "8", "n_gpu_layers": "all", "override_tensor": `token_embd\.weight=CPU,output\.weight=CPU,output_norm\.weight=CPU`,
		"n_ctx": "320000", "cache_ram": "8192",
	}
	if !reflect.DeepEqual(c.BackendOpts, wantOpts) {
		t.Errorf("backend options:\n got %v\nwant %v", c.BackendOpts, wantOpts)
	}
	wantSampler := map[string]string{"temperature": "0.86", "repeat_penalty": "1.06", "top_k": "20", "top_p": "0.95"}
	if !reflect.DeepEqual(c.Sampler, wantSampler) {
		t.Errorf("sampler %v, want %v", c.Sampler, wantSampler)
	}
	noEffect := []string{"--cont-batching", "--cache-prompt", "--prio 3", "--prio-batch 1", "--log-prefix false", "--metrics", "--slots", "--perf"}
	for _, p := range noEffect {
		if n := countPrefix(inv.notes, "llama-server "+p+": no effect here: "); n != 1 {
			t.Errorf("%d log lines for %s:\n%s", n, p, strings.Join(inv.notes, "\n"))
		}
	}
	if len(inv.notes) != len(noEffect)+1 || !slices.Contains(inv.notes, "llama-server placement: n_gpu_layers=all n_cpu_moe=8 "+
		`override_tensor=token_embd\.weight=CPU,output\.weight=CPU,output_norm\.weight=CPU (the plugin logs, at debug level, the weights each rule placed and where)`) {
		t.Errorf("notes:\n%s", strings.Join(inv.notes, "\n"))
	}
	if src := inv.sources["slots"]; src != "llama-server --parallel" {
		t.Errorf("slots from %q", src)
	}
}

func countPrefix(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// Short forms, --key=value, '_' for '-', and the switches' spellings read
// as llama-server reads them.
func TestLlamaServerSpellings(t *testing.T) {
	long := parseLS(t, "--model", "m.gguf", "--ctx-size", "4096", "--parallel", "3", "--n-gpu-layers", "20",
		"--override-tensor", `blk\.0\.=CPU`, "--flash-attn", "off", "--threads", "4", "--batch-size", "256", "--ubatch-size", "64")
	for _, args := range [][]string{
		{"-m", "m.gguf", "-c", "4096", "-np", "3", "-ngl", "20", "-ot", `blk\.0\.=CPU`, "-fa", "off", "-t", "4", "-b", "256", "-ub", "64"},
		{"--model=m.gguf", "--ctx-size=4096", "--parallel=3", "--n-gpu-layers=20", `--override-tensor=blk\.0\.=CPU`,
			"--flash-attn=off", "--threads=4", "--batch-size=256", "--ubatch-size=64"},
		{"--model", "m.gguf", "--ctx_size", "4096", "--parallel", "3", "--gpu-layers", "20", "-ot", `blk\.0\.=CPU`,
			"--flash_attn", "off", "--threads", "4", "--batch_size", "256", "--ubatch_size", "64"},
	} {
		inv := parseLS(t, args...)
		if !reflect.DeepEqual(inv.cfg.BackendOpts, long.cfg.BackendOpts) || inv.cfg.Model != "m.gguf" || inv.cfg.Slots != 3 {
			t.Errorf("%q:\n got %v %q %d\nwant %v", args, inv.cfg.BackendOpts, inv.cfg.Model, inv.cfg.Slots, long.cfg.BackendOpts)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--jinja"}, "true"},
		{[]string{"--jinja", "false"}, "false"},
		{[]string{"--jinja", "on", "-c", "64"}, "true"},
		{[]string{"--jinja=off"}, "false"},
		{[]string{"--jinja=1"}, "true"},
		{[]string{"--no-jinja"}, "false"},
		{[]string{"--jinja", "-c", "64"}, "true"},
	} {
		if got := parseLS(t, tc.args...).cfg.BackendOpts["jinja"]; got != tc.want {
			t.Errorf("%q: jinja=%q, want %q", tc.args, got, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		key  string
		want string
	}{
		{[]string{"-fa"}, "flash_attn", "on"},
		{[]string{"-fa", "-c", "64"}, "flash_attn", "on"},
		{[]string{"-fa", "-1"}, "flash_attn", "auto"},
		{[]string{"--flash-attn", "enabled"}, "flash_attn", "on"},
		{[]string{"-kvu"}, "kv_unified", "true"},
		{[]string{"--no-kv-unified"}, "kv_unified", "false"},
		{[]string{"--no-context-shift"}, "context_shift", "false"},
		{[]string{"--no-mmap"}, "use_mmap", "false"},
		{[]string{"-ctk", "Q8_0"}, "cache_type_k", "q8_0"},
		{[]string{"-rea", "off"}, "reasoning", "off"},
		{[]string{"--reasoning", "auto"}, "reasoning", "auto"},
		{[]string{"-ot", "a=CPU", "-ot", "b=CUDA0"}, "override_tensor", "a=CPU,b=CUDA0"},
		{[]string{"-t", "0"}, "n_threads", strconv.Itoa(runtime.NumCPU())},
		{[]string{"-tb", "-1"}, "n_threads_batch", strconv.Itoa(runtime.NumCPU())},
		{[]string{"-ngl", "-1"}, "n_gpu_layers", "-1"},
		{[]string{"-ncmoe", "3"}, "n_cpu_moe", "3"},
		{[]string{"-a", "qwen"}, "alias", "qwen"},
		{[]string{"-cram", "0"}, "cache_ram", "0"},
		{[]string{"--cache-ram", "-1"}, "cache_ram", "-1"},
		{[]string{"--cache-ram", "-5"}, "cache_ram", "-1"},
		{[]string{"--cache-ram=512"}, "cache_ram", "512"},
		{nil, "cache_ram", "8192"},
		{[]string{"--ctx-checkpoints", "8"}, "ctx_checkpoints", "8"},
		{[]string{"-ctxcp", "-3"}, "ctx_checkpoints", "0"},
		{[]string{"--swa-checkpoints=0"}, "ctx_checkpoints", "0"},
		{[]string{"-cms", "1024"}, "checkpoint_min_step", "1024"},
		{[]string{"--checkpoint-ram", "-1"}, "checkpoint_ram", "-1"},
		{[]string{"--spec-draft-rule", "always"}, "draft_rule", "always"},
		{[]string{"--spec-draft-rule=measured"}, "draft_rule", "measured"},
	} {
		if got := parseLS(t, tc.args...).cfg.BackendOpts[tc.key]; got != tc.want {
			t.Errorf("%q: %s=%q, want %q", tc.args, tc.key, got, tc.want)
		}
	}
}

// TestLlamaServerEmbeddings: --embeddings, --reranking (embeddings with
// rank pooling, a later --pooling winning as in llama-server), --pooling,
// --embd-normalize become the plugin's options, --spm-infill the HTTP
// side's.
func TestLlamaServerEmbeddings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want map[string]string
	}{
		{[]string{"--embeddings"}, map[string]string{"embeddings": "true"}},
		{[]string{"--embedding", "false"}, map[string]string{"embeddings": "false"}},
		{[]string{"--reranking"}, map[string]string{"embeddings": "true", "pooling": "rank"}},
		{[]string{"--rerank", "--pooling", "last"}, map[string]string{"embeddings": "true", "pooling": "last"}},
		{[]string{"--reranking", "false"}, map[string]string{}},
		{[]string{"--embeddings", "--pooling", "cls", "--embd-normalize", "-1"}, map[string]string{"embeddings": "true", "pooling": "cls", "embd_normalize": "-1"}},
	} {
		opts := parseLS(t, tc.args...).cfg.BackendOpts
		for _, k := range []string{"embeddings", "pooling", "embd_normalize"} {
			if opts[k] != tc.want[k] {
				t.Errorf("%q: %s=%q, want %q", tc.args, k, opts[k], tc.want[k])
			}
		}
	}
	if !parseLS(t, "--spm-infill").cfg.SPMInfill || parseLS(t).cfg.SPMInfill {
		t.Error("--spm-infill does not set spm_infill, or it is set without it")
	}
}

func TestLlamaServerSampling(t *testing.T) {
	inv := parseLS(t, "--temp", "-1", "--top-k", "0", "--min-p", "0.05", "--repeat-last-n", "-1",
		"--presence-penalty", "0.5", "--frequency-penalty", "0.25", "-s", "42", "-sps", "0")
	want := map[string]string{"temperature": "0", "top_k": "0", "min_p": "0.05", "repeat_last_n": "-1",
		"presence_penalty": "0.5", "frequency_penalty": "0.25", "seed": "42"}
	if !reflect.DeepEqual(inv.cfg.Sampler, want) || inv.cfg.SlotSimilarity != 0 {
		t.Errorf("sampler %v (want %v), slot_prompt_similarity %v", inv.cfg.Sampler, want, inv.cfg.SlotSimilarity)
	}
	// The reasoning budget is the HTTP side's default for every chat reply.
	if c := parseLS(t).cfg; c.ReasoningBudget != -1 || httpOptions(&c, hclog.NewNullLogger()).ReasoningBudget != nil {
		t.Errorf("no --reasoning-budget: %d", c.ReasoningBudget)
	}
	c := parseLS(t, "--reasoning-budget", "0", "--reasoning-budget-message", "Time to answer.").cfg
	if o := httpOptions(&c, hclog.NewNullLogger()); o.ReasoningBudget == nil || *o.ReasoningBudget != 0 || o.ReasoningBudgetMessage != "Time to answer." {
		t.Errorf("--reasoning-budget 0: %+v", o)
	}
	for _, seed := range []string{"-1", "4294967295"} { // random: the engine's default
		if s := parseLS(t, "--seed", seed).cfg.Sampler; len(s) != 0 {
			t.Errorf("--seed %s: sampler %v", seed, s)
		}
	}
}

// Listeners: HTTP on --host/--port (llama-server's 127.0.0.1:8080 when not
// given), Hydra RPC on --rpc-port of the same host and nowhere without it,
// under the engine's rules for who may connect.
func TestLlamaServerListeners(t *testing.T) {
	inv := parseLS(t)
	if inv.cfg.HTTP != "127.0.0.1:8080" || len(inv.cfg.RPC) != 0 || inv.sources["rpc"] != "default (llama-server mode: none without --rpc-port)" ||
		!slices.Contains(inv.notes, "llama-server mode: no Hydra RPC listener: none is opened without --rpc-port (or HYDRA_RPC)") {
		t.Errorf("defaults: http %q, rpc %v from %q, notes %q", inv.cfg.HTTP, inv.cfg.RPC, inv.sources["rpc"], inv.notes)
	}
	if inv, err := parseLlamaServer(nil, envOf(map[string]string{"HYDRA_RPC": "unix:///run/e.sock"}), io.Discard); err != nil ||
		!slices.Equal(inv.cfg.RPC, []string{"unix:///run/e.sock"}) {
		t.Errorf("HYDRA_RPC in llama-server mode: %v, %v", inv, err)
	}
	inv = parseLS(t, "--host", "::1", "--port", "18080", "--rpc-port", "19510")
	if inv.cfg.HTTP != "[::1]:18080" || !slices.Equal(inv.cfg.RPC, []string{"tcp://[::1]:19510"}) {
		t.Errorf("IPv6: http %q, rpc %v", inv.cfg.HTTP, inv.cfg.RPC)
	}
	open := []string{"--host", "0.0.0.0", "--port", "8080", "--rpc-port", "9510"}
	// The refusal gives the line a node configuration needs.
	if _, err := parseLlamaServer(open, envOf(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "can be reached from other hosts") ||
		!strings.Contains(err.Error(), "add under llama.params the line\n    rpc-allow: 10.0.0.0/8\n") {
		t.Errorf("open RPC without access rules: %v", err)
	}
	if _, err := parseInvocation([]string{"--rpc", "tcp://0.0.0.0:9510"}, envOf(nil), io.Discard); err == nil || strings.Contains(err.Error(), "llama.params") {
		t.Errorf("open RPC outside llama-server mode: %v", err)
	}
	inv = parseLS(t, append(open, "--rpc-allow", "10.0.0.0/8,192.168.7.21", "--api-key", "k1,k2", "--api-key", "k3")...)
	if !slices.Equal(inv.cfg.RPCAllow, []string{"10.0.0.0/8", "192.168.7.21"}) || !slices.Equal(inv.cfg.APIKey, []string{"k1", "k2", "k3"}) {
		t.Errorf("rpc_allow %v, api_key %v", inv.cfg.RPCAllow, inv.cfg.APIKey)
	}
	if inv := parseLS(t, append(open, "--rpc-insecure")...); !inv.cfg.RPCInsecure {
		t.Error("--rpc-insecure")
	}
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if inv := parseLS(t, "--api-key-file", keys); !slices.Equal(inv.cfg.apiKeys, []string{"secret"}) {
		t.Errorf("api key file: %v", inv.cfg.apiKeys)
	}
}

// The HYDRA_* variables and the file apply beneath the command line.
func TestLlamaServerEnvironment(t *testing.T) {
	file := writeFile(t, "log_format: json\nslots: 9\n")
	env := map[string]string{"HYDRA_CONFIG": file, "HYDRA_BACKEND": "mock", "HYDRA_SLOTS": "6", "HYDRA_BACKEND_OPTS": "n_ctx=64,alias=x"}
	inv, err := parseLlamaServer([]string{"--parallel", "2", "-c", "128"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := inv.cfg; c.Slots != 2 || c.Backend != "mock" || c.LogFormat != "json" || c.BackendOpts["n_ctx"] != "128" || c.BackendOpts["alias"] != "x" {
		t.Errorf("%+v", c)
	}
	if inv.sources["backend_opts"] != "env HYDRA_BACKEND_OPTS, llama-server --ctx-size" {
		t.Errorf("backend_opts from %q", inv.sources["backend_opts"])
	}
}

func TestLlamaServerErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.ini")
	if err := os.WriteFile(bad, []byte("[qwen]\nmodel = /m.gguf\nthis is not a line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--frobnicate", "1"}, "unknown parameter --frobnicate"},
		{[]string{"--slots-count"}, "unknown parameter --slots-count"},
		{[]string{"model.gguf"}, `unexpected argument "model.gguf"`},
		{[]string{"--ctx-size"}, "--ctx-size: expects a value"},
		{[]string{"--ctx-size", "lots"}, "llama-server --ctx-size lots: not an integer"},
		{[]string{"--ctx-size", "0"}, "0 (the model's training context) is not supported"},
		{[]string{"--parallel", "0"}, "--parallel 0: must be at least 1"},
		{[]string{"--cache-ram", "8G"}, "--cache-ram 8G: not an integer"},
		{[]string{"--checkpoint-min-step", "-1"}, "--checkpoint-min-step -1"},
		{[]string{"--ctx-checkpoints", "many"}, "--ctx-checkpoints many: not an integer"},
		{[]string{"-ngl", "auto"}, "auto (fitting the model to free memory) is not done here"},
		{[]string{"-fa", "maybe"}, "want on, off or auto"},
		{[]string{"--jinja=perhaps"}, "want a boolean"},
		{[]string{"--no-ctx-size", "4"}, "unknown parameter --no-ctx-size"},
		{[]string{"--chat-template-kwargs", "[1]"}, "want a JSON object"},
		{[]string{"--chat-template-file", "/nonexistent/t.jinja"}, "no such file"},
		{[]string{"--rope-scaling", "ntk"}, "want none, linear or yarn"},
		{[]string{"--port", "70000"}, "at most 65535"},
		{[]string{"--host", "/run/llama.sock"}, "HTTP on a Unix socket is not served here"},
		{[]string{"--temp", "warm"}, "--temp warm: not a number"},
		{[]string{"--top-p", "1.5"}, "top_p must be in (0, 1]"},
		{[]string{"--seed", "-5"}, "want -1 or a seed"},
		{[]string{"-sps", "2"}, "slot_prompt_similarity must be in [0, 1]"},
		{[]string{"--reasoning-budget", "-2"}, "--reasoning-budget -2: must be at least -1"},
		{[]string{"--reasoning-budget", "many"}, "--reasoning-budget many: not an integer"},
		{[]string{"--reasoning-budget", "4294967296"}, "reasoning_budget must be -1 (unbounded) or a count of tokens"},
		{[]string{"--models-preset", bad}, "bad.ini:3: \"this is not a line\" is not key = value"},
		{[]string{"--models-preset", "/nonexistent.ini"}, "no such file"},
		{[]string{"--pooling", "max"}, "--pooling max: want none, mean, cls, last or rank"},
		{[]string{"--embd-normalize", "-2"}, "--embd-normalize -2: must be at least -1"},
	} {
		_, err := parseLlamaServer(tc.args, envOf(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// Router mode's presets become models to switch to: each section's keys
// read as llama-server's parameters over [*]'s and the command line's
// backend options; the section's name is the alias unless it sets one.
func TestLlamaServerPresets(t *testing.T) {
	ini := filepath.Join(t.TempDir(), "preset.ini")
	text := "; presets\nversion = 1\n[*]\nctx-size = 8192 # global\n\n[qwen3-moe]\nmodel = /m/q.gguf\nn-cpu-moe = 8\n[ small ]\nmodel=/m/s.gguf\r\nalias = tiny\nkv-unified = true\n"
	if err := os.WriteFile(ini, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := readPresetFile(ini)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.global, map[string]string{"ctx-size": "8192"}) || f.presets["qwen3-moe"]["n-cpu-moe"] != "8" ||
		f.presets["small"]["model"] != "/m/s.gguf" || !slices.Equal(f.names(), []string{"default", "qwen3-moe", "small"}) {
		t.Errorf("parsed %+v", f)
	}
	inv := parseLS(t, "--models-preset", ini, "--models-max", "2", "--cache-type-k", "q8_0", "--rpc-port", "9510")
	want := []modelPreset{
		{alias: "qwen3-moe", model: "/m/q.gguf", opts: map[string]string{"n_ctx": "8192", "n_cpu_moe": "8", "cache_type_k": "q8_0", "kv_unified": "false",
			"cache_ram": "8192", "alias": "qwen3-moe"}},
		{alias: "tiny", model: "/m/s.gguf", opts: map[string]string{"n_ctx": "8192", "cache_type_k": "q8_0", "kv_unified": "true",
			"cache_ram": "8192", "alias": "tiny"}},
	}
	if !reflect.DeepEqual(inv.cfg.presets, want) {
		t.Errorf("presets %+v\nwant %+v", inv.cfg.presets, want)
	}
	if len(inv.notes) != 2 || !strings.Contains(inv.notes[0], "2 presets") && !strings.Contains(inv.notes[0], "3 presets") ||
		!strings.Contains(inv.notes[1], "--models-max 2: no effect here: one model is resident at a time") {
		t.Errorf("notes:\n%s", strings.Join(inv.notes, "\n"))
	}
	refusesPreset(t, "[m]\nn-cpu-moe = 2\n", "names no model")
}

// refusesPreset checks that a presets file of text stops the mode with an
// error saying want.
func refusesPreset(t *testing.T, text, want string) {
	t.Helper()
	ini := filepath.Join(t.TempDir(), "preset.ini")
	if err := os.WriteFile(ini, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseLlamaServer([]string{"--models-preset", ini}, envOf(nil), io.Discard); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("presets %q: %v, want %q", text, err, want)
	}
}

// The mode is chosen by the subcommand or by the executable's name.
func TestLlamaServerMode(t *testing.T) {
	for _, argv := range [][]string{
		{"hydra-engine", "llama-server", "--parallel", "3"},
		{"/usr/local/bin/llama-server", "--parallel", "3"},
		{"llama-server", "-np", "3"},
		{"/llama/bin/llama-engine", "--parallel", "3"}, // the Hydra fork's binary, as node configurations name it
		{"hydra-engine", "llama-engine", "-np", "3"},
	} {
		inv, err := parseCommandLine(argv, envOf(nil), io.Discard)
		if err != nil || inv.cfg.Slots != 3 || inv.cfg.HTTP != "127.0.0.1:8080" || inv.cfg.Backend != "cuda-llama" {
			t.Errorf("%q: %+v, %v", argv, inv, err)
		}
	}
	inv, err := parseCommandLine([]string{"hydra-engine", "--slots", "3"}, envOf(nil), io.Discard)
	if err != nil || inv.cfg.Slots != 3 || inv.cfg.HTTP != "" || inv.cfg.Backend != "mock" {
		t.Errorf("the engine's own flags: %+v, %v", inv, err)
	}
	if _, err := parseCommandLine([]string{"hydra-engine", "--parallel", "3"}, envOf(nil), io.Discard); err == nil {
		t.Error("llama-server's --parallel accepted by the engine's own flags")
	}
}

// Both helps name the mode; llama-server's lists every parameter and the
// docs page.
func TestLlamaServerHelp(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseInvocation([]string{"--help"}, envOf(nil), &out); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(out.String(), "hydra-engine llama-server [llama-server flags]") {
		t.Errorf("hydra-engine --help: %v\n%s", err, out.String())
	}
	// The llama plugin's options, from the table that parses them.
	if !strings.Contains(out.String(), "backend options of cuda-llama") || !strings.Contains(out.String(), llamaopt.Help()) ||
		!strings.Contains(llamaopt.Help(), "  "+llamaopt.OptCtxCheckpoints+" ") {
		t.Errorf("hydra-engine --help leaves out the llama plugin's options:\n%s", out.String())
	}
	out.Reset()
	if _, err := parseCommandLine([]string{"hydra-engine", "llama-server", "--help"}, envOf(nil), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("llama-server --help: %v", err)
	}
	for _, p := range llamaServerParams() {
		if !strings.Contains(out.String(), "  "+strings.Join(p.names, ", ")) {
			t.Errorf("--help lacks %s", p.names[0])
		}
	}
	if !strings.Contains(out.String(), "docs/llama-server.md") || !strings.Contains(out.String(), "no effect here: the engine leaves scheduling priority") {
		t.Errorf("--help:\n%s", out.String())
	}
}

// docs/llama-server.md's table has a row for every parameter, and only for
// parameters the mode knows.
func TestLlamaServerDocTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/llama-server.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for line := range strings.Lines(string(doc)) {
		if name, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ = strings.Cut(name, "`")
			rows[strings.Fields(name)[0]] = true
		}
	}
	known := map[string]bool{}
	for _, p := range llamaServerParams() {
		known[p.names[0]] = true
		if !rows[p.names[0]] {
			t.Errorf("docs/llama-server.md has no row for %s", p.names[0])
		}
	}
	for name := range rows {
		if !known[name] {
			t.Errorf("docs/llama-server.md has a row for %s, which the mode does not know", name)
		}
	}
}

// The shutdown grace of this mode fits the node agent's stop (SIGKILL 10 s
// after SIGTERM); a longer one given beneath the command line is kept and
// warned about.
func TestLlamaServerShutdownGrace(t *testing.T) {
	inv := parseLS(t)
	if inv.cfg.ShutdownGrace != 5*time.Second || len(inv.warnings) != 0 {
		t.Errorf("grace %v, warnings %q", inv.cfg.ShutdownGrace, inv.warnings)
	}
	if d := inv.cfg.ShutdownGrace + httpCutWait + pluginExitWait; d >= nodeAgentStopWait {
		t.Errorf("the default grace leaves the stop %v of the agent's %v", d, nodeAgentStopWait)
	}
	inv, err := parseLlamaServer(nil, envOf(map[string]string{"HYDRA_SHUTDOWN_GRACE": "30s"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if inv.cfg.ShutdownGrace != 30*time.Second || len(inv.warnings) != 1 ||
		!strings.HasPrefix(inv.warnings[0], "shutdown_grace 30s (env HYDRA_SHUTDOWN_GRACE): a node agent that sends SIGTERM kills the engine 10s later") {
		t.Errorf("grace %v, warnings %q", inv.cfg.ShutdownGrace, inv.warnings)
	}
	var help bytes.Buffer
	if _, err := parseLlamaServer([]string{"--help"}, envOf(nil), &help); !errors.Is(err, flag.ErrHelp) ||
		!strings.Contains(help.String(), "requests in progress get 5s (HYDRA_SHUTDOWN_GRACE), then are cut") ||
		!strings.Contains(help.String(), "Hydra RPC only with\n--rpc-port") {
		t.Errorf("--help: %v\n%s", err, help.String())
	}
}

// llama-engine's three parameters, as node-rtx.yaml and node-rtx3060.yaml
// give them: the pattern passed on as the plugin's combined_pattern, the
// peer's port lending on the loopback address, the head following its
// peer; what each does said at start.
func TestLlamaEngineParams(t *testing.T) {
	pattern := `blk\.([0-9]+)\.ffn_.*_exps\.weight=CPU`
	head := parseLS(t, "--ggml-rpc-port", "9505", "--rpc-engine", "localhost:9506", "--combined-ot-pattern", pattern)
	if head.cfg.BackendOpts["combined_pattern"] != pattern || head.sources["backend_opts"] != "llama-server --combined-ot-pattern" {
		t.Errorf("options %v from %q", head.cfg.BackendOpts, head.sources["backend_opts"])
	}
	if head.cfg.LendWeights != "127.0.0.1:9505" || head.cfg.CombinedPeer != "localhost:9506" ||
		head.sources["lend_weights"] != "llama-server --ggml-rpc-port" || head.sources["combined_peer"] != "llama-server --rpc-engine" {
		t.Errorf("lend_weights %q, combined_peer %q, from %q and %q", head.cfg.LendWeights, head.cfg.CombinedPeer, head.sources["lend_weights"], head.sources["combined_peer"])
	}
	if len(head.warnings) != 0 || !slices.ContainsFunc(head.notes, func(n string) bool {
		return strings.HasPrefix(n, "llama-engine --ggml-rpc-port 9505: lending this engine's weights to combined heads of this host on 127.0.0.1:9505")
	}) || !slices.ContainsFunc(head.notes, func(n string) bool {
		return strings.HasPrefix(n, "llama-engine --combined-ot-pattern "+pattern+": passed to the plugin as combined_pattern")
	}) {
		t.Errorf("warnings %q, notes:\n%s", head.warnings, strings.Join(head.notes, "\n"))
	}

	peer := parseLS(t, "--ggml-rpc-port", "9506")
	if peer.cfg.LendWeights != "127.0.0.1:9506" || peer.cfg.CombinedPeer != "" || len(peer.warnings) != 0 {
		t.Errorf("the peer: lend %q, peer %q, warnings %q", peer.cfg.LendWeights, peer.cfg.CombinedPeer, peer.warnings)
	}
	alone := parseLS(t, "--combined-ot-pattern", pattern)
	if !slices.ContainsFunc(alone.notes, func(n string) bool { return strings.Contains(n, "no effect here without a peer") }) {
		t.Errorf("a pattern without a peer: notes %q", alone.notes)
	}
	if w := parseLS(t, "--rpc-engine", "[::1]:9506").warnings; len(w) != 1 || !strings.Contains(w[0], "without --combined-ot-pattern") {
		t.Errorf("a peer without a pattern: warnings %q", w)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ggml-rpc-port", "0"}, "--ggml-rpc-port 0: must be at least 1"},
		{[]string{"--ggml-rpc-port", "65536"}, "at most 65535"},
		{[]string{"--ggml-rpc-port", "x"}, "not an integer"},
		{[]string{"--rpc-engine", "localhost"}, "want HOST:PORT, the peer's ggml-RPC server"},
		{[]string{"--rpc-engine", ":9506"}, "want HOST:PORT"},
		{[]string{"--rpc-engine", "localhost:99999"}, `port "99999": not a port: at most 65535`},
		{[]string{"--combined-ot-pattern", `blk\.[0-9]+\.ffn_.*_exps`}, "want REGEX=DEVICE"},
		{[]string{"--combined-ot-pattern", "=CPU"}, "the regular expression before '=' is empty"},
		{[]string{"--combined-ot-pattern", `blk\.(0=CPU`}, `"blk\\.(0" is not a regular expression (RE2 syntax`},
		{[]string{"--combined-ot-pattern", `(?=exps)=CPU`}, "not a regular expression (RE2 syntax, no backreferences or lookaround)"},
		{[]string{"--combined-ot-pattern", strings.Repeat("a", 1100) + "=CPU"}, "1104 bytes: at most 1024"},
		{[]string{"--combined-ot-pattern", "exps=CPU 1"}, "want REGEX=DEVICE"},
	} {
		_, err := parseLlamaServer(tc.args, envOf(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	refusesPreset(t, "[m]\nmodel = /m.gguf\nrpc-engine = localhost:9506\n", "are the engine's, not a model's")
}

// Every backend option a llama-server parameter can set is one the mock
// loads (its own, or one of mock.LlamaServerOptions, without effect), so
// that the node configurations run on the mock as the tests run them, or
// one it refuses by name (mock.SpecOptions: speculative decoding). Each
// parameter is tried with values until one is accepted.
func TestLlamaServerOptionsOnMock(t *testing.T) {
	tmpl := templateFile(t)
	values := []string{"1", "on", "true", "all", "yarn", "q8_0", "1.5", "auto", tmpl, `{"a": 1}`, `blk\.0\.=CPU`, "localhost:1", "deepseek"}
	known := append(slices.Clone(mock.LlamaServerOptions), mock.OptAlias, mock.OptCacheRAM, mock.OptKVBytesPerToken, mock.OptKVUnified, mock.OptNCtx, mock.OptOpDelayMS,
		mock.OptEmbeddings, mock.OptPooling, mock.OptEmbdNormalize)
	for _, p := range llamaServerParams() {
		for _, v := range values {
			ls := &lsArgs{settings: map[string]any{}, opts: map[string]string{}, sampler: map[string]string{}, setBy: map[string][]string{}, noted: map[string]bool{}}
			if p.apply == nil || p.apply(ls, v) != nil {
				continue
			}
			for k := range ls.opts {
				if slices.Contains(mock.SpecOptions, k) {
					if _, err := mock.New(hclog.NewNullLogger()).Load(context.Background(), iface.LoadRequest{NSlots: 1, Options: map[string]string{k: v}}); err == nil ||
						!strings.Contains(err.Error(), "no speculative decoding") {
						t.Errorf("%s %s: the mock loads %s=%s (%v), want a refusal naming speculative decoding", p.names[0], v, k, v, err)
					}
					continue
				}
				if !slices.Contains(known, k) {
					t.Errorf("%s %s sets backend option %s, which the mock refuses (mock.LlamaServerOptions)", p.names[0], v, k)
				}
			}
			break
		}
	}
	if _, err := mock.New(nil).Load(context.Background(), iface.LoadRequest{Options: parseLS(t, nodeArgs(tmpl)...).cfg.BackendOpts}); err != nil {
		t.Errorf("the node line's options on the mock: %v", err)
	}
}

// llama-server's LLAMA_* variables, which node configurations set beside
// the parameters, are each said at start to have no effect, without their
// values.
func TestLlamaEnvNotes(t *testing.T) {
	notes := llamaEnvNotes([]string{"PATH=/bin", `LLAMA_CHAT_TEMPLATE_KWARGS={"preserve_thinking": true}`, "LLAMA_API_KEY=secret", "HYDRA_RPC=x", "LD_LIBRARY_PATH=/llama/bin"})
	if len(notes) != 2 || !strings.HasPrefix(notes[0], "environment LLAMA_API_KEY: no effect here: ") ||
		!strings.HasPrefix(notes[1], "environment LLAMA_CHAT_TEMPLATE_KWARGS: no effect here: llama-server mode reads") ||
		strings.Contains(strings.Join(notes, ""), "secret") {
		t.Errorf("notes %q", notes)
	}
}

// llama-server's speculative-decoding parameters become the llama plugin's
// draft options, under each of their spellings.
func TestLlamaServerSpec(t *testing.T) {
	draft := filepath.Join(t.TempDir(), "draft.gguf")
	if err := os.WriteFile(draft, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"draft_model": draft, "spec_type": "draft-simple,ngram-mod", "draft_max": "8", "draft_min": "2",
		"draft_p_min": "0.75", "draft_n_gpu_layers": "-1", "spec_ngram_simple_size_n": "4", "spec_ngram_map_k_size_m": "16"}
	for _, args := range [][]string{
		{"--spec-draft-model", draft, "--spec-type", "draft-simple", "--spec-type", "ngram-mod", "--spec-draft-n-max", "8",
			"--spec-draft-n-min", "2", "--spec-draft-p-min", "0.75", "--spec-draft-ngl", "all",
			"--spec-ngram-simple-size-n", "4", "--spec-ngram-map-k-size-m", "16"},
		{"-md", draft, "--spec-type", "draft-simple,ngram-mod", "--spec-draft-n-max=8", "--spec-draft-n-min", "2",
			"--draft-p-min", "0.75", "-ngld", "-1", "--spec-ngram-simple-size-n", "4", "--spec-ngram-map-k-size-m", "16"},
	} {
		inv := parseLS(t, append([]string{"--model", "m.gguf"}, args...)...)
		for k, v := range want {
			if got := inv.cfg.BackendOpts[k]; got != v {
				t.Errorf("%q: %s=%q, want %q", args, k, got, v)
			}
		}
	}
	for _, bad := range [][]string{{"-ngld", "auto"}, {"--draft-max", "4"}, {"--spec-draft-n-max", "0"}, {"--spec-draft-rule", "often"}, {"-md", filepath.Join(t.TempDir(), "none.gguf")}} {
		if _, err := parseLlamaServer(append([]string{"--model", "m.gguf"}, bad...), envOf(nil), io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
