package tests

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/transport"
)

// TestRestartKeepsSlotOwnership: a STATE_GET whose
// client stopped reading outlives a plugin restart; a STATE_PUT on the same
// slot starts on the relaunched plugin; then the old client goes away. The
// old request must not free the slot the restore holds: STATE_META stays
// transferring, a second STATE_GET and a second STATE_PUT get BUSY, and the
// restore completes into a slot that holds the restored sequence.
func TestRestartKeepsSlotOwnership(t *testing.T) {
	e := startEngine(t, "--backend-opt", "kv_bytes_per_token=131072")
	c := client(t, e.unix)

	// The blob to restore later, and what its sequence decodes to.
	mustOK(t, c, transport.OpPrefill, "2", chat("restore me"))
	src, blob := getState(t, c, "2")
	want, _ := decodeText(t, c, "2", 5)

	// Slot 1's state (tens of MB) cannot fit the socket buffers: its
	// STATE_GET stalls in a write once the client stops reading.
	mustOK(t, c, transport.OpPrefill, "1", chat(strings.Repeat("s", 400)))
	old := rawConn(t, e.unix)
	old.Write(append(transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStateGet, KeyLen: 1}), '1'))
	hdr := readReplyStart(t, old)
	if hdr.Status != transport.StatusOK {
		t.Fatalf("old STATE_GET: %v", hdr.Status)
	}
	io.ReadFull(old, make([]byte, 64<<10)) // then it reads no more
	t.Logf("the old STATE_GET stalled with %d bytes queued to its client", waitStalled(t, old))

	pid := pluginPID(t, e)
	killed := time.Now()
	syscall.Kill(pid, syscall.SIGKILL)
	waitMeta(t, c, "2", func(m map[string]any) bool { return num(t, m, "n_past") == 0 })
	t.Logf("STATE_META reported the killed plugin's slot empty %v after the kill", time.Since(killed))
	waitRelaunch(t, e, pid)

	// The restore starts on the new plugin and stalls halfway.
	put := rawConn(t, e.unix)
	put.Write(append(transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStatePut, KeyLen: 1,
		PayloadLen: uint64(len(blob))}), '1'))
	put.Write(blob[:len(blob)/2])
	waitMeta(t, c, "1", func(m map[string]any) bool { return m["is_transferring"] == true })

	// The old client goes; its request ends in the engine.
	old.Close()
	waitLog(t, e, "request aborted, closing connection", "STATE_GET")

	if m, _ := mustOK(t, c, transport.OpStateMeta, "1", nil); m["is_transferring"] != true {
		t.Fatalf("STATE_META during the restore, after the old STATE_GET ended: %v", m)
	}
	for _, op := range []transport.Op{transport.OpStateGet, transport.OpStatePut} {
		p := map[transport.Op][]byte{transport.OpStatePut: blob}[op]
		resp, _, err := client(t, e.unix).Call(ctxT(t), op, "1", p)
		if err != nil {
			t.Fatalf("%v on the slot being restored: %v; want BUSY", op, err)
		}
		if resp.Status != transport.StatusBusy {
			t.Fatalf("%v on the slot being restored: %v %s; want BUSY", op, resp.Status, resp.Meta)
		}
	}

	put.Write(blob[len(blob)/2:])
	h, meta, _ := exchange(t, put, nil)
	var m map[string]any
	if err := json.Unmarshal(meta, &m); h[0] != byte(transport.StatusOK) || err != nil || m["restored"] != true {
		t.Fatalf("the restore: % x %s", h, meta)
	}
	if num(t, m, "n_past") != num(t, src, "n_past") {
		t.Fatalf("restored n_past %v, the blob's %v", m["n_past"], src["n_past"])
	}
	if got, _ := decodeText(t, c, "1", 5); got != want {
		t.Fatalf("the restored slot decodes %q, its source decoded %q", got, want)
	}
}

// readReplyStart reads a reply's header and meta.
func readReplyStart(t testing.TB, c net.Conn) transport.ResponseHeader {
	t.Helper()
	b := make([]byte, transport.ResponseHeaderSize)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading a reply header: %v", err)
	}
	h, err := transport.ParseResponseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, h.MetaLen)); err != nil {
		t.Fatal(err)
	}
	return h
}

// waitStalled waits until the bytes queued to c stop growing, so the engine,
// with more to send, is blocked in a write, and returns how many are queued.
func waitStalled(t testing.TB, c net.Conn) int {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	queued := func() (n int) {
		raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for last := -1; time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		n := queued()
		if n == last && n >= 1<<20 {
			return n
		}
		last = n
	}
	t.Fatal("the engine never stalled writing to the client")
	return 0
}

// waitMeta polls STATE_META of slot until ok says so.
func waitMeta(t testing.TB, c *transport.Client, slot string, ok func(map[string]any) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m, _ := mustOK(t, c, transport.OpStateMeta, slot, nil)
		if ok(m) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot %s never got there: %v", slot, m)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitLog waits for a line of the engine's log that holds every part.
func waitLog(t testing.TB, e *engine, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(e.logs.String(), "\n") {
			found := true
			for _, p := range parts {
				found = found && strings.Contains(line, p)
			}
			if found {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no log line with %q", parts)
}

// TestInfoWhileRestarting: while the plugin is down and cannot be relaunched,
// INFO answers ERROR with the reason, no stale backend details, and every
// slot reads empty; once the plugin is back INFO is OK again.
func TestInfoWhileRestarting(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "hydra-plugin-mock")
	exe, err := os.ReadFile(filepath.Join(binDir, "hydra-plugin-mock"))
	if err != nil || os.WriteFile(bin, exe, 0o755) != nil {
		t.Fatalf("copying the mock plugin: %v", err)
	}
	e := startEngine(t, "--backend", bin)
	c := client(t, e.unix)
	mustOK(t, c, transport.OpPrefill, "0", chat("lost in the crash"))

	// The relaunch fails until the executable is back.
	os.Chmod(bin, 0o600)
	pid := pluginPID(t, e)
	syscall.Kill(pid, syscall.SIGKILL)
	// Until the supervisor sees the plugin gone, INFO finds it not answering.
	deadline := time.Now().Add(20 * time.Second)
	st, m, _ := call(t, c, transport.OpInfo, "", nil)
	restarting := func() bool {
		return st == transport.StatusError && strings.Contains(fmt.Sprint(m["error"]), "restarting")
	}
	for ; !restarting() && time.Now().Before(deadline); st, m, _ = call(t, c, transport.OpInfo, "", nil) {
		time.Sleep(5 * time.Millisecond)
	}
	_, hasHash := m["model_hash"]
	if st != transport.StatusError || !strings.Contains(fmt.Sprint(m["error"]), "restarting") ||
		m["backend_available"] != false || hasHash {
		t.Fatalf("INFO while the plugin is down: %v %v", st, m)
	}
	if meta, _ := mustOK(t, c, transport.OpStateMeta, "0", nil); num(t, meta, "n_past") != 0 {
		t.Fatalf("STATE_META while the plugin is down: %v", meta)
	}

	os.Chmod(bin, 0o755)
	waitRelaunch(t, e, pid)
	if info, _ := mustOK(t, c, transport.OpInfo, "", nil); info["backend"] != "mock" || num(t, info, "n_ctx") == 0 {
		t.Fatalf("INFO after the relaunch: %v", info)
	}
}

// TestStatePutHeaderOverContext: a blob header claiming 2^24 tokens, in a
// payload announced big enough to hold them, is refused from its first 9
// bytes (n_tok against n_ctx), before anything is allocated for the tokens
// and before the rest is sent; the slot is left empty and the others are
// untouched.
func TestStatePutHeaderOverContext(t *testing.T) {
	e := startEngine(t)
	c := client(t, e.unix)
	mustOK(t, c, transport.OpPrefill, "0", chat("bystander"))
	mustOK(t, c, transport.OpPrefill, "1", chat("overwritten"))
	before, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
	rssBefore := procStatus(t, e.cmd.Process.Pid, "VmHWM")

	const nTok = 1 << 24
	head := transport.AppendBlobHeader(nil, 0, nil, transport.BlobExtras{})[:9]
	head[5], head[6], head[7], head[8] = 0, 0, 0, 1 // n_tok = 2^24, little-endian
	pc := rawConn(t, e.unix)
	pc.Write(append(transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStatePut, KeyLen: 1,
		PayloadLen: 10 + 4*nTok}), '1'))
	start := time.Now()
	pc.Write(head) // and nothing more
	h := readReplyStart(t, pc)
	t.Logf("refused %v after the header; engine peak RSS %d kB before, %d kB after", time.Since(start), rssBefore,
		procStatus(t, e.cmd.Process.Pid, "VmHWM"))
	if h.Status != transport.StatusError {
		t.Fatalf("STATE_PUT of 2^24 tokens: %v", h.Status)
	}
	pc.Close()

	m, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)
	if num(t, m, "n_past") != 0 || m["is_transferring"] != false {
		t.Fatalf("slot 1 after the refusal: %v", m)
	}
	if after, _ := mustOK(t, c, transport.OpStateMeta, "0", nil); num(t, after, "n_past") != num(t, before, "n_past") {
		t.Fatalf("bystander slot 0 changed: %v, was %v", after, before)
	}
}

// procStatus reads a kB figure of /proc/PID/status.
func procStatus(t testing.TB, pid int, key string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			var n int64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &n)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}
