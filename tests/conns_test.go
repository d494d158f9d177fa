package tests

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/transport"
)

// openFDs counts a process's open descriptors.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// vmRSS is a process's resident set in MiB, 0 if unreadable.
func vmRSS(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// infoOn sends INFO on a raw connection and returns the reply's status and
// meta.
func infoOn(c net.Conn) (transport.Status, string, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpInfo})); err != nil {
		return 0, "", err
	}
	h, err := transport.ReadResponseHeader(c)
	if err != nil {
		return 0, "", err
	}
	meta := make([]byte, h.MetaLen)
	_, err = io.ReadFull(c, meta)
	return h.Status, string(meta), err
}

var limitRE = regexp.MustCompile(`^\{"error":"too many connections: the limit is (\d+) per listener"\}$`)

// TestFDExhaustionKeepsServing is the descriptor-exhaustion attack: an
// engine under RLIMIT_NOFILE 1024 asked for --max-conns 4096 lowers its
// limit to fit; 1,100 idle connections (more than the process has
// descriptors) leave it running, serving on its other listener; one more is
// answered BUSY with the limit; once they close it serves them again.
func TestFDExhaustionKeepsServing(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("needs prlimit (util-linux)")
	}
	const attackers = 1100
	e := startWith(t, enginetest.Config{Wrap: []string{"prlimit", "--nofile=1024:1024"}, Args: []string{"--max-conns", "4096"}, WaitInfo: true})
	if !strings.Contains(e.logs.String(), "lowering the connection limit per listener") {
		t.Fatalf("no WARN about lowering --max-conns 4096 under RLIMIT_NOFILE 1024:\n%s", e.logs)
	}
	pid := e.cmd.Process.Pid
	fdsBefore, rssBefore := openFDs(t, pid), vmRSS(pid)
	conns := make([]net.Conn, 0, attackers)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	addr := strings.TrimPrefix(e.tcp, "tcp://")
	for range attackers {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	// The refused ones wait refuseWait for a request header, then are
	// answered and closed.
	time.Sleep(3 * time.Second)
	if err := e.e.Exited(); err != nil {
		t.Fatalf("the engine died under %d connections: %v", attackers, err)
	}
	if err := enginetest.Ping(ctxT(t), e.unix); err != nil {
		t.Fatalf("INFO on the Unix listener while TCP is full: %v", err)
	}
	st, meta, err := infoOn(rawConn(t, e.tcp))
	m := limitRE.FindStringSubmatch(meta)
	if err != nil || st != transport.StatusBusy || m == nil {
		t.Fatalf("a connection beyond the limit: status %v, meta %q, %v; want BUSY naming the limit", st, meta, err)
	}
	limit, _ := strconv.Atoi(m[1])
	held := heldConns(conns)
	fdsPeak, rssPeak := openFDs(t, pid), vmRSS(pid)
	if held != limit {
		t.Errorf("%d of %d connections held open, want the limit %d", held, attackers, limit)
	}
	start := time.Now()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	for {
		st, _, err := infoOn(rawConn(t, e.tcp))
		if err == nil && st == transport.StatusOK {
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("TCP listener not serving 15 s after the connections closed: %v %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	again := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	t.Logf("RLIMIT_NOFILE 1024: limit %d per listener; %d connections: %d held, %d refused; engine fds %d before, %d with them, %d after; "+
		"RSS %.1f MiB before, %.1f MiB with them, %.1f MiB after; TCP serving again %v after they closed",
		limit, attackers, held, attackers-held, fdsBefore, fdsPeak, openFDs(t, pid), rssBefore, rssPeak, vmRSS(pid), again.Round(time.Millisecond))
}

// heldConns counts the connections the engine keeps open: a refused one
// reads its BUSY reply and EOF, a held one has nothing to read.
func heldConns(conns []net.Conn) int {
	held := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			held++
		}
	}
	return held
}

// TestShutdownCutShortExitsNonZero: SIGTERM while a STATE_GET waits on a
// client that stopped reading; when --shutdown-grace runs out the request
// is cancelled and the engine exits 1 with an ERROR line counting it
// (TestGracefulShutdown: work that completes exits 0).
func TestShutdownCutShortExitsNonZero(t *testing.T) {
	e := startEngine(t, "--backend-opt", "kv_bytes_per_token=131072", "--shutdown-grace", "1s")
	c := client(t, e.unix)
	mustOK(t, c, transport.OpPrefill, "0", chat(strings.Repeat("g", 1500)))
	resp, err := c.Do(ctxT(t), transport.Request{Op: transport.OpStateGet, Key: "0"})
	if err != nil || resp.Status != transport.StatusOK {
		t.Fatalf("STATE_GET: %v", err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	// Then the client reads no more: the transfer cannot finish.
	start := time.Now()
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("engine did not exit after SIGTERM")
	}
	var ee *exec.ExitError
	if !errors.As(e.waitErr, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit after a cut-short shutdown: %v, want exit status 1\n%s", e.waitErr, e.logs)
	}
	if !regexp.MustCompile(`\[ERROR\].*1 Hydra RPC request\(s\) cancelled`).MatchString(e.logs.String()) {
		t.Fatalf("no ERROR line counting the cancelled request:\n%s", e.logs)
	}
	t.Logf("exit status 1, %v after SIGTERM with --shutdown-grace 1s", time.Since(start).Round(time.Millisecond))
}

// TestShutdownCutsHTTPStream: a streamed completion still decoding when the
// grace runs out is cut with a last SSE event saying the engine is shutting
// down (not an internal error, not a bare EOF), the plugin is gone, and the
// engine exits 1 within the grace and a second or two.
func TestShutdownCutsHTTPStream(t *testing.T) {
	e, base := startHTTPEngine(t, "--backend-opt", "op_delay_ms=50", "--shutdown-grace", "1s")
	plugin := pluginPID(t, e)
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"tell me everything","max_tokens":100000,"stream":true}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("streamed completion: %v %v", resp, err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the stream is under way
		t.Fatal(err)
	}
	start := time.Now()
	e.cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(br)
	events := strings.Split(strings.TrimSpace(string(rest)), "\n\n")
	last := events[len(events)-1]
	if !strings.Contains(last, `"code":"shutting_down"`) || !strings.Contains(last, "the engine is shutting down: the request was cut at the end of the shutdown grace") {
		t.Errorf("the stream's last event: %s", last)
	}
	select {
	case <-e.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("engine did not exit after SIGTERM")
	}
	took := time.Since(start)
	var ee *exec.ExitError
	if !errors.As(e.waitErr, &ee) || ee.ExitCode() != 1 || took > 4*time.Second {
		t.Errorf("exit %v after %v, want exit status 1 within the 1s grace and the cut's second", e.waitErr, took)
	}
	if processAlive(plugin) {
		t.Errorf("plugin %d outlived the engine", plugin)
	}
	if !strings.Contains(e.logs.String(), "HTTP completion cut by the shutdown") {
		t.Errorf("no log line of the cut:\n%s", e.logs)
	}
	t.Logf("exit status 1, %v after SIGTERM with --shutdown-grace 1s", took.Round(time.Millisecond))
}
