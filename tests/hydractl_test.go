package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// hydractlJSON runs hydractl --json and decodes its one JSON object.
func hydractlJSON(t testing.TB, args ...string) (map[string]any, error) {
	t.Helper()
	out, errOut, err := hydractl(t, append([]string{"--json"}, args...)...)
	var m map[string]any
	if jerr := json.Unmarshal([]byte(out), &m); jerr != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("hydractl --json %q: stdout %q is not one JSON object (%v); stderr %q", args, out, jerr, errOut)
	}
	return m, err
}

// TestHydractlMigrate streams a slot from one engine process into another
// (STATE_GET body → STATE_PUT payload) and checks that both continue with the
// same greedy decode.
// TestHydractlMigrateSharedMemory: between two engines' Unix sockets
// migrate hands the state over shared memory (STATE_EXPORT, STATE_IMPORT),
// says so, and leaves no file behind; where the source cannot export (its
// directory is missing) it takes the socket path and says why.
func TestHydractlMigrateSharedMemory(t *testing.T) {
	dir := t.TempDir()
	opts := []string{"--backend-opt", "kv_bytes_per_token=65536", "--state-shm-dir", dir}
	a, b := startEngine(t, opts...), startEngine(t, opts...)
	ca, cb := client(t, a.unix), client(t, b.unix)
	mustOK(t, ca, transport.OpPrefill, "0", chat("Move this conversation through shared memory, please."))
	src, _ := mustOK(t, ca, transport.OpStateMeta, "0", nil)
	m, err := hydractlJSON(t, "migrate", "--from", a.unix, "--to", b.unix, "--slot", "0", "--to-slot", "1")
	meta, _ := m["meta"].(map[string]any)
	if err != nil || m["path"] != "shared memory" || meta["restored"] != true || meta["n_past"] != float64(num(t, src, "n_past")) ||
		!strings.HasPrefix(fmt.Sprint(meta["path"]), dir+"/hydra-state-") {
		t.Fatalf("migrate between Unix sockets: %v %v", err, m)
	}
	want, _ := decodeText(t, ca, "0", 32)
	if got, _ := decodeText(t, cb, "1", 32); got != want || want == "" {
		t.Errorf("after migrate through shared memory: destination decodes %q, source %q", got, want)
	}
	// The export goes when migrate's connection to the source closes.
	var left []string
	for range 100 {
		if left, _ = filepath.Glob(filepath.Join(dir, "*")); len(left) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(left) != 0 {
		t.Errorf("files left in the shared memory directory: %v", left)
	}

	// --path socket between the same engines; --path shm where the
	// destination is not on a Unix socket fails.
	m, err = hydractlJSON(t, "migrate", "--from", a.unix, "--to", b.unix, "--slot", "0", "--to-slot", "1", "--path", "socket")
	if err != nil || m["path"] != "socket" || m["path_why"] != "--path socket" {
		t.Fatalf("migrate --path socket: %v %v", err, m)
	}
	m, err = hydractlJSON(t, "migrate", "--from", a.unix, "--to", b.tcp, "--slot", "0", "--to-slot", "1", "--path", "shm")
	if err == nil || !strings.Contains(fmt.Sprint(m["error"]), "--path shm") {
		t.Fatalf("migrate --path shm to a tcp:// engine: %v %v", err, m)
	}

	// A source whose directory is missing: the socket path, and why.
	c := startEngine(t, "--backend-opt", "kv_bytes_per_token=65536", "--state-shm-dir", filepath.Join(dir, "missing"))
	mustOK(t, client(t, c.unix), transport.OpPrefill, "0", chat("Move this one over the socket."))
	m, err = hydractlJSON(t, "migrate", "--from", c.unix, "--to", b.unix, "--slot", "0", "--to-slot", "2")
	if err != nil || m["path"] != "socket" || !strings.Contains(fmt.Sprint(m["path_why"]), "could not export") {
		t.Fatalf("migrate from an engine that cannot export: %v %v", err, m)
	}
}

func TestHydractlMigrate(t *testing.T) {
	opts := []string{"--backend-opt", "kv_bytes_per_token=65536"}
	a, b := startEngine(t, opts...), startEngine(t, opts...)
	ca, cb := client(t, a.tcp), client(t, b.unix)
	mustOK(t, ca, transport.OpPrefill, "0", chat("Move this conversation to another engine, please."))
	src, _ := mustOK(t, ca, transport.OpStateMeta, "0", nil)

	m, err := hydractlJSON(t, "migrate", "--from", a.unix, "--to", b.tcp, "--slot", "0", "--to-slot", "2")
	if err != nil {
		t.Fatalf("migrate: %v %v", err, m)
	}
	meta, _ := m["meta"].(map[string]any)
	if m["ok"] != true || m["command"] != "migrate" || meta["restored"] != true ||
		meta["n_past"] != float64(num(t, src, "n_past")) || m["bytes"].(float64) < float64(num(t, src, "state_size")) ||
		m["gbps"].(float64) <= 0 {
		t.Fatalf("migrate --json: %v", m)
	}
	if sm, _ := m["source_meta"].(map[string]any); sm["n_past"] != float64(num(t, src, "n_past")) {
		t.Errorf("source_meta %v", m["source_meta"])
	}
	if m["path"] != "socket" || !strings.Contains(fmt.Sprint(m["path_why"]), "unix://") {
		t.Errorf("migrate to a tcp:// engine: path %v (%v), want the socket's, saying why", m["path"], m["path_why"])
	}
	// The source keeps its copy; both decode alike.
	want, wm := decodeText(t, ca, "0", 48)
	got, gm := decodeText(t, cb, "2", 48)
	if got != want || want == "" || wm["n_past"] != gm["n_past"] {
		t.Errorf("after migrate: destination decodes %q (%v), source %q (%v)", got, gm["n_past"], want, wm["n_past"])
	}

	// Human output: meta on stdout, a note with GB/s on stderr; --addr names
	// the source when --from is absent.
	out, errOut, err := hydractl(t, "--addr", a.tcp, "migrate", "--to", b.unix, "--slot", "0", "--to-slot", "3")
	if err != nil || !strings.Contains(out, `"restored":true`) || !strings.Contains(errOut, "GB/s") || strings.Contains(errOut, "\r") {
		t.Errorf("migrate: %v %q %q", err, out, errOut)
	}

	// Engines with different models refuse before moving a byte.
	c := startEngine(t, "--backend-opt", "kv_bytes_per_token=4096")
	m, err = hydractlJSON(t, "migrate", "--from", a.tcp, "--to", c.tcp, "--slot", "0")
	if err == nil || m["ok"] != false || !strings.Contains(m["error"].(string), "different models") {
		t.Errorf("migrate across models: %v %v", err, m)
	}
	if cm, _ := mustOK(t, client(t, c.tcp), transport.OpStateMeta, "0", nil); num(t, cm, "n_past") != 0 {
		t.Errorf("refused migrate touched the destination: %v", cm)
	}
	// A missing source slot is the engine's NOT_FOUND.
	m, err = hydractlJSON(t, "migrate", "--from", a.tcp, "--to", b.tcp, "--slot", "9")
	if err == nil || m["status"] != "NOT_FOUND" {
		t.Errorf("migrate of a missing slot: %v %v", err, m)
	}
}

func TestHydractlBenchAndJSON(t *testing.T) {
	e := startEngine(t, "--backend-opt", "kv_bytes_per_token=65536")
	c := client(t, e.tcp)
	mustOK(t, c, transport.OpPrefill, "1", chat(strings.Repeat("bench ", 100)))
	before, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)

	m, err := hydractlJSON(t, "--addr", e.unix, "bench", "--slot", "1", "--rounds", "3")
	if err != nil {
		t.Fatalf("bench: %v %v", err, m)
	}
	rounds, _ := m["rounds"].([]any)
	if len(rounds) != 3 || m["get_gbps_median"].(float64) <= 0 || m["put_gbps_median"].(float64) <= 0 ||
		m["bytes"].(float64) < float64(num(t, before, "state_size")) {
		t.Fatalf("bench --json: %v", m)
	}
	for _, r := range rounds {
		if r.(map[string]any)["get_gbps"].(float64) <= 0 {
			t.Errorf("round %v", r)
		}
	}
	// The slot got its own state back.
	after, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)
	if after["n_past"] != before["n_past"] || after["state_size"] != before["state_size"] {
		t.Errorf("bench changed the slot: %v → %v", before, after)
	}
	_, errOut, err := hydractl(t, "--addr", e.tcp, "bench", "--slot", "1", "--rounds", "2")
	if err != nil || !strings.Contains(errOut, "round 2:") || !strings.Contains(errOut, "median over 2 rounds") {
		t.Errorf("bench: %v %q", err, errOut)
	}

	// state get/put --json carry the figures; no progress bar off a terminal.
	blob := filepath.Join(t.TempDir(), "s.blob")
	m, err = hydractlJSON(t, "--addr", e.tcp, "state", "get", "--slot", "1", "-o", blob)
	fi, _ := os.Stat(blob)
	if err != nil || m["command"] != "state get" || fi == nil || m["bytes"] != float64(fi.Size()) || m["file"] != blob {
		t.Fatalf("state get --json: %v %v", err, m)
	}
	m, err = hydractlJSON(t, "--addr", e.tcp, "state", "put", "--slot", "2", "-i", blob)
	if meta, _ := m["meta"].(map[string]any); err != nil || meta["n_past"] != before["n_past"] || m["gbps"].(float64) <= 0 {
		t.Fatalf("state put --json: %v %v", err, m)
	}
	m, err = hydractlJSON(t, "--addr", e.tcp, "decode", "--slot", "2", "--n", "3")
	if frames, _ := m["frames"].([]any); err != nil || len(frames) != 3 || frames[2].(map[string]any)["final"] != true {
		t.Errorf("decode --json: %v %v", err, m)
	}
	m, err = hydractlJSON(t, "--addr", e.tcp, "meta", "--slot", "9")
	if err == nil || m["ok"] != false || m["status"] != "NOT_FOUND" || m["error"] != "invalid slot ID" {
		t.Errorf("error --json: %v %v", err, m)
	}
	_, errOut, err = hydractl(t, "--addr", e.tcp, "--no-progress", "state", "get", "--slot", "1", "-o", blob)
	if err != nil || strings.Contains(errOut, "%") {
		t.Errorf("state get --no-progress: %v %q", err, errOut)
	}
}
