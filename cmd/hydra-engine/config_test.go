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
		{args: []string{"--slots", "0"}, want: "slots must be at least 1"},
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
