package tests

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// pluginPID finds the engine's plugin process: its only child that is not a
// thread of its own.
func pluginPID(t testing.TB, e *engine) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if kids := children(e.cmd.Process.Pid); len(kids) > 0 {
			return kids[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no plugin process under engine %d", e.cmd.Process.Pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// children are the live processes whose parent is pid.
func children(pid int) []int {
	var out []int
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil && processAlive(c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// processGroup returns pid's process group id.
func processGroup(t testing.TB, pid int) int {
	t.Helper()
	pgid, err := syscall.Getpgid(pid)
	if err != nil {
		t.Fatal(err)
	}
	return pgid
}

// waitRelaunch waits until a new plugin (not old) serves and slot 0 answers.
func waitRelaunch(t testing.TB, e *engine, old int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		pid := pluginPID(t, e)
		if pid != old {
			c, err := transport.DialClient(ctxT(t), e.unix)
			if err == nil {
				resp, _, err := c.Call(ctxT(t), transport.OpPrefill, "3", chat("are you back?"))
				c.Close()
				if err == nil && resp.Status == transport.StatusOK {
					return pid
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the plugin was not relaunched\n%s", e.logs)
	return 0
}

// TestPluginCrash kills the plugin with SIGKILL while each kind of request
// is in flight: a client whose reply header was not sent yet gets a framed
// error, one mid-payload sees the connection close; the engine relaunches the
// plugin, every slot is empty again, and the tunables survive.
func TestPluginCrash(t *testing.T) {
	e := startEngine(t, "--backend-opt", "kv_bytes_per_token=131072", "--backend-opt", "op_delay_ms=300")
	c := client(t, e.tcp)
	mustOK(t, c, transport.OpConfigure, "0", []byte(`{"state_chunk_size":1048576,"temperature":0.5}`))
	pid := pluginPID(t, e)
	if processGroup(t, pid) != pid {
		t.Fatalf("plugin %d is not the leader of its own process group", pid)
	}
	kill := func(pid int, after time.Duration) {
		time.Sleep(after)
		syscall.Kill(pid, syscall.SIGKILL)
	}

	// PREFILL and DECODE: the plugin dies while the op sleeps in it.
	for _, tc := range []struct {
		op transport.Op
		p  []byte
	}{{transport.OpPrefill, chat("crash me")}, {transport.OpDecode, []byte(`{"n_predict":50,"messages":[{"role":"user","content":"x"}]}`)}} {
		go kill(pid, 100*time.Millisecond)
		st, m, _ := call(t, client(t, e.tcp), tc.op, "0", tc.p)
		if st == transport.StatusOK || m["error"] == "" {
			t.Fatalf("%v across a plugin crash: %v %v", tc.op, st, m)
		}
		pid = waitRelaunch(t, e, pid)
	}

	// STATE_GET: the reply header is out; the connection closes mid-payload.
	// 600 tokens (~80 MB) are far more than the sockets buffer, and little
	// enough that PREFILL's own blob keeps the minimum rate on a loaded box.
	mustOK(t, c, transport.OpPrefill, "1", chat(strings.Repeat("s", 600)))
	rc := rawConn(t, e.unix)
	req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStateGet, KeyLen: 1})
	rc.Write(append(req, '1'))
	hdr := make([]byte, 12)
	if _, err := io.ReadFull(rc, hdr); err != nil || hdr[0] != 0 {
		t.Fatalf("STATE_GET header: % x %v", hdr, err)
	}
	h, _ := transport.ParseResponseHeader(hdr)
	io.ReadFull(rc, make([]byte, h.MetaLen))
	io.ReadFull(rc, make([]byte, 1<<20)) // the transfer is under way, the client slow
	kill(pid, 0)
	n, err := io.Copy(io.Discard, rc)
	if err == nil && uint64(n)+1<<20 >= h.PayloadLen {
		t.Fatalf("STATE_GET completed (%d of %d bytes) although the plugin died", n+1<<20, h.PayloadLen)
	}
	pid = waitRelaunch(t, e, pid)

	// STATE_PUT: the plugin dies mid-payload; the client gets a framed error
	// (the engine closes the connection after it rather than drain the rest
	// of a large payload, so the client's send may fail), and the slot is
	// empty.
	mustOK(t, c, transport.OpPrefill, "1", chat(strings.Repeat("p", 600)))
	_, blob := getState(t, c, "1")
	pc := rawConn(t, e.unix)
	req = transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStatePut, KeyLen: 1, PayloadLen: uint64(len(blob))})
	pc.Write(append(req, '2'))
	pc.Write(blob[:len(blob)/3])
	kill(pid, 200*time.Millisecond)
	go pc.Write(blob[len(blob)/3:])
	hdr2 := make([]byte, transport.ResponseHeaderSize)
	if _, err := io.ReadFull(pc, hdr2); err != nil {
		t.Fatalf("STATE_PUT across a plugin crash: reading the reply: %v", err)
	}
	h2, _ := transport.ParseResponseHeader(hdr2)
	meta := make([]byte, h2.MetaLen)
	if _, err := io.ReadFull(pc, meta); err != nil || h2.Status != transport.StatusError || !bytes.Contains(meta, []byte("error")) {
		t.Fatalf("STATE_PUT across a plugin crash: % x %s %v", hdr2, meta, err)
	}
	waitRelaunch(t, e, pid)

	// After the relaunches: slots empty, tunables kept, engine serving.
	c2 := client(t, e.unix)
	for _, slot := range []string{"0", "1", "2"} {
		m, _ := mustOK(t, c2, transport.OpStateMeta, slot, nil)
		if num(t, m, "n_past") != 0 {
			t.Fatalf("slot %s after relaunch: %v", slot, m)
		}
	}
	info, _ := mustOK(t, c2, transport.OpInfo, "", nil)
	if num(t, info, "state_chunk_size") != 1<<20 {
		t.Fatalf("state_chunk_size lost across plugin restarts: %v", info)
	}
	if !strings.Contains(e.logs.String(), "backend plugin relaunched") {
		t.Fatal("no relaunch logged")
	}
}

// TestPluginDiesWithEngine: a plugin whose engine is killed exits on its own.
func TestPluginDiesWithEngine(t *testing.T) {
	e := startEngine(t)
	pid := pluginPID(t, e)
	e.cmd.Process.Kill()
	<-e.exited
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("plugin %d outlived its engine", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGracefulShutdown: on SIGTERM the engine stops accepting, lets an
// in-flight STATE_GET finish within the grace period, and exits 0.
func TestGracefulShutdown(t *testing.T) {
	e := startEngine(t, "--backend-opt", "kv_bytes_per_token=131072")
	c := client(t, e.unix)
	mustOK(t, c, transport.OpPrefill, "0", chat(strings.Repeat("g", 1500)))
	resp, err := c.Do(ctxT(t), transport.Request{Op: transport.OpStateGet, Key: "0"})
	if err != nil || resp.Status != transport.StatusOK {
		t.Fatalf("STATE_GET: %v", err)
	}
	buf := make([]byte, 1<<20)
	got, _ := io.ReadFull(resp.Body, buf)
	e.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond) // the engine closes its listeners
	if _, err := transport.Dial(ctxT(t), e.tcp); err == nil {
		t.Error("a new connection was accepted after SIGTERM")
	}
	rest, err := io.Copy(io.Discard, resp.Body)
	if err != nil || uint64(got)+uint64(rest) != resp.PayloadLen {
		t.Fatalf("in-flight STATE_GET got %d of %d bytes: %v", int64(got)+rest, resp.PayloadLen, err)
	}
	select {
	case <-e.exited:
		if e.waitErr != nil {
			t.Fatalf("engine exit: %v\n%s", e.waitErr, e.logs)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("engine did not exit after SIGTERM")
	}
}

// TestDeadlines: a connection idle past --idle-timeout is closed, and so is a
// peer that stalls inside a request past --chunk-timeout; the engine keeps
// serving, and a slow but moving transfer is not cut. The minimum transfer
// rate is off here: it would cut the slow request (TestTrickle covers it).
func TestDeadlines(t *testing.T) {
	e := startEngine(t, "--idle-timeout", "1s", "--chunk-timeout", "1s", "--min-transfer-rate", "0")
	idle := rawConn(t, e.tcp)
	stalled := rawConn(t, e.unix)
	req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpConfigure, KeyLen: 1, PayloadLen: 100})
	stalled.Write(append(req, '0', '{')) // then nothing: the payload stalls
	for name, c := range map[string]io.Reader{"idle": idle, "stalled": stalled} {
		start := time.Now()
		n, err := c.Read(make([]byte, 64))
		if err != io.EOF || n != 0 {
			t.Fatalf("%s connection: read %d bytes, %v; want EOF", name, n, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("%s connection closed only after %v", name, d)
		}
	}
	// A payload that keeps moving, a piece every 400 ms, outlasts the 1 s
	// chunk timeout in total and is served.
	mc := rawConn(t, e.tcp)
	body := []byte(`{"state_chunk_size":1048576}`)
	req = transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpConfigure, KeyLen: 1, PayloadLen: uint64(len(body))})
	mc.Write(append(req, '0'))
	for i := 0; i < len(body); i += 7 {
		time.Sleep(400 * time.Millisecond)
		mc.Write(body[i:min(i+7, len(body))])
	}
	hdr := make([]byte, 12)
	if _, err := io.ReadFull(mc, hdr); err != nil || hdr[0] != 0 {
		t.Fatalf("slow but moving request: % x %v", hdr, err)
	}
	mustOK(t, client(t, e.tcp), transport.OpInfo, "", nil)
}
