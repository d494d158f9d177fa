package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/transport"
)

// Who may connect (issue 27, item 5) and what a client is told of an
// internal failure (item 7).

// keyDo sends one HTTP request with "Authorization: Bearer key" (none for
// "") and returns the status, the body and the reply's header.
func keyDo(t testing.TB, method, url, key, body string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

// TestHTTPAPIKey: with --api-key and --api-key-file, every path but /health
// answers 401 without a key or with a wrong one, and serves either key;
// --public-metrics opens /metrics alone.
func TestHTTPAPIKey(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keyFile, []byte("# coordinator\nfile-key-7f3a\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, base := startHTTPEngine(t, "--api-key", "flag-key-91c2", "--api-key-file", keyFile)
	chatBody := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	protected := []struct{ method, path, body string }{
		{"POST", "/v1/chat/completions", chatBody},
		{"POST", "/v1/completions", `{"prompt":"hi","max_tokens":3}`},
		{"GET", "/slots", ""},
		{"POST", "/slots/1?action=erase", ""},
		{"GET", "/slots/1/state/meta", ""},
		{"GET", "/metrics", ""},
		{"GET", "/v1/models", ""},
		{"GET", "/version", ""},
	}
	for _, p := range protected {
		for _, key := range []string{"", "wrong-key", "flag-key-91c", "file-key-7f3"} {
			code, body, h := keyDo(t, p.method, base+p.path, key, p.body)
			var e openAIError
			if code != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || e.Error.Type != "authentication_error" ||
				!strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s with key %q: %d %s %v", p.method, p.path, key, code, body, h)
			}
		}
		for _, key := range []string{"flag-key-91c2", "file-key-7f3a"} {
			if code, body, _ := keyDo(t, p.method, base+p.path, key, p.body); code != http.StatusOK {
				t.Errorf("%s %s with key %q: %d %s", p.method, p.path, key, code, body)
			}
		}
	}
	if code, body, _ := keyDo(t, "GET", base+"/health", "", ""); code != http.StatusOK {
		t.Errorf("/health without a key: %d %s", code, body)
	}

	_, pub := startHTTPEngine(t, "--api-key-file", keyFile, "--public-metrics")
	if code, body, _ := keyDo(t, "GET", pub+"/metrics", "", ""); code != http.StatusOK || !bytes.Contains(body, []byte("hydra_engine_")) {
		t.Errorf("--public-metrics: /metrics without a key: %d", code)
	}
	if code, _, _ := keyDo(t, "GET", pub+"/slots", "", ""); code != http.StatusUnauthorized {
		t.Errorf("--public-metrics: /slots without a key: %d", code)
	}
}

// TestRPCAllow: with --rpc-allow 127.0.0.2/32 a client from 127.0.0.1 finds
// its TCP connection closed before any reply, while one from 127.0.0.2 is
// served; the Unix socket is not affected, and the refusals are logged once,
// not once each.
func TestRPCAllow(t *testing.T) {
	e := startEngine(t, "--rpc-allow", "127.0.0.2/32")
	const refusals = 5
	for range refusals {
		c, err := transport.DialClient(ctxT(t), e.tcp)
		if err != nil {
			t.Fatal(err)
		}
		resp, _, err := c.Call(ctxT(t), transport.OpInfo, "", nil)
		c.Close()
		if err == nil {
			t.Fatalf("INFO from 127.0.0.1 outside --rpc-allow answered %v", resp.Status)
		}
	}
	_, addr, _ := transport.ParseURL(e.tcp)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 10 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	allowed := transport.NewClient(conn)
	defer allowed.Close()
	mustOK(t, allowed, transport.OpInfo, "", nil)
	mustOK(t, allowed, transport.OpPrefill, "0", chat("allowed peer"))
	mustOK(t, client(t, e.unix), transport.OpStateMeta, "0", nil)

	warnings := strings.Count(e.logs.String(), "closed Hydra RPC connections from peers outside rpc_allow")
	t.Logf("%d connections refused, %d log lines", refusals, warnings)
	if warnings < 1 || warnings >= refusals {
		t.Errorf("%d refusals logged in %d lines, want one line per interval\n%s", refusals, warnings, e.logs)
	}
}

// TestOpenRPCListenerRefused: a tcp:// listener on every interface without
// --rpc-allow or --rpc-insecure stops the engine before it starts (exit
// status 2, the ways out named); with --rpc-insecure it serves.
func TestOpenRPCListenerRefused(t *testing.T) {
	open := fmt.Sprintf("tcp://0.0.0.0:%d", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "hydra-engine"), "--rpc", open,
		"--backend", filepath.Join(binDir, "hydra-plugin-mock"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("engine with an open RPC listener: %v\n%s", err, out)
	}
	for _, want := range []string{open, "--rpc-allow", "--tls-client-ca", "--rpc-insecure"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the refusal does not name %q:\n%s", want, out)
		}
	}

	e := startWith(t, enginetest.Config{Args: []string{"--rpc", open, "--rpc-insecure"}})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(open, "tcp://"))
	mustOK(t, client(t, "tcp://127.0.0.1:"+port), transport.OpInfo, "", nil)
	waitLog(t, e, "serving Hydra RPC", open)
}

// internalLeaks are what an error from a dead plugin carries that a client
// must not see: its socket path and gRPC's and Go's words.
var internalLeaks = []string{"/tmp/", "plugin", ".sock", "unix", "dial", "transport:", "desc =", "rpc error", "Unavailable"}

// TestPluginCrashErrorsHideInternals kills the plugin mid-stream and during
// a non-streamed completion: the SSE error event and the JSON error say what
// failed without the plugin's socket path or gRPC's text, which the engine
// log keeps.
func TestPluginCrashErrorsHideInternals(t *testing.T) {
	e, base := startHTTPEngine(t, "--backend-opt", "op_delay_ms=40")
	pid := pluginPID(t, e)

	req, _ := http.NewRequestWithContext(ctxT(t), "POST", base+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"crash"}],"max_tokens":500,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bytes.NewBuffer(nil)
	head := make([]byte, 1)
	for !bytes.Contains(br.Bytes(), []byte("\n\ndata: ")) { // two events: streaming is under way
		if _, err := resp.Body.Read(head); err != nil {
			t.Fatalf("stream before the kill: %v %q", err, br)
		}
		br.Write(head)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	rest, _ := io.ReadAll(resp.Body)
	events := readSSE(t, io.MultiReader(br, bytes.NewReader(rest)))
	last := events[len(events)-1].data
	var e1 openAIError
	if err := json.Unmarshal([]byte(last), &e1); err != nil || e1.Error.Message == "" {
		t.Fatalf("the stream did not end with an error event: %q", last)
	}
	t.Logf("SSE error event: %s", last)
	checkNoLeak(t, "SSE error event", last)
	pid = waitRelaunch(t, e, pid)

	go func() { time.Sleep(300 * time.Millisecond); syscall.Kill(pid, syscall.SIGKILL) }()
	code, body, _ := keyDo(t, "POST", base+"/v1/chat/completions", "", `{"messages":[{"role":"user","content":"crash"}],"max_tokens":500}`)
	var e2 openAIError
	if code != http.StatusInternalServerError || json.Unmarshal(body, &e2) != nil || e2.Error.Message == "" {
		t.Fatalf("completion across a plugin crash: %d %s", code, body)
	}
	t.Logf("JSON error: %s", body)
	checkNoLeak(t, "JSON error", string(body))
	if !strings.Contains(e.logs.String(), "HTTP request failed") {
		t.Error("the engine log lacks the failure's details")
	}
}

func checkNoLeak(t *testing.T, what, text string) {
	t.Helper()
	for _, leak := range internalLeaks {
		if strings.Contains(text, leak) {
			t.Errorf("%s shows %q: %s", what, leak, text)
		}
	}
}
