package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/proccpu"
	"github.com/hydra-engine/hydra-engine/transport"
)

// engineConfig is what one engine process is started with.
type engineConfig struct {
	Plane string // --data-plane: "shm" or "grpc"
	Depth int    // --ring-depth on shm (1 = serial copy-then-send, 0 = auto); 0 on grpc, where it does not apply
	Chunk int    // state_chunk_size, set with CONFIGURE before the prefill
}

// label names the configuration's role in the tables.
func (c engineConfig) label() string {
	switch {
	case c.Plane == "grpc":
		return "gRPC stream"
	case c.Depth == 1 && c.Chunk == seedChunk:
		return "seed emulation (serial)"
	case c.Depth == 1:
		return "serial"
	default:
		return "pipelined"
	}
}

func (c engineConfig) String() string {
	if c.Plane == "grpc" {
		return fmt.Sprintf("grpc, chunk %s", chunkName(c.Chunk))
	}
	return fmt.Sprintf("shm, depth %s, chunk %s", depthName(c), chunkName(c.Chunk))
}

// flags are the configuration's engine flags.
func (c engineConfig) flags() []string {
	if c.Plane == "grpc" {
		return []string{"--data-plane", "grpc"}
	}
	f := []string{"--data-plane", "shm", "--ring-depth", strconv.Itoa(c.Depth)}
	if c.Depth == 1 {
		// Serial means the ring, one buffer: a spliced restore has no chunks
		// to serialise.
		f = append(f, "--splice-put=false")
	}
	return f
}

// engineProc is a running hydra-engine with its mock plugin child.
type engineProc struct {
	cmd       *exec.Cmd
	args      []string
	tcp, unix string
	http      string // host:port of its /metrics
	pluginPID int
	logs      *tailBuffer
	done      chan struct{} // closed when the process has exited
	waitErr   error         // set before done closes
}

// startEngine starts bin/hydra-engine on the mock plugin binary with the
// given extra flags (on cpus when set: --server-cpus), listening on a free
// TCP port and a Unix socket in sockDir, and waits until INFO answers on both
// (the engine listens before it loads the plugin, so a bare connect proves
// nothing).
func startEngine(ctx context.Context, bin, sockDir string, backend backendSpec, extra []string, cpus string) (*engineProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	e := &engineProc{
		tcp:  fmt.Sprintf("tcp://127.0.0.1:%d", port),
		unix: "unix://" + filepath.Join(sockDir, "engine.sock"),
		http: fmt.Sprintf("127.0.0.1:%d", httpPort),
		logs: &tailBuffer{max: 64 << 10},
		done: make(chan struct{}),
	}
	e.args = append(append([]string{"--rpc", e.tcp, "--rpc", e.unix, "--http", e.http}, backend.args(bin)...),
		append([]string{"--slots", "2", "--log-level", "warn"}, extra...)...)
	e.cmd = command(cpus, filepath.Join(bin, "hydra-engine"), e.args...)
	e.cmd.Stdout, e.cmd.Stderr = e.logs, e.logs
	// An interrupted benchmark must not leave 1 GB engines behind; the engine
	// takes its plugin's process group down with it.
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := e.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { e.waitErr = e.cmd.Wait(); close(e.done) }()

	deadline := time.Now().Add(60 * time.Second)
	for _, u := range []string{e.tcp, e.unix} {
		for {
			err := ping(ctx, u)
			if err == nil {
				break
			}
			select {
			case <-e.done:
				return nil, fmt.Errorf("engine exited during start: %v\n%s", e.waitErr, e.logs)
			case <-ctx.Done():
				e.stop()
				return nil, ctx.Err()
			default:
			}
			if time.Now().After(deadline) {
				e.stop()
				return nil, fmt.Errorf("engine not answering INFO on %s: %v\n%s", u, err, e.logs)
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	if e.pluginPID, err = findPlugin(e.cmd.Process.Pid, filepath.Base(backend.path(bin))); err != nil {
		e.stop()
		return nil, err
	}
	return e, nil
}

// ping sends INFO and expects OK.
func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := transport.DialClient(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close()
	resp, _, err := c.Call(ctx, transport.OpInfo, "", nil)
	if err != nil {
		return err
	}
	return resp.Err()
}

// findPlugin returns the engine's plugin child, named exe.
func findPlugin(pid int, exe string) (int, error) {
	var kids []int
	var err error
	for range 100 { // the plugin is loaded by now; this only rides out a racing read
		if kids, err = children(pid); err != nil {
			return 0, err
		}
		for _, k := range kids {
			if exeName(k) == exe {
				return k, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("engine %d has no %s child (children: %v)", pid, exe, kids)
}

// pids returns the host's and the plugin's process ids.
func (e *engineProc) pids() (host, plugin int) { return e.cmd.Process.Pid, e.pluginPID }

// peaks returns the VmHWM of host and plugin in bytes.
func (e *engineProc) peaks() (host, plugin int64, err error) {
	h, p := e.pids()
	if host, err = peakRSS(h); err != nil {
		return 0, 0, err
	}
	plugin, err = peakRSS(p)
	return host, plugin, err
}

// cpu returns the CPU seconds host and plugin have used so far; a process
// that is gone reads as 0, and the transfer's own error reports why.
func (e *engineProc) cpu() (host, plugin float64) {
	h, p := e.pids()
	host, _ = proccpu.Of(h)
	plugin, _ = proccpu.Of(p)
	return host, plugin
}

// transferClock is what the engine's /metrics say of its completed
// transfers in one direction: how many, the seconds they took and the part
// of them the host spent waiting on the plugin.
type transferClock struct{ count, total, wait float64 }

// transferClockAfter returns the engine's transfer clock for op once it
// counts more than n transfers: a STATE_GET's client has its last byte
// before the engine has counted the transfer.
func (e *engineProc) transferClockAfter(ctx context.Context, op string, n float64) (transferClock, error) {
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := e.transferClock(ctx, op)
		if err != nil || c.count > n {
			return c, err
		}
		if time.Now().After(deadline) {
			return c, fmt.Errorf("engine /metrics: the %s transfer was not counted within 2 s", op)
		}
		time.Sleep(time.Millisecond)
	}
}

// transferClock reads the engine's transfer clock for op from /metrics.
func (e *engineProc) transferClock(ctx context.Context, op string) (transferClock, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.http+"/metrics", nil)
	if err != nil {
		return transferClock{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return transferClock{}, fmt.Errorf("engine /metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return transferClock{}, fmt.Errorf("engine /metrics: %w", err)
	}
	return parseTransferClock(string(body), op)
}

// parseTransferClock reads a transfer clock out of a /metrics text
// exposition.
func parseTransferClock(text, op string) (transferClock, error) {
	dir := `{direction="get"}`
	if op == opPut {
		dir = `{direction="put"}`
	}
	var c transferClock
	want := map[string]*float64{
		"hydra_engine_state_transfer_seconds_count" + dir:              &c.count,
		"hydra_engine_state_transfer_seconds_sum" + dir:                &c.total,
		"hydra_engine_state_transfer_backend_wait_seconds_total" + dir: &c.wait,
	}
	waitSeen := false
	for _, line := range strings.Split(text, "\n") {
		name, value, ok := strings.Cut(line, " ")
		if v, known := want[name]; known && ok {
			var err error
			if *v, err = strconv.ParseFloat(strings.TrimSpace(value), 64); err != nil {
				return transferClock{}, fmt.Errorf("engine /metrics: %s: %w", name, err)
			}
			waitSeen = waitSeen || v == &c.wait
		}
	}
	// The histogram appears with its first transfer; the wait counter is
	// always there, unless the engine predates it.
	if !waitSeen {
		return transferClock{}, fmt.Errorf("engine /metrics has no hydra_engine_state_transfer_backend_wait_seconds_total%s", dir)
	}
	return c, nil
}

// resetPeaks starts a new VmHWM window in both processes.
func (e *engineProc) resetPeaks() error {
	h, p := e.pids()
	return errors.Join(resetPeakRSS(h), resetPeakRSS(p))
}

// stop terminates the engine (SIGTERM, then SIGKILL after a grace period)
// and returns its exit error, if any.
func (e *engineProc) stop() error {
	select {
	case <-e.done:
		return e.waitErr
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
		return e.waitErr
	case <-time.After(20 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.done
		return fmt.Errorf("engine did not stop on SIGTERM within 20s\n%s", e.logs)
	}
}

// exited reports the engine's exit, if it died.
func (e *engineProc) exited() error {
	select {
	case <-e.done:
		return fmt.Errorf("engine exited: %v\n%s", e.waitErr, e.logs)
	default:
		return nil
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last max bytes written to it: enough of an engine's
// log to explain a failure.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// mustExecutable checks that path is an executable file.
func mustExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
