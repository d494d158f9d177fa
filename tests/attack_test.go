package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// The second round of outside attacks (docs/reliability.md's attack table):
// each test runs one against the real binaries and logs its figure.

// stalledReader sends a streamed completion over a socket with a small
// receive buffer and never reads the reply.
func stalledReader(t *testing.T, addr, body string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return c
}

// TestStalledReadersAreCut: four clients that stay connected but stop
// reading their streams hold every slot only until their writes miss the
// minimum rate's window; then their slots are free and other clients are
// served.
func TestStalledReadersAreCut(t *testing.T) {
	const window = 2 * time.Second
	e, base := startHTTPEngine(t, "--slots", "4", "--chunk-timeout", window.String(), "--backend-opt", "n_ctx=200000")
	body := `{"prompt":"stall","max_tokens":150000,"ignore_eos":true,"stream":true}`
	start := time.Now()
	for range 4 {
		stalledReader(t, e.e.HTTP, body)
	}
	// Every slot is taken by a stalled stream first.
	waitFor(t, 10*time.Second, "4 busy slots", func() bool { return busySlots(t, base) == 4 })
	busy := time.Since(start)
	// The streams fill the sockets' buffers first (how long that takes is the
	// machine's speed), then a window of blocked writes cuts each.
	waitFor(t, 60*time.Second, "the stalled streams' slots freed", func() bool { return busySlots(t, base) == 0 })
	freed := time.Since(start)
	var r struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	httpJSON(t, "POST", base+"/v1/completions", `{"prompt":"next","max_tokens":4}`, 200, &r)
	if len(r.Choices) != 1 || r.Choices[0].Text == "" {
		t.Fatalf("the next client: %+v", r)
	}
	if n := strings.Count(e.logs.String(), "HTTP client cut: it stopped reading the reply"); n != 4 {
		t.Errorf("the engine's log says %d streams were cut for not reading, want 4", n)
	}
	t.Logf("4 stalled readers: every slot busy after %v, all freed after %v (window %v); the next client served", busy.Round(time.Millisecond), freed.Round(time.Millisecond), window)
}

// busySlots counts the slots /slots reports processing.
func busySlots(t *testing.T, base string) int {
	var slots []struct {
		IsProcessing bool `json:"is_processing"`
	}
	httpJSON(t, "GET", base+"/slots", "", 200, &slots)
	n := 0
	for _, s := range slots {
		if s.IsProcessing {
			n++
		}
	}
	return n
}

// waitFor polls cond every 20 ms until it holds, failing after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSharedCacheServesHTTPBesideRPC: three slots sharing 3000 KV cells.
// While a Hydra RPC sequence holds most of them, a completion that does not
// fit waits in the queue (never a 4xx) and runs once the RPC slot is
// erased; completions' idle sequences are evicted, least recently used
// first, to make room for the next prompt and for an RPC STATE_PUT, and an
// RPC sequence is never evicted.
func TestSharedCacheServesHTTPBesideRPC(t *testing.T) {
	e, base := startHTTPEngine(t, "--slots", "3", "--backend-opt", "kv_unified=true", "--backend-opt", "n_ctx=3000")
	c := client(t, e.unix)
	long := func(n int, tag string) string { return strings.Repeat(tag, n/len(tag)) }
	mustOK(t, c, transport.OpPrefill, "0", chat(long(2000, "rpc ")))
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":4}`, long(1500, "http "))
	got := make(chan int, 1)
	go func() { code, _, _ := httpDo(t, "POST", base+"/v1/chat/completions", body); got <- code }()
	select {
	case code := <-got:
		t.Fatalf("a completion the RPC sequence leaves no room for answered %d instead of waiting", code)
	case <-time.After(500 * time.Millisecond):
	}
	_, blob := getState(t, c, "0")
	if code, b, _ := httpDo(t, "POST", base+"/slots/0?action=erase", ""); code != 200 {
		t.Fatalf("erase: %d %s", code, b)
	}
	if code := <-got; code != 200 {
		t.Fatalf("the waiting completion after the erase: %d", code)
	}
	// Idle completions' sequences hold 2700-odd cells.
	if code, b, _ := httpDo(t, "POST", base+"/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":4}`, long(1200, "more "))); code != 200 {
		t.Fatalf("second completion: %d %s", code, b)
	}
	// The RPC state of 2000 cells needs room they hold.
	mustOK(t, c, transport.OpStatePut, "0", blob)
	m := metricsOf(t, base)
	if m["hydra_engine_kv_evictions_total"] < 1 || m[`hydra_engine_slot_evictions_total{holder="rpc"}`] != 0 {
		t.Errorf("evictions: kv %v, rpc %v", m["hydra_engine_kv_evictions_total"], m[`hydra_engine_slot_evictions_total{holder="rpc"}`])
	}
	// A completion now waits again rather than evicting the RPC sequence.
	go func() { code, _, _ := httpDo(t, "POST", base+"/v1/chat/completions", body); got <- code }()
	select {
	case code := <-got:
		t.Fatalf("a completion beside the restored RPC sequence answered %d instead of waiting", code)
	case <-time.After(300 * time.Millisecond):
	}
	if _, b := getState(t, c, "0"); !bytes.Equal(b, blob) {
		t.Error("the restored RPC sequence changed")
	}
	if code, b, _ := httpDo(t, "POST", base+"/slots/0?action=erase", ""); code != 200 {
		t.Fatalf("erase: %d %s", code, b)
	}
	if code := <-got; code != 200 {
		t.Fatalf("the completion after the RPC slot emptied: %d", code)
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc), so that nothing it was doing can still answer.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(tasks) > 0
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			i := bytes.LastIndexByte(b, ')')
			if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process %d did not stop within 5 s of SIGSTOP", pid)
}

// TestInfoWhilePluginHung: with the plugin stopped (SIGSTOP), INFO answers
// ERROR with backend_available false within its deadline, as /health
// answers 503; once the plugin runs again both answer OK.
func TestInfoWhilePluginHung(t *testing.T) {
	e, base := startHTTPEngine(t)
	c := client(t, e.tcp)
	pid, err := e.e.PluginPID()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	waitStopped(t, pid) // the signal is queued; its threads stop when next scheduled
	health := make(chan int, 1)
	go func() { // no t.Fatal off the test's goroutine: a failed request is code 0
		code := 0
		if resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(base + "/health"); err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		health <- code
	}()
	start := time.Now()
	resp, _, err := c.Call(ctxT(t), transport.OpInfo, "", nil)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if resp.Status != transport.StatusError || json.Unmarshal(resp.Meta, &m) != nil || m["backend_available"] != false ||
		!strings.Contains(fmt.Sprint(m["error"]), "not answering") {
		t.Fatalf("INFO with the plugin stopped: %v %s", resp.Status, resp.Meta)
	}
	if code := <-health; code != 503 {
		t.Errorf("/health with the plugin stopped: %d", code)
	}
	syscall.Kill(pid, syscall.SIGCONT)
	mustOK(t, c, transport.OpInfo, "", nil)
	if code, b, _ := httpDo(t, "GET", base+"/health", ""); code != 200 {
		t.Errorf("/health after SIGCONT: %d %s", code, b)
	}
	t.Logf("INFO with the plugin stopped: ERROR after %v", took.Round(time.Millisecond))
}

// TestOversizedPromptsRefusedAtOnce: a message of 80,000 special-token
// texts (781 KB) and a conversation of 10^5 messages (3.3 MB) are answered
// 400 in well under a second, from their size alone, over HTTP and as a
// PREFILL.
func TestOversizedPromptsRefusedAtOnce(t *testing.T) {
	e, base := startHTTPEngine(t, "--payload-budget", "67108864")
	c := client(t, e.tcp)
	special := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":4}`, strings.Repeat("<|im_end|>", 80000))
	var sb strings.Builder
	sb.WriteString(`{"messages":[`)
	for i := range 100000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"hi"}`)
	}
	sb.WriteString(`],"max_tokens":4}`)
	for name, body := range map[string]string{"80,000 special tokens": special, "10^5 messages": sb.String()} {
		start := time.Now()
		code, b, _ := httpDo(t, "POST", base+"/v1/chat/completions", body)
		took := time.Since(start)
		if code != 400 || !strings.Contains(string(b), "cannot fit: a slot holds") {
			t.Errorf("%s: %d %s", name, code, b)
		}
		start = time.Now()
		resp, _, err := c.Call(ctxT(t), transport.OpPrefill, "0", []byte(body))
		rpcTook := time.Since(start)
		if err != nil || resp.Status != transport.StatusError || !strings.Contains(string(resp.Meta), "cannot fit: a slot holds") {
			t.Errorf("%s as a PREFILL: %v %+v", name, err, resp)
		}
		t.Logf("%s (%d KB): HTTP 400 in %v, PREFILL ERROR in %v", name, len(body)>>10, took.Round(time.Millisecond), rpcTook.Round(time.Millisecond))
	}
}
