package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/host"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hydra-engine.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigDefaults(t *testing.T) {
	inv, err := parseInvocation(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(inv.cfg, defaultConfig()) {
		t.Errorf("no configuration: %+v", inv.cfg)
	}
	// The documented defaults of the flags before this configuration layer.
	c := inv.cfg
	if c.RPC[0] != "tcp://127.0.0.1:9510" || c.Slots != 4 || c.IdleTimeout != 120*time.Second ||
		c.ChunkTimeout != 900*time.Second || c.ShutdownGrace != 30*time.Second || c.DataPlane != "auto" ||
		c.Backend != "mock" || c.LogFormat != "text" || c.LogLevel != "info" || c.HTTP != "" {
		t.Errorf("defaults changed: %+v", c)
	}
}

func TestConfigPrecedence(t *testing.T) {
	file := writeFile(t, `
rpc: [tcp://127.0.0.1:1, unix:///tmp/f.sock]
http: 127.0.0.1:8081
slots: 8
model: /models/file.gguf
idle_timeout: 1m
state_chunk_size: 1048576
backend_opts:
  kv_bytes_per_token: 131072
  alias: from-file
`)
	env := map[string]string{
		"HYDRA_CONFIG":       file,
		"HYDRA_SLOTS":        "6",
		"HYDRA_HTTP":         "127.0.0.1:8082",
		"HYDRA_RPC":          "tcp://127.0.0.1:2,tcp://127.0.0.1:3",
		"HYDRA_BACKEND_OPTS": "alias=from-env, n_ctx=4096",
		"HYDRA_DATA_PLANE":   "grpc",
		"HYDRA_COORD_OTHER":  "ignored: not an engine setting",
	}
	args := []string{"--slots", "2", "--backend-opt", "alias=from-flag", "--rpc", "unix:///tmp/flag.sock", "--chunk-timeout", "5m"}
	inv, err := parseInvocation(args, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := inv.cfg
	for _, check := range []struct {
		what      string
		got, want any
		source    string
	}{
		{"slots: flag over env over file", c.Slots, 2, "flag --slots"},
		{"rpc: a flag list replaces the env list", c.RPC, []string{"unix:///tmp/flag.sock"}, "flag --rpc"},
		{"http: env over file", c.HTTP, "127.0.0.1:8082", "env HYDRA_HTTP"},
		{"data_plane: env over default", c.DataPlane, "grpc", "env HYDRA_DATA_PLANE"},
		{"model: file over default", c.Model, "/models/file.gguf", "file " + file},
		{"idle_timeout: file", c.IdleTimeout, time.Minute, "file " + file},
		{"state_chunk_size: file", c.StateChunkSize, uint64(1 << 20), "file " + file},
		{"chunk_timeout: flag", c.ChunkTimeout, 5 * time.Minute, "flag --chunk-timeout"},
		{"shutdown_grace: default", c.ShutdownGrace, 30 * time.Second, "default"},
		{"backend_opts merge key by key", c.BackendOpts,
			map[string]string{"kv_bytes_per_token": "131072", "n_ctx": "4096", "alias": "from-flag"},
			"file " + file + ", env HYDRA_BACKEND_OPTS, flag --backend-opt"},
	} {
		if !reflect.DeepEqual(check.got, check.want) {
			t.Errorf("%s: got %v, want %v", check.what, check.got, check.want)
		}
		key := strings.SplitN(check.what, ":", 2)[0]
		key = strings.Fields(key)[0]
		if inv.sources[key] != check.source {
			t.Errorf("%s: source %q, want %q", check.what, inv.sources[key], check.source)
		}
	}

	// Every flag keeps its own value (two of one type in one command line).
	inv, err = parseInvocation([]string{"--log-level", "warn", "--backend", "/opt/p", "--slots", "5", "--socket-buffer", "3",
		"--idle-timeout", "1s", "--shutdown-grace", "2s"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := inv.cfg; c.LogLevel != "warn" || c.Backend != "/opt/p" || c.Slots != 5 || c.SocketBuffer != 3 ||
		c.IdleTimeout != time.Second || c.ShutdownGrace != 2*time.Second || c.HTTP != "" || c.LogFormat != "text" {
		t.Errorf("flags of one type mixed up: %+v", c)
	}

	// --config beats HYDRA_CONFIG.
	other := writeFile(t, "slots: 3\n")
	inv, err = parseInvocation([]string{"--config", other}, envOf(map[string]string{"HYDRA_CONFIG": file}), io.Discard)
	if err != nil || inv.cfg.Slots != 3 || inv.cfg.HTTP != "" {
		t.Errorf("--config over HYDRA_CONFIG: %+v %v", inv, err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		file string
		env  map[string]string
		args []string
		want string
	}{
		{file: "slotz: 3\n", want: "invalid keys: slotz"},
		{file: "idle_timeout: 120\n", want: "give a unit"},
		{file: "slots: [1]\n", want: "slots"},
		{file: ": : :\n", want: "config file"},
		{env: map[string]string{"HYDRA_SLOTS": "many"}, want: "environment"},
		{env: map[string]string{"HYDRA_IDLE_TIMEOUT": "soon"}, want: `"soon" is not a duration`},
		{env: map[string]string{"HYDRA_BACKEND_OPTS": "novalue"}, want: "not key=value"},
		{args: []string{"--backend-opt", "=v"}, want: "not key=value"},
		{args: []string{"--slots", "0"}, want: "slots must be in [1, 256]"},
		{args: []string{"--slots", "257"}, want: "slots must be in [1, 256]"},
		{args: []string{"--data-plane", "rdma"}, want: "data_plane must be auto, shm or grpc"},
		{args: []string{"--ring-depth", "4"}, want: "--ring-depth is no longer a setting: the shm data plane sizes its ring itself"},
		{args: []string{"--splice-put=false"}, want: "--splice-put is no longer a setting"},
		{args: []string{"-relay-unix"}, want: "--relay-unix is no longer a setting"},
		{file: "splice_pipes: 2\n", want: "splice_pipes is no longer a setting"},
		{env: map[string]string{"HYDRA_PUT_WARM_KIB": "0"}, want: "HYDRA_PUT_WARM_KIB is no longer a setting"},
		{args: []string{"--log-format", "xml"}, want: "log_format"},
		{args: []string{"--log-level", "loud"}, want: "log_level"},
		{args: []string{"--state-chunk-size", "1024"}, want: "state_chunk_size must be in"},
		{args: []string{"--idle-timeout", "0s"}, want: "idle_timeout must be positive"},
		{args: []string{"extra"}, want: "unexpected arguments"},
		{args: []string{"--config", "/nonexistent/hydra.yaml"}, want: "no such file"},
	} {
		env := map[string]string{}
		for k, v := range c.env {
			env[k] = v
		}
		if c.file != "" {
			env["HYDRA_CONFIG"] = writeFile(t, c.file)
		}
		_, err := parseInvocation(c.args, envOf(env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("file %q env %v args %q: %v, want %q", c.file, c.env, c.args, err, c.want)
		}
	}
	if _, err := parseInvocation([]string{"-h"}, envOf(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// --print-config writes a file --config reads back to the same configuration.
func TestPrintConfigRoundTrip(t *testing.T) {
	env := map[string]string{"HYDRA_SLOTS": "7", "HYDRA_BACKEND_OPTS": "alias=a b,n_ctx=64"}
	inv, err := parseInvocation([]string{"--rpc", "tcp://127.0.0.1:1", "--rpc", "unix:///tmp/s.sock", "--idle-timeout", "90s"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printConfig(&out, inv); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"slots: 7 # env HYDRA_SLOTS", "idle_timeout: 1m30s # flag --idle-timeout",
		"rpc: # flag --rpc\n  - tcp://127.0.0.1:1\n  - unix:///tmp/s.sock", "shutdown_grace: 30s # default"} {
		if !strings.Contains(text, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, text)
		}
	}
	back, err := parseInvocation([]string{"--config", writeFile(t, text)}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatalf("reading the printed configuration: %v\n%s", err, text)
	}
	if !reflect.DeepEqual(back.cfg, inv.cfg) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back.cfg, inv.cfg)
	}
}

// The example configuration shipped in deploy/ is valid and spells out the
// defaults (apart from enabling HTTP).
func TestDeployConfigExample(t *testing.T) {
	inv, err := parseInvocation([]string{"--config", "../../deploy/hydra-engine.yaml"}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := defaultConfig()
	want.HTTP = "127.0.0.1:8080"
	if !reflect.DeepEqual(inv.cfg, want) {
		t.Errorf("deploy/hydra-engine.yaml:\n got %+v\nwant %+v", inv.cfg, want)
	}
}

// TestRPCAccess: an RPC listener other hosts can reach is refused unless
// rpc_allow, client certificates or rpc_insecure say who may connect; the
// error names all three.
func TestRPCAccess(t *testing.T) {
	tlsFlags := []string{"--tls-cert", "c.pem", "--tls-key", "k.pem"}
	for _, c := range []struct {
		args []string
		env  map[string]string
		err  string // "" accepted
	}{
		{args: []string{"--rpc", "tcp://0.0.0.0:9510"}, err: "Hydra RPC has no credentials"},
		{args: []string{"--rpc", "tcp://:9510"}, err: "can be reached from other hosts"},
		{args: []string{"--rpc", "tcp://[::]:9510"}, err: "can be reached from other hosts"},
		{args: []string{"--rpc", "tcp://192.0.2.7:9510"}, err: "can be reached from other hosts"},
		{args: []string{"--rpc", "unix:///tmp/h.sock", "--rpc", "tcp://0.0.0.0:9510"}, err: "tcp://0.0.0.0:9510"},
		{args: append([]string{"--rpc", "tls://0.0.0.0:9511"}, tlsFlags...), err: "without tls_client_ca TLS authenticates no client"},
		{args: []string{"--rpc", "tcp://0.0.0.0:9510", "--rpc-allow", "10.0.0.0/8"}},
		{args: []string{"--rpc", "tcp://0.0.0.0:9510", "--rpc-insecure"}},
		{args: []string{"--rpc", "tcp://0.0.0.0:9510"}, env: map[string]string{"HYDRA_RPC_ALLOW": "10.0.0.1, 10.0.0.2"}},
		{args: []string{"--rpc", "tcp://0.0.0.0:9510"}, env: map[string]string{"HYDRA_RPC_INSECURE": "true"}},
		{args: append([]string{"--rpc", "tls://0.0.0.0:9511", "--tls-client-ca", "ca.pem"}, tlsFlags...)},
		{args: append([]string{"--rpc", "tls://0.0.0.0:9511", "--rpc", "tcp://0.0.0.0:9510", "--tls-client-ca", "ca.pem"}, tlsFlags...),
			err: "tcp://0.0.0.0:9510 can be reached"}, // mTLS on one listener does not cover another
		{args: []string{"--rpc", "tcp://127.0.0.1:9510", "--rpc", "tcp://[::1]:9511", "--rpc", "unix:///tmp/h.sock"}},
		{args: []string{"--rpc", "tcp://localhost:9510"}},
		{args: []string{"--rpc-allow", "10.0.0.0/33"}, err: "rpc_allow: allow-list entry"},
		{args: []string{"--rpc-allow", "db.example"}, err: "rpc_allow: allow-list entry"},
	} {
		_, err := parseInvocation(c.args, envOf(c.env), io.Discard)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%q %v: %v", c.args, c.env, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q %v: error %v, want %q", c.args, c.env, err, c.err)
		case c.err != "" && strings.Contains(c.err, "reach"):
			for _, way := range []string{"--rpc-allow", "--tls-client-ca", "--rpc-insecure"} {
				if !strings.Contains(err.Error(), way) {
					t.Errorf("%q: the error does not name %s: %v", c.args, way, err)
				}
			}
		}
	}
}

// TestAPIKeys: --api-key and the lines of --api-key-file (blank lines and
// # comments skipped) are the keys; a missing, unreadable or keyless file
// and an empty key are errors.
func TestAPIKeys(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	os.WriteFile(file, []byte("# coordinator\nkey-from-file\r\n\n   \n  # old: revoked\n\tsecond-file-key  \n"), 0o600)
	inv, err := parseInvocation([]string{"--api-key", "flag-key", "--api-key-file", file}, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"flag-key", "key-from-file", "second-file-key"}; !reflect.DeepEqual(inv.cfg.apiKeys, want) {
		t.Errorf("keys %q, want %q", inv.cfg.apiKeys, want)
	}
	inv, err = parseInvocation(nil, envOf(map[string]string{"HYDRA_API_KEY_FILE": file}), io.Discard)
	if err != nil || len(inv.cfg.apiKeys) != 2 {
		t.Errorf("HYDRA_API_KEY_FILE: %q %v", inv.cfg.apiKeys, err)
	}
	if inv, err := parseInvocation(nil, envOf(nil), io.Discard); err != nil || inv.cfg.apiKeys != nil {
		t.Errorf("no keys: %q %v", inv.cfg.apiKeys, err)
	}

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("# no key yet\n\n"), 0o600)
	unreadable := filepath.Join(dir, "unreadable")
	os.WriteFile(unreadable, []byte("k\n"), 0)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--api-key-file", filepath.Join(dir, "missing")}, "no such file"},
		{[]string{"--api-key-file", empty}, "holds no key"},
		{[]string{"--api-key-file", dir}, "api_key_file"},
		{[]string{"--api-key", ""}, "empty key"},
		{[]string{"--api-key", " "}, "empty key"},
	}
	if os.Geteuid() != 0 { // root reads a file of mode 0
		cases = append(cases, struct {
			args []string
			want string
		}{[]string{"--api-key-file", unreadable}, "permission denied"})
	}
	for _, c := range cases {
		if _, err := parseInvocation(c.args, envOf(nil), io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestPrintConfigRedactsKeys: --print-config shows how many keys, never a
// key, and the placeholder it prints is refused when read back.
func TestPrintConfigRedactsKeys(t *testing.T) {
	file := writeFile(t, "api_key: [file-secret-1]\n")
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--api-key", "flag-secret-1", "--api-key", "flag-secret-2"}, want: `api_key: '<redacted: 2 keys>' # flag --api-key`},
		{env: map[string]string{"HYDRA_API_KEY": "env-secret-1"}, want: `api_key: '<redacted: 1 key>' # env HYDRA_API_KEY`},
		{env: map[string]string{"HYDRA_CONFIG": file}, want: `api_key: '<redacted: 1 key>' # file ` + file},
		{want: "api_key: [] # default"},
	} {
		inv, err := parseInvocation(c.args, envOf(c.env), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := printConfig(&out, inv); err != nil {
			t.Fatal(err)
		}
		text := out.String()
		if strings.Contains(text, "secret") || !strings.Contains(text, c.want) {
			t.Errorf("%q %v: want %q and no key in\n%s", c.args, c.env, c.want, text)
		}
		if len(inv.cfg.APIKey) == 0 {
			continue
		}
		_, err = parseInvocation([]string{"--config", writeFile(t, text)}, envOf(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "placeholder --print-config shows") {
			t.Errorf("the printed placeholder read back as a key: %v", err)
		}
	}
}

// TestOpenHTTP: the HTTP listener is open when other hosts reach it and no
// key is configured (the engine then warns).
func TestOpenHTTP(t *testing.T) {
	for _, c := range []struct {
		http string
		keys []string
		open bool
	}{
		{"", nil, false},
		{"127.0.0.1:8080", nil, false},
		{"localhost:8080", nil, false},
		{":8080", nil, true},
		{"0.0.0.0:8080", nil, true},
		{"[::]:8080", nil, true},
		{"0.0.0.0:8080", []string{"k"}, false},
	} {
		cfg := Config{HTTP: c.http, apiKeys: c.keys}
		if got := cfg.openHTTP(); got != c.open {
			t.Errorf("http %q keys %q: open %v, want %v", c.http, c.keys, got, c.open)
		}
	}
}

// dockerEnv reads the ENV instructions of the Dockerfile stage named, as
// the image's environment.
func dockerEnv(t *testing.T, stage string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	env, in := map[string]string{}, false
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "FROM":
			in = len(f) >= 4 && f[len(f)-2] == "AS" && f[len(f)-1] == stage
		case in && len(f) >= 2 && f[0] == "ENV":
			for _, kv := range f[1:] {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	if len(env) == 0 {
		t.Fatalf("no ENV in stage %s", stage)
	}
	return env
}

// TestDockerfileSecureByDefault: the images bind every interface, so they
// refuse to start until the operator says who may connect over RPC, and
// their HTTP API needs the mounted key file.
func TestDockerfileSecureByDefault(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(keys, []byte("k\n"), 0o600)
	for _, stage := range []string{"mock", "cpu"} {
		env := dockerEnv(t, stage)
		env["HYDRA_CONFIG"] = "../../deploy/hydra-engine.yaml"
		_, err := parseInvocation(nil, envOf(env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "HYDRA_RPC_ALLOW") || !strings.Contains(err.Error(), "HYDRA_RPC_INSECURE") {
			t.Errorf("%s image without HYDRA_RPC_ALLOW: %v", stage, err)
		}
		env["HYDRA_RPC_ALLOW"] = "10.0.0.0/8"
		if _, err = parseInvocation(nil, envOf(env), io.Discard); err == nil || !strings.Contains(err.Error(), "api_key_file") {
			t.Errorf("%s image without its key file: %v", stage, err)
		}
		env["HYDRA_API_KEY_FILE"] = keys
		inv, err := parseInvocation(nil, envOf(env), io.Discard)
		if err != nil || len(inv.cfg.apiKeys) != 1 || inv.cfg.openHTTP() {
			t.Errorf("%s image with HYDRA_RPC_ALLOW and keys: %v", stage, err)
		}
	}
}

// The sampler setting merges key by key like backend_opts and is checked
// with CONFIGURE's rules before anything starts.
func TestSamplerSetting(t *testing.T) {
	file := writeFile(t, "sampler:\n  temperature: 0.7\n  top_k: 40\nslot_prompt_similarity: 0.25\n")
	env := map[string]string{"HYDRA_CONFIG": file, "HYDRA_SAMPLER": "top_k=20, min_p=0.05"}
	inv, err := parseInvocation([]string{"--sampler", "top_p=0.9", "--sampler", "temperature=0.86"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"temperature": "0.86", "top_k": "20", "min_p": "0.05", "top_p": "0.9"}
	if !reflect.DeepEqual(inv.cfg.Sampler, want) || inv.cfg.SlotSimilarity != 0.25 {
		t.Errorf("sampler %v, slot_prompt_similarity %v", inv.cfg.Sampler, inv.cfg.SlotSimilarity)
	}
	if src := inv.sources["sampler"]; src != "file "+file+", env HYDRA_SAMPLER, flag --sampler" {
		t.Errorf("source %q", src)
	}
	if inv, err := parseInvocation(nil, envOf(nil), io.Discard); err != nil || inv.cfg.SlotSimilarity != 0.1 || len(inv.cfg.Sampler) != 0 {
		t.Errorf("defaults: %+v, %v", inv, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sampler", "top_p=1.5"}, "top_p must be in (0, 1]"},
		{[]string{"--sampler", "temperature=warm"}, `sampler: temperature="warm" is not a number or a boolean`},
		{[]string{"--sampler", "tmperature=1"}, "sampler: unknown keys tmperature"},
		{[]string{"--sampler", "state_chunk_size=65536"}, "state_chunk_size is not a sampler default"},
		{[]string{"--sampler", "nokey"}, `"nokey" is not key=value`},
		{[]string{"--slot-prompt-similarity", "1.5"}, "slot_prompt_similarity must be in [0, 1]"},
	} {
		if _, err := parseInvocation(tc.args, envOf(nil), io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// ApplySampler sets the engine's defaults as CONFIGURE does.
func TestApplySampler(t *testing.T) {
	tun := host.NewTunables()
	if err := tun.ApplySampler(map[string]string{"temperature": "0.86", "top_k": "20", "top_p": " 0.95 ", "seed": "7"}); err != nil {
		t.Fatal(err)
	}
	if s := tun.Sampler(); s.Temperature != 0.86 || s.TopK != 20 || s.TopP != 0.95 || s.Seed != 7 {
		t.Fatalf("sampler %+v", s)
	}
	before := tun.Sampler()
	if err := tun.ApplySampler(map[string]string{"temperature": "0.1", "top_k": "-3"}); err == nil || !reflect.DeepEqual(tun.Sampler(), before) {
		t.Fatalf("a bad value: %v, sampler %+v (before %+v)", err, tun.Sampler(), before)
	}
	if err := tun.ApplySampler(nil); err != nil || !reflect.DeepEqual(tun.Sampler(), before) {
		t.Fatalf("no keys: %v", err)
	}
}
