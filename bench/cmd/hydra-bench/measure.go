package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/bench/internal/proccpu"
	"github.com/hydra-engine/hydra-engine/internal/enginetest"
)

// engineConfig is what one engine process is started with.
type engineConfig struct {
	Plane string // --data-plane: "shm" or "grpc"
	Chunk int    // state_chunk_size, set with CONFIGURE before the prefill
}

// label names the configuration's role in the tables.
func (c engineConfig) label() string {
	if c.Plane == "grpc" {
		return "gRPC stream"
	}
	return "pipelined"
}

func (c engineConfig) String() string {
	return fmt.Sprintf("%s, chunk %s", c.Plane, chunkName(c.Chunk))
}

// flags are the configuration's engine flags.
func (c engineConfig) flags() []string {
	return []string{"--data-plane", c.Plane}
}

// engineProc is a running hydra-engine with its plugin child
// (internal/enginetest's engine, with what the benchmark measures of it).
type engineProc struct {
	*enginetest.Engine
	pluginPID int
}

// startEngine starts bin/hydra-engine on the backend with the given extra
// flags (on cpus when set: --server-cpus), listening on a free TCP port, a
// Unix socket in sockDir and HTTP (for /metrics), and waits until INFO
// answers on both Hydra sockets (the engine listens before it loads the
// plugin, so a bare connect proves nothing).
func startEngine(ctx context.Context, bin, sockDir string, backend backendSpec, extra []string, cpus string) (*engineProc, error) {
	e, err := enginetest.Start(ctx, enginetest.Config{
		Bin:           bin,
		Backend:       backend.path(bin),
		Args:          append(append(backend.args(), "--slots", "2", "--log-level", "warn"), extra...),
		HTTP:          true,
		WaitInfo:      true,
		SockDir:       sockDir,
		CPUs:          cpus,
		LogTail:       64 << 10,
		DieWithParent: true, // an interrupted benchmark must not leave 1 GB engines behind
	})
	if err != nil {
		return nil, err
	}
	p := &engineProc{Engine: e}
	if p.pluginPID, err = e.PluginPID(); err != nil {
		e.Stop()
		return nil, err
	}
	return p, nil
}

// pids returns the host's and the plugin's process ids.
func (e *engineProc) pids() (host, plugin int) { return e.Pid(), e.pluginPID }

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
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.HTTP+"/metrics", nil)
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
