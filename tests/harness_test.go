// Package tests runs the real binaries — hydra-engine, the mock plugin
// process, hydractl — over real TCP and Unix sockets.
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// binDir holds the binaries built once for the whole package.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// HYDRA_TEST_BIN names prebuilt binaries (a machine without Go, such as
	// the GPU box, runs a compiled test binary).
	if dir := os.Getenv("HYDRA_TEST_BIN"); dir != "" {
		binDir = dir
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "hydra-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	build, cgo := []string{"build", "-o", dir + "/"}, "CGO_ENABLED=0"
	if raceBuild {
		// go test -race: the processes under test get the detector too (it
		// needs cgo); a race in one fails the test that ran it (engine.stop).
		build, cgo = append(build, "-race"), "CGO_ENABLED=1"
	}
	cmd := exec.Command("go", append(build, "./cmd/hydra-engine", "./cmd/hydra-plugin-mock", "./cmd/hydractl")...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), cgo)
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building binaries: %v\n%s", err, out)
		return 1
	}
	binDir = dir
	return m.Run()
}

// syncBuffer collects a process's output safely.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// engine is a running hydra-engine process serving TCP and a Unix socket.
type engine struct {
	cmd  *exec.Cmd
	tcp  string
	unix string
	logs *syncBuffer
	// exited is closed once the process has exited; waitErr is then its
	// exit error (read it only after <-exited).
	exited  chan struct{}
	waitErr error
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEngine starts an engine on the separate mock plugin binary with extra
// flags, waits until both sockets answer, and stops it (SIGTERM, exit 0
// expected) when the test ends.
func startEngine(t testing.TB, extra ...string) *engine {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "he") // short: sun_path is 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	e := &engine{
		tcp:    fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)),
		unix:   "unix://" + filepath.Join(sockDir, "engine.sock"),
		logs:   &syncBuffer{},
		exited: make(chan struct{}),
	}
	args := append([]string{"--rpc", e.tcp, "--rpc", e.unix, "--backend", filepath.Join(binDir, "hydra-plugin-mock"),
		"--log-level", "debug", "--shutdown-grace", "5s"}, extra...)
	e.cmd = exec.Command(filepath.Join(binDir, "hydra-engine"), args...)
	e.cmd.Stdout, e.cmd.Stderr = e.logs, e.logs
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { e.waitErr = e.cmd.Wait(); close(e.exited) }()
	t.Cleanup(func() { e.stop(t) })
	deadline := time.Now().Add(20 * time.Second)
	for _, u := range []string{e.tcp, e.unix} {
		for {
			c, err := transport.Dial(context.Background(), u)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-e.exited:
				t.Fatalf("engine exited during start: %v\n%s", e.waitErr, e.logs)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("engine did not listen on %s: %v\n%s", u, err, e.logs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return e
}

func (e *engine) stop(t testing.TB) {
	defer func() {
		// A race detector's report from the engine or its plugin (whose
		// stderr the engine logs), in a -race build.
		if strings.Contains(e.logs.String(), "WARNING: DATA RACE") {
			t.Errorf("a data race in the engine or its plugin\n%s", e.logs)
		}
	}()
	if t.Failed() {
		t.Logf("ENGINE LOG\n%s", e.logs)
	}
	select {
	case <-e.exited: // the test stopped it
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
		if e.waitErr != nil {
			t.Errorf("engine exit: %v\n%s", e.waitErr, e.logs)
		}
	case <-time.After(15 * time.Second):
		_ = e.cmd.Process.Kill()
		t.Errorf("engine did not stop on SIGTERM\n%s", e.logs)
	}
}

// client dials a Hydra client to url.
func client(t testing.TB, url string) *transport.Client {
	t.Helper()
	c, err := transport.DialClient(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// call sends one request with an in-memory payload.
func call(t testing.TB, c *transport.Client, op transport.Op, key string, payload []byte) (transport.Status, map[string]any, []byte) {
	t.Helper()
	resp, body, err := c.Call(ctxT(t), op, key, payload)
	if err != nil {
		t.Fatalf("%v key %q: %v", op, key, err)
	}
	var m map[string]any
	if len(resp.Meta) > 0 {
		if err := json.Unmarshal(resp.Meta, &m); err != nil {
			t.Fatalf("%v: meta is not JSON: %q", op, resp.Meta)
		}
	}
	return resp.Status, m, body
}

// mustOK is call that expects StatusOK.
func mustOK(t testing.TB, c *transport.Client, op transport.Op, key string, payload []byte) (map[string]any, []byte) {
	t.Helper()
	st, m, body := call(t, c, op, key, payload)
	if st != transport.StatusOK {
		t.Fatalf("%v key %q: status %v, meta %v", op, key, st, m)
	}
	return m, body
}

// num reads a JSON number field.
func num(t testing.TB, m map[string]any, k string) int64 {
	t.Helper()
	v, ok := m[k].(float64)
	if !ok {
		t.Fatalf("meta %v has no number %q", m, k)
	}
	return int64(v)
}

// rawConn is a plain socket for byte-exact exchanges.
func rawConn(t testing.TB, url string) net.Conn {
	t.Helper()
	c, err := transport.Dial(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// chat is a PREFILL JSON body with one user message.
func chat(text string) []byte {
	b, _ := json.Marshal(map[string]any{"stream": false, "n_predict": 0,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	return b
}

func decodeJSON(n int) []byte { return []byte(fmt.Sprintf(`{"n_predict":%d,"messages":null}`, n)) }

// hydractl runs the CLI and returns stdout.
func hydractl(t testing.TB, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "hydractl"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), strings.TrimSpace(errb.String()), err
}

// startHTTPEngine is startEngine with --http on a free port. It returns the
// engine and its HTTP base URL ("http://127.0.0.1:PORT") once /health says
// ready.
func startHTTPEngine(t testing.TB, extra ...string) (*engine, string) {
	t.Helper()
	base := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	e := startEngine(t, append([]string{"--http", strings.TrimPrefix(base, "http://")}, extra...)...)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e, base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("HTTP %s not ready: %v\n%s", base, err, e.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
