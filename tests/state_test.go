package tests

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// getState fetches a slot's blob and meta.
func getState(t testing.TB, c *transport.Client, slot string) (map[string]any, []byte) {
	t.Helper()
	return mustOK(t, c, transport.OpStateGet, slot, nil)
}

// decodeText decodes n tokens greedily and returns the text and meta.
func decodeText(t testing.TB, c *transport.Client, slot string, n int) (string, map[string]any) {
	t.Helper()
	m, _ := mustOK(t, c, transport.OpDecode, slot, decodeJSON(n))
	return m["text"].(string), m
}

// TestStateRoundTrip: PREFILL → STATE_GET → STATE_PUT into another slot, the
// same slot after it was overwritten, and a second engine process; the next
// greedy decode and n_past are identical everywhere.
func TestStateRoundTrip(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) { testStateRoundTrip(t, plane.flags) })
	}
}

// dataPlanes are the ways state bytes travel between host and plugin; the
// state tests run on each.
var dataPlanes = []struct {
	name  string
	flags []string
}{
	{"shm", []string{"--data-plane", "shm"}}, // the mock's STATE_PUTs spliced into pipes, the llama plugin's at 2 MiB onto the ring
	{"grpc", []string{"--data-plane", "grpc"}},
}

func testStateRoundTrip(t *testing.T, planeFlags []string) {
	opts := append([]string{"--backend-opt", "kv_bytes_per_token=4096"}, planeFlags...)
	// The second engine moves bytes the other way.
	e1, e2 := startEngine(t, opts...), startEngine(t, "--backend-opt", "kv_bytes_per_token=4096")
	for _, urls := range [][2]string{{e1.tcp, e2.tcp}, {e1.unix, e2.unix}} {
		c1, c2 := client(t, urls[0]), client(t, urls[1])
		mustOK(t, c1, transport.OpPrefill, "0", chat("The quick brown fox jumps over the lazy dog."))
		m, blob := getState(t, c1, "0")
		nPast := num(t, m, "n_past")
		if int64(len(blob)) != 10+4*nPast+num(t, m, "state_size")+transport.TrailerSize || m["model_hash"] == "" {
			t.Fatalf("STATE_GET meta %v for a %d-byte blob", m, len(blob))
		}
		// Restore into slot 2 and into engine 2's slot 3 before slot 0 moves on.
		pm, _ := mustOK(t, c1, transport.OpStatePut, "2", blob)
		if pm["restored"] != true || num(t, pm, "n_past") != nPast || num(t, pm, "bytes") != num(t, m, "state_size") {
			t.Fatalf("STATE_PUT meta %v", pm)
		}
		mustOK(t, c2, transport.OpStatePut, "3", blob)
		want, wm := decodeText(t, c1, "0", 40)
		if want == "" {
			t.Fatal("reference decode produced nothing")
		}
		for _, tc := range []struct {
			c    *transport.Client
			slot string
		}{{c1, "2"}, {c2, "3"}} {
			meta, _ := mustOK(t, tc.c, transport.OpStateMeta, tc.slot, nil)
			if num(t, meta, "n_past") != nPast {
				t.Fatalf("restored n_past %v, want %d", meta, nPast)
			}
			got, gm := decodeText(t, tc.c, tc.slot, 40)
			if got != want || num(t, gm, "n_past") != num(t, wm, "n_past") {
				t.Fatalf("decode after restore %q (n_past %v), want %q (n_past %v)", got, gm["n_past"], want, wm["n_past"])
			}
		}
		// Slot 0 has moved on; putting the old blob back rewinds it exactly.
		mustOK(t, c1, transport.OpStatePut, "0", blob)
		if got, _ := decodeText(t, c1, "0", 40); got != want {
			t.Fatalf("rewound slot 0 decoded %q, want %q", got, want)
		}
	}
}

// TestStatePutFailuresEmptyTheSlot: malformed, truncated and mismatched
// blobs each get a framed ERROR, leave the slot empty, and leave other slots
// and the engine untouched.
func TestStatePutFailuresEmptyTheSlot(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) { testStatePutFailuresEmptyTheSlot(t, plane.flags) })
	}
}

func testStatePutFailuresEmptyTheSlot(t *testing.T, planeFlags []string) {
	// A state of a few MiB: most of it is still on the socket, beyond the
	// host's buffer, when the backend refuses it, and must be drained.
	e := startEngine(t, append([]string{"--backend-opt", "kv_bytes_per_token=131072"}, planeFlags...)...)
	c := client(t, e.tcp)
	mustOK(t, c, transport.OpPrefill, "0", chat("source"))
	_, blob := getState(t, c, "0")
	mustOK(t, c, transport.OpPrefill, "1", chat("bystander"))
	bm, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)
	flip := func(i int) []byte { b := bytes.Clone(blob); b[i] ^= 0xff; return b }
	cases := map[string][]byte{
		"truncated":      blob[:len(blob)-100],
		"header only":    blob[:10],
		"kv byte":        flip(len(blob) - 200),
		"token mismatch": flip(9),
		"garbage":        bytes.Repeat([]byte{0xAB}, 4096),
		"empty":          {},
		"n_tok huge":     append([]byte{2, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x0f}, blob[9:]...),
	}
	for name, bad := range cases {
		mustOK(t, c, transport.OpPrefill, "2", chat("victim"))
		st, m, _ := call(t, c, transport.OpStatePut, "2", bad)
		if st != transport.StatusError || m["error"] == "" {
			t.Errorf("%s: status %v meta %v", name, st, m)
		}
		meta, _ := mustOK(t, c, transport.OpStateMeta, "2", nil)
		if num(t, meta, "n_past") != 0 {
			t.Errorf("%s: slot 2 not empty after a failed restore: %v", name, meta)
		}
		if st, _, _ := call(t, c, transport.OpDecode, "2", decodeJSON(1)); st == transport.StatusOK {
			t.Errorf("%s: decode succeeded on a slot that should be empty", name)
		}
	}
	am, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)
	if num(t, am, "n_past") != num(t, bm, "n_past") {
		t.Fatalf("bystander slot changed: %v → %v", bm, am)
	}
	// The good blob still restores.
	mustOK(t, c, transport.OpStatePut, "2", blob)
}

// TestStatePutClientVanishes: a client that disconnects mid-payload leaves the
// slot empty; the engine serves the next client.
func TestStatePutClientVanishes(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) { testStatePutClientVanishes(t, plane.flags) })
	}
}

func testStatePutClientVanishes(t *testing.T, planeFlags []string) {
	e := startEngine(t, append([]string{"--backend-opt", "kv_bytes_per_token=65536"}, planeFlags...)...)
	c := client(t, e.unix)
	mustOK(t, c, transport.OpPrefill, "0", chat(strings.Repeat("state ", 100)))
	_, blob := getState(t, c, "0")
	rc := rawConn(t, e.unix)
	req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStatePut, KeyLen: 1, PayloadLen: uint64(len(blob))})
	rc.Write(append(req, '0'))
	rc.Write(blob[:len(blob)/2])
	rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
		if m["is_transferring"] == false && num(t, m, "n_past") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot 0 not emptied after the client vanished: %v\n%s", m, e.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustOK(t, c, transport.OpStatePut, "0", blob)
}

// TestStateGetClientVanishes: a reader that disconnects mid-STATE_GET leaves
// the slot intact and free.
func TestStateGetClientVanishes(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) { testStateGetClientVanishes(t, plane.flags) })
	}
}

func testStateGetClientVanishes(t *testing.T, planeFlags []string) {
	e := startEngine(t, append([]string{"--backend-opt", "kv_bytes_per_token=131072"}, planeFlags...)...)
	c := client(t, e.tcp)
	mustOK(t, c, transport.OpPrefill, "0", chat(strings.Repeat("big ", 200)))
	before, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
	rc := rawConn(t, e.tcp)
	req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStateGet, KeyLen: 1})
	rc.Write(append(req, '0'))
	io.ReadFull(rc, make([]byte, 1<<20))
	rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
		if m["is_transferring"] == false {
			if num(t, m, "n_past") != num(t, before, "n_past") {
				t.Fatalf("slot changed: %v → %v", before, m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("slot 0 still transferring after the client vanished")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, blob := getState(t, c, "0")
	if int64(len(blob)) != 10+4*num(t, before, "n_past")+num(t, before, "state_size")+transport.TrailerSize {
		t.Fatal("full STATE_GET after an aborted one is short")
	}
}

// TestLargeStateStreams moves a ~130 MB state (the mock at 128 KiB per token)
// through STATE_GET and STATE_PUT with the streaming client, at the smallest
// and a large chunk size.
func TestLargeStateStreams(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) { testLargeStateStreams(t, plane.flags) })
	}
}

func testLargeStateStreams(t *testing.T, planeFlags []string) {
	e := startEngine(t, append([]string{"--backend-opt", "kv_bytes_per_token=131072"}, planeFlags...)...)
	c := client(t, e.unix)
	mustOK(t, c, transport.OpPrefill, "0", []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, strings.Repeat("x", 1000))))
	for _, chunk := range []int{64 << 10, 8 << 20} {
		mustOK(t, c, transport.OpConfigure, "0", []byte(fmt.Sprintf(`{"state_chunk_size":%d}`, chunk)))
		resp, err := c.Do(ctxT(t), transport.Request{Op: transport.OpStateGet, Key: "0"})
		if err != nil || resp.Status != transport.StatusOK {
			t.Fatalf("STATE_GET: %v %v", err, resp)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil || uint64(n) != resp.PayloadLen || n < 130e6 {
			t.Fatalf("streamed %d of %d: %v", n, resp.PayloadLen, err)
		}
		// Stream it back through a pipe: nothing holds the blob whole.
		resp, err = c.Do(ctxT(t), transport.Request{Op: transport.OpStateGet, Key: "0"})
		if err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		c2 := client(t, e.tcp)
		copied := make(chan struct{})
		go func() {
			defer close(copied)
			_, err := io.Copy(pw, resp.Body)
			pw.CloseWithError(err)
		}()
		put, err := c2.Do(ctxT(t), transport.Request{Op: transport.OpStatePut, Key: "1", Payload: pr, PayloadLen: resp.PayloadLen})
		if err != nil || put.Status != transport.StatusOK {
			t.Fatalf("STATE_PUT: %v %+v", err, put)
		}
		put.Close()
		<-copied // c is the copier's until its body is read to the end
		a, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
		b, _ := mustOK(t, c2, transport.OpStateMeta, "1", nil)
		if a["n_past"] != b["n_past"] || a["state_size"] != b["state_size"] {
			t.Fatalf("restored slot %v, source %v", b, a)
		}
	}
	want, _ := decodeText(t, c, "0", 30)
	if got, _ := decodeText(t, c, "1", 30); got != want {
		t.Fatalf("decode after a streamed round trip %q, want %q", got, want)
	}
}

// TestHydractl drives the CLI against a live engine: info, configure,
// prefill, state get to a file, state put from it, decode, meta.
func TestHydractl(t *testing.T) {
	e := startEngine(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "slot0.blob")
	for _, addr := range []string{e.tcp, e.unix} {
		run := func(args ...string) map[string]any {
			t.Helper()
			out, errOut, err := hydractl(t, append([]string{"--addr", addr}, args...)...)
			if err != nil {
				t.Fatalf("hydractl %v: %v\n%s", args, err, errOut)
			}
			var m map[string]any
			line := strings.SplitN(strings.TrimSpace(out), "\n", 2)[0]
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("hydractl %v: first line is not JSON: %q", args, out)
			}
			return m
		}
		if m := run("info"); m["engine"] != "hydra-engine" {
			t.Fatalf("info: %v", m)
		}
		if m := run("configure", `{"state_chunk_size":4194304}`); num(t, m, "state_chunk_size_applied") != 4194304 {
			t.Fatalf("configure: %v", m)
		}
		pm := run("prefill", "--slot", "0", "--text", "hydractl says hi")
		run("state", "get", "--slot", "0", "-o", file)
		st, err := os.Stat(file)
		if err != nil || st.Size() != 10+4*num(t, pm, "n_past")+num(t, pm, "state_size")+transport.TrailerSize {
			t.Fatalf("state file: %v %v", st, err)
		}
		if m := run("state", "put", "--slot", "1", "-i", file); m["restored"] != true {
			t.Fatalf("state put: %v", m)
		}
		a, b := run("decode", "--slot", "0", "--n", "20"), run("decode", "--slot", "1", "--n", "20")
		if a["text"] != b["text"] || a["text"] == "" {
			t.Fatalf("decode after hydractl round trip: %v vs %v", a, b)
		}
		if m := run("meta", "--slot", "1"); num(t, m, "n_past") != num(t, a, "n_past") {
			t.Fatalf("meta: %v", m)
		}
		_, errOut, err := hydractl(t, "--addr", addr, "meta", "--slot", "77")
		if err == nil || !strings.Contains(errOut, "NOT_FOUND") {
			t.Fatalf("meta of a missing slot: %v %q", err, errOut)
		}
	}
}

// TestTransferFloorWarns: a state transfer of 64 MiB or more below
// --state-transfer-floor is logged as a warning naming the side that set its
// pace; each transfer is logged at info with its path and GB/s.
func TestTransferFloorWarns(t *testing.T) {
	e := startEngine(t, "--state-transfer-floor", "1000000000000000")
	c := client(t, e.unix)
	ids := make([]byte, 0, 4*4100)
	for i := range 4100 {
		ids = binary.LittleEndian.AppendUint32(ids, uint32('a'+i%26))
	}
	mustOK(t, c, transport.OpPrefill, "0", ids)
	_, blob := getState(t, c, "0")
	if len(blob) < 64<<20 {
		t.Fatalf("a state of %d bytes is below the floor's 64 MiB", len(blob))
	}
	logs := e.logs.String()
	if !strings.Contains(logs, "state transfer below the floor") || !strings.Contains(logs, "set the pace") {
		t.Errorf("no warning of a transfer below the floor:\n%s", logs)
	}
	if !strings.Contains(logs, "path=shm-ring") || !strings.Contains(logs, "gbps=") {
		t.Errorf("the transfer's info line lacks its path or rate")
	}
}
