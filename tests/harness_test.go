// Package tests runs the real binaries — hydra-engine, the mock plugin
// process, hydractl — over real TCP and Unix sockets.
package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
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
	// The race detector sleeps a second as each process exits (GORACE's
	// atexit_sleep_ms), two for every engine and plugin stopped: most of
	// this package's time. A report is written whole when a race is found,
	// so a short sleep loses none of them.
	if raceBuild && os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=20")
	}
	dir, err := os.MkdirTemp("", "hydra-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// go test -race: the processes under test get the detector too; a race
	// in one fails the test that ran it (engine.stop).
	if err := enginetest.Build(dir, enginetest.BuildOptions{Race: raceBuild}); err != nil {
		fmt.Fprintf(os.Stderr, "building binaries: %v\n", err)
		return 1
	}
	binDir = dir
	return m.Run()
}

// engine is a running hydra-engine process serving TCP and a Unix socket
// (internal/enginetest's, with the fields the tests read).
type engine struct {
	e    *enginetest.Engine
	cmd  *exec.Cmd
	tcp  string
	unix string
	logs *enginetest.Log
	// exited is closed once the process has exited; waitErr is then its
	// exit error (read it only after <-exited).
	exited  chan struct{}
	waitErr error
}

func freePort(t testing.TB) int {
	p, err := enginetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startEngine starts an engine on the separate mock plugin binary with extra
// flags, waits until both sockets answer, and stops it (SIGTERM, exit 0
// expected) when the test ends.
func startEngine(t testing.TB, extra ...string) *engine {
	t.Helper()
	return startWith(t, enginetest.Config{Args: extra})
}

// startWith starts the engine cfg says (Bin and the test's flags filled in).
func startWith(t testing.TB, cfg enginetest.Config) *engine {
	t.Helper()
	cfg.Bin = binDir
	cfg.Args = append([]string{"--log-level", "debug", "--shutdown-grace", "5s"}, cfg.Args...)
	cfg.StopTimeout = 15 * time.Second
	ee, err := enginetest.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{e: ee, cmd: ee.Cmd, tcp: ee.TCP, unix: ee.Unix, logs: ee.Logs, exited: make(chan struct{})}
	go func() { <-ee.Done(); e.waitErr = ee.WaitErr(); close(e.exited) }()
	t.Cleanup(func() { e.stop(t) })
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
		_ = e.e.Stop() // its socket directory
		return
	default:
	}
	if err := e.e.Stop(); err != nil {
		t.Errorf("engine exit: %v\n%s", err, e.logs)
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
	e := startWith(t, enginetest.Config{HTTP: true, Args: extra})
	return e, "http://" + e.e.HTTP
}
