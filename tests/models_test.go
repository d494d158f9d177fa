package tests

// llama-server's router endpoints, POST /models/load and /models/unload,
// on `hydra-engine llama-server` with presets (--models-preset), on the
// mock: their replies and errors in llama-server's shapes, the model list's
// status, and the engine holding no model after an unload, its plugin gone.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
)

// lsEngine is `hydra-engine llama-server` on the mock (HYDRA_BACKEND), run
// by a test.
type lsEngine struct {
	cmd    *exec.Cmd
	logs   *enginetest.Log
	base   string // http://127.0.0.1:PORT
	exited chan error
}

// startMockLlamaServer runs hydra-engine llama-server with args on the mock
// and the extra environment, until /health answers 200; the engine is
// stopped (SIGTERM) when the test ends.
func startMockLlamaServer(t *testing.T, env []string, args ...string) *lsEngine {
	t.Helper()
	port := freePort(t)
	e := &lsEngine{logs: enginetest.NewLog(0), base: fmt.Sprintf("http://127.0.0.1:%d", port), exited: make(chan error, 1)}
	e.cmd = exec.Command(filepath.Join(binDir, "hydra-engine"), append([]string{"llama-server", "--port", fmt.Sprint(port)}, args...)...)
	e.cmd.Stdout, e.cmd.Stderr = e.logs, e.logs
	e.cmd.Env = append(append(os.Environ(), "HYDRA_BACKEND=mock", "HYDRA_PLUGIN_DIR="+binDir), env...)
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { e.exited <- e.cmd.Wait() }()
	t.Cleanup(func() {
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-e.exited:
			if err != nil {
				t.Errorf("engine exit: %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = e.cmd.Process.Kill()
			t.Error("engine did not stop on SIGTERM")
		}
		if t.Failed() {
			t.Logf("ENGINE LOG\n%s", e.logs)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get(e.base + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e
			}
		}
		select {
		case err := <-e.exited:
			t.Fatalf("engine exited during start: %v\n%s", err, e.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine not healthy after 30s\n%s", e.logs)
		}
	}
}

// modelList is GET /models: each model's id and status.
func modelList(t *testing.T, base string) string {
	t.Helper()
	var list struct {
		Data []struct {
			ID     string `json:"id"`
			Status struct {
				Value string `json:"value"`
			} `json:"status"`
		} `json:"data"`
	}
	httpJSON(t, "GET", base+"/models", "", 200, &list)
	var parts []string
	for _, m := range list.Data {
		parts = append(parts, m.ID+":"+m.Status.Value)
	}
	return strings.Join(parts, " ")
}

func TestRouterLoadUnload(t *testing.T) {
	dir := t.TempDir()
	first, second := filepath.Join(dir, "first.gguf"), filepath.Join(dir, "second.gguf")
	ini := filepath.Join(dir, "preset.ini")
	for path, text := range map[string]string{first: "first", second: "second", ini: "[small]\nmodel = " + second + "\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e := startMockLlamaServer(t, []string{"HYDRA_BACKEND_OPTS=op_delay_ms=20"}, "--model", first, "--models-preset", ini)
	if got := modelList(t, e.base); got != "first:loaded small:unloaded" {
		t.Fatalf("GET /models: %s", got)
	}
	post := func(path, body string, code int, want string) {
		t.Helper()
		got, b, _ := httpDo(t, "POST", e.base+path, body)
		if got != code || !strings.Contains(string(b), want) {
			t.Errorf("POST %s %s: %d %s, want %d with %s", path, body, got, b, code, want)
		}
	}
	// llama-server's replies and errors.
	post("/models/load", `{"model":"small"}`, 200, `{"success":true}`)
	if got := modelList(t, e.base); got != "small:loaded first:unloaded" {
		t.Errorf("after loading small: %s", got)
	}
	post("/models/load", `{"model":"small"}`, 400, `{"error":{"message":"model is already running: \"small\"","type":"invalid_request_error","code":400,"param":null}}`)
	post("/models/load", `{"model":"nope"}`, 404, `{"error":{"message":"model is not found: \"nope\" (the models: first, small)","type":"not_found_error","code":404`)
	post("/models/unload", `{"model":"nope"}`, 400, `"message":"model is not found: \"nope\"`)
	post("/models/unload", `{"model":"first"}`, 400, `"message":"model is not running: \"first\" (loaded: small)"`)
	post("/models/load", `{"model":`, 400, `request body is not valid JSON`)
	post("/models/load", `{}`, 400, `model name is missing from the request`)
	post("/models/load", `{"model":7}`, 400, `field model: expected a string, got a number`)

	// A load waits for no slot: one at work makes it BUSY.
	stream, err := http.Post(e.base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":100000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	post("/models/load", `{"model":"first"}`, 503, `empties every slot, and some are busy`)
	stream.Body.Close()

	// Unloaded: no plugin runs, /health is well without a model, a request
	// naming none is refused with what it can name, one naming a model
	// loads it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, b, _ := httpDo(t, "POST", e.base+"/models/unload", `{"model":"small"}`)
		if code == 200 {
			break
		}
		if code != 503 || time.Now().After(deadline) { // the cancelled stream frees its slot
			t.Fatalf("unload: %d %s", code, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := modelList(t, e.base); got != "first:unloaded small:unloaded" {
		t.Errorf("after the unload: %s", got)
	}
	if kids := children(e.cmd.Process.Pid); len(kids) != 0 {
		t.Errorf("plugin processes after the unload: %v", kids)
	}
	var health map[string]any
	httpJSON(t, "GET", e.base+"/health", "", 200, &health)
	if health["has_model"] != false || health["model_name"] != "" {
		t.Errorf("/health with no model: %v", health)
	}
	post("/models/unload", `{"model":"small"}`, 400, `model is not running: \"small\" (no model is loaded)`)
	post("/v1/completions", `{"prompt":"x","max_tokens":1}`, 400, `no model is loaded (POST /models/unload unloaded small): name one of first, small`)
	code, b, resp := httpDo(t, "POST", e.base+"/v1/completions", `{"model":"first","prompt":"x","max_tokens":1}`)
	var r struct {
		Model string `json:"model"`
	}
	if code != 200 || json.Unmarshal(b, &r) != nil || r.Model != "first" || resp.Header.Get("X-Hydra-Model-Switched") != "true" {
		t.Errorf("a completion naming a model with none loaded: %d %s", code, b)
	}
	if got := modelList(t, e.base); got != "first:loaded small:unloaded" {
		t.Errorf("after the completion: %s", got)
	}
	post("/models/unload", `{"model":"first"}`, 200, `{"success":true}`)
	post("/models/load", `{"model":"small"}`, 200, `{"success":true}`)
}

// Outside router mode (no --models-preset) there is nothing to load or
// unload: 404, as llama-server has no such endpoints then.
func TestRouterEndpointsNeedPresets(t *testing.T) {
	e := startMockLlamaServer(t, nil)
	for _, path := range []string{"/models/load", "/models/unload"} {
		code, b, _ := httpDo(t, "POST", e.base+path, `{"model":"mock"}`)
		if code != 404 || !strings.Contains(string(b), "the engine is not in router mode") || !strings.Contains(string(b), `"type":"not_found_error"`) {
			t.Errorf("POST %s: %d %s", path, code, b)
		}
	}
}
