package tests

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/transport"
)

// flagsAt is the offset of a v2 blob's flags byte.
func flagsAt(blob []byte) int { return 9 + 4*int(binary.LittleEndian.Uint32(blob[5:])) }

// checkTrailerOf fails unless blob ends in a valid integrity trailer that
// its flags announce.
func checkTrailerOf(t *testing.T, blob []byte) {
	t.Helper()
	n := len(blob) - transport.TrailerSize
	if blob[flagsAt(blob)]&0x04 == 0 || string(blob[n:n+4]) != "HYCK" {
		t.Fatalf("blob without its integrity trailer: flags %#02x, ends % x", blob[flagsAt(blob)], blob[n:])
	}
	if err := transport.CheckTrailer(blob[n:], crc32.Checksum(blob[:n], crc32.MakeTable(crc32.Castagnoli)), uint64(n)); err != nil {
		t.Fatal(err)
	}
}

// withoutTrailer is blob as the reference engine (or an old hydra-engine)
// writes it: flags bit2 clear, no trailer.
func withoutTrailer(blob []byte) []byte {
	b := bytes.Clone(blob[:len(blob)-transport.TrailerSize])
	b[flagsAt(b)] &^= 0x04
	return b
}

// TestStateIntegrity: STATE_GET's blob ends in the integrity trailer; one
// byte flipped anywhere in its state (beginning, middle, end), a cut-off
// trailer, a trailer whose count or CRC is off each get 0x02 naming the
// integrity check, leave the target slot empty and every other slot as it
// was; the blob as it came, and the same blob without a trailer (the
// reference engine's), restore. On both data planes, TCP and Unix.
func TestStateIntegrity(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) {
			// A state of a few MiB, larger than a pipe and several ring chunks.
			e := startEngine(t, append([]string{"--backend-opt", "kv_bytes_per_token=65536"}, plane.flags...)...)
			for _, url := range []string{e.tcp, e.unix} {
				testStateIntegrity(t, client(t, url))
			}
		})
	}
}

func testStateIntegrity(t *testing.T, c *transport.Client) {
	mustOK(t, c, transport.OpPrefill, "0", chat("the state under test"))
	m, blob := getState(t, c, "0")
	checkTrailerOf(t, blob)
	head := flagsAt(blob) + 1
	end := len(blob) - transport.TrailerSize // the state is blob[head:end]
	if int64(end-head) != num(t, m, "state_size") {
		t.Fatalf("state of %d bytes between wrapper and trailer, meta says %v", end-head, m["state_size"])
	}
	mustOK(t, c, transport.OpPrefill, "1", chat("bystander"))
	before := map[string]map[string]any{}
	for _, s := range []string{"0", "1"} {
		before[s], _ = mustOK(t, c, transport.OpStateMeta, s, nil)
	}
	flip := func(i int) []byte { b := bytes.Clone(blob); b[i] ^= 0x10; return b }
	count := func(d uint64) []byte {
		b := bytes.Clone(blob)
		binary.LittleEndian.PutUint64(b[len(b)-8:], uint64(end)+d)
		return b
	}
	cases := []struct {
		name, want string
		blob       []byte
	}{
		{"flip state start", "integrity check failed: CRC-32C", flip(head)},
		{"flip state magic+1", "integrity check failed: CRC-32C", flip(head + 1)},
		{"flip state middle", "integrity check failed: CRC-32C", flip(head + (end-head)/2)},
		{"flip state end", "integrity check failed: CRC-32C", flip(end - 1)},
		{"flip trailer crc", "integrity check failed: CRC-32C", flip(end + 5)},
		{"cut-off trailer", "does not end in the integrity trailer", blob[:len(blob)-5]},
		{"trailer lost", "does not end in the integrity trailer", blob[:end]},
		{"trailer count +1", "the trailer sums", count(1)},
		{"trailer count -1", "the trailer sums", count(^uint64(0))},
	}
	for _, tc := range cases {
		mustOK(t, c, transport.OpPrefill, "2", chat("victim"))
		st, em, _ := call(t, c, transport.OpStatePut, "2", tc.blob)
		msg, _ := em["error"].(string)
		if st != transport.StatusError || !strings.Contains(msg, "KV blob integrity check failed") || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: status %v, meta %v; want 0x02 naming the integrity check (%q)", tc.name, st, em, tc.want)
		}
		if meta, _ := mustOK(t, c, transport.OpStateMeta, "2", nil); num(t, meta, "n_past") != 0 || num(t, meta, "state_size") > 100 {
			t.Errorf("%s: slot 2 not empty after the refused restore: %v", tc.name, meta)
		}
		if st, _, _ := call(t, c, transport.OpDecode, "2", decodeJSON(1)); st == transport.StatusOK {
			t.Errorf("%s: slot 2 decodes after the refused restore", tc.name)
		}
		for _, s := range []string{"0", "1"} {
			if after, _ := mustOK(t, c, transport.OpStateMeta, s, nil); num(t, after, "n_past") != num(t, before[s], "n_past") ||
				num(t, after, "state_size") != num(t, before[s], "state_size") {
				t.Fatalf("%s: slot %s changed: %v → %v", tc.name, s, before[s], after)
			}
		}
	}
	want, _ := decodeText(t, c, "0", 20)
	for name, good := range map[string][]byte{"as sent": blob, "without trailer": withoutTrailer(blob)} {
		pm, _ := mustOK(t, c, transport.OpStatePut, "2", good)
		if num(t, pm, "bytes") != num(t, m, "state_size") {
			t.Fatalf("%s: STATE_PUT %v", name, pm)
		}
		if got, _ := decodeText(t, c, "2", 20); got != want {
			t.Fatalf("%s: slot 2 decodes %q after the restore, slot 0 %q", name, got, want)
		}
	}
	// A client may ask for the reference engine's bytes.
	mustOK(t, c, transport.OpStatePut, "0", blob)
	if _, plain := mustOK(t, c, transport.OpStateGet, "0", []byte(`{"blob_trailer":false}`)); !bytes.Equal(plain, withoutTrailer(blob)) {
		t.Fatalf("STATE_GET with blob_trailer false: %d bytes, want the %d of the blob without its trailer", len(plain), end)
	}
}

// TestPrefillBlobTrailer: PREFILL's payload is wrapper, state, logits, then
// the trailer over all of them; it restores as it came.
func TestPrefillBlobTrailer(t *testing.T) {
	e := startEngine(t)
	c := client(t, e.unix)
	m, payload := mustOK(t, c, transport.OpPrefill, "0", chat("prefill with logits"))
	checkTrailerOf(t, payload)
	if want := flagsAt(payload) + 1 + int(num(t, m, "state_size")+num(t, m, "logits_size")) + transport.TrailerSize; len(payload) != want {
		t.Fatalf("PREFILL payload %d bytes, want %d", len(payload), want)
	}
	bad := bytes.Clone(payload)
	bad[len(bad)-transport.TrailerSize-3] ^= 1 // a logit
	if st, em, _ := call(t, c, transport.OpStatePut, "1", bad); st != transport.StatusError || !strings.Contains(fmt.Sprint(em["error"]), "integrity") {
		t.Fatalf("a changed logit: %v %v", st, em)
	}
	if pm, _ := mustOK(t, c, transport.OpStatePut, "1", payload); num(t, pm, "n_past") != num(t, m, "n_past") {
		t.Fatalf("STATE_PUT of PREFILL's payload: %v", pm)
	}
	_, plain := mustOK(t, c, transport.OpPrefill, "2", []byte(`{"messages":[{"role":"user","content":"prefill with logits"}],"blob_trailer":false}`))
	if len(plain) != len(payload)-transport.TrailerSize || plain[flagsAt(plain)] != 0 {
		t.Fatalf("PREFILL with blob_trailer false: %d bytes, flags %#02x", len(plain), plain[flagsAt(plain)])
	}
}

// layoutOf parses a blob's layout extra.
func layoutOf(t *testing.T, blob []byte) (layout map[string]any, source map[string]any) {
	t.Helper()
	at := flagsAt(blob)
	if blob[at]&0x02 == 0 {
		t.Fatalf("blob without a layout: flags %#02x", blob[at])
	}
	n := int(binary.LittleEndian.Uint32(blob[at+1:]))
	var x struct {
		Layout map[string]any `json:"layout"`
		Source map[string]any `json:"source"`
	}
	if err := json.Unmarshal(blob[at+5:at+5+n], &x); err != nil {
		t.Fatalf("layout extra %q: %v", blob[at+5:at+5+n], err)
	}
	return x.Layout, x.Source
}

// TestStateLayout: the layout extra only on request (STATE_GET's
// blob_layout, PREFILL's); a blob whose layout differs from the engine's is
// refused before the backend reads it, naming the key and both values, the
// slot empty and the connection in sync; a blob of another model with the
// same layout restores, and STATE_META says where the slot's state came from
// until the slot's sequence is replaced.
func TestStateLayout(t *testing.T) {
	src := startEngine(t, "--backend-opt", "kv_bytes_per_token=4096")
	// Another model, the same layout: the mock's identity follows n_ctx.
	same := startEngine(t, "--backend-opt", "kv_bytes_per_token=4096", "--backend-opt", "n_ctx=2048")
	other := startEngine(t, "--backend-opt", "kv_bytes_per_token=8192")
	cs, c2, c3 := client(t, src.tcp), client(t, same.unix), client(t, other.tcp)

	pm, plain := mustOK(t, cs, transport.OpPrefill, "0", chat("a state to move"))
	if plain[flagsAt(plain)]&0x02 != 0 {
		t.Fatal("PREFILL wrote the layout without being asked: a reference engine would read it as state")
	}
	gm, blob := mustOK(t, cs, transport.OpStateGet, "0", []byte(`{"blob_layout":true}`))
	layout, source := layoutOf(t, blob)
	checkTrailerOf(t, blob)
	if layout["kv_bytes_per_token"] != 4096.0 || layout["memory"] != "mock" || source["model_hash"] != gm["model_hash"] ||
		source["engine"] != "hydra-engine" || source["backend"] != "mock" {
		t.Fatalf("layout %v, source %v (meta %v)", layout, source, gm)
	}
	// The wrapper alike (the states differ in their seq_id).
	wrapper := flagsAt(blob) + 5 + int(binary.LittleEndian.Uint32(blob[flagsAt(blob)+1:]))
	if _, pb := mustOK(t, cs, transport.OpPrefill, "1", []byte(`{"messages":[{"role":"user","content":"a state to move"}],"blob_layout":true}`)); !bytes.Equal(pb[:wrapper], blob[:wrapper]) {
		t.Fatalf("PREFILL with blob_layout: its wrapper %q differs from STATE_GET's %q", pb[:wrapper], blob[:wrapper])
	}
	if _, plainGet := getState(t, cs, "0"); plainGet[flagsAt(plainGet)]&0x02 != 0 {
		t.Fatal("STATE_GET wrote the layout without being asked")
	}

	// Another layout: refused by the host, exactly these words (the mock's
	// would name its own header or the size).
	mustOK(t, c3, transport.OpPrefill, "1", chat("victim"))
	mustOK(t, c3, transport.OpPrefill, "2", chat("bystander"))
	bm, _ := mustOK(t, c3, transport.OpStateMeta, "2", nil)
	st, em, _ := call(t, c3, transport.OpStatePut, "1", blob)
	if want := "state layout differs: kv_bytes_per_token 8192 here, 4096 in the blob"; st != transport.StatusError || em["error"] != want {
		t.Fatalf("another layout: status %v, meta %v; want 0x02 %q", st, em, want)
	}
	if meta, _ := mustOK(t, c3, transport.OpStateMeta, "1", nil); num(t, meta, "n_past") != 0 {
		t.Fatalf("slot 1 not empty after the refusal: %v", meta)
	}
	if am, _ := mustOK(t, c3, transport.OpStateMeta, "2", nil); num(t, am, "n_past") != num(t, bm, "n_past") {
		t.Fatalf("bystander changed: %v → %v", bm, am)
	}
	// The same blob without the layout reaches the mock, which refuses it too.
	if st, em, _ := call(t, c3, transport.OpStatePut, "1", plain); st != transport.StatusError || !strings.Contains(fmt.Sprint(em["error"]), "mock state") {
		t.Fatalf("the plain blob on another layout: %v %v", st, em)
	}

	// Another model, the same layout: restored, its source reported.
	rm, _ := mustOK(t, c2, transport.OpStatePut, "1", blob)
	mm, _ := mustOK(t, c2, transport.OpStateMeta, "1", nil)
	for _, m := range []map[string]any{rm, mm} {
		if m["model_hash"] == gm["model_hash"] || m["source_model_hash"] != gm["model_hash"] ||
			m["source_model_alias"] != gm["model_alias"] || m["source_engine"] != "hydra-engine" || m["source_backend"] != "mock" {
			t.Fatalf("reply or meta after a restore from another model: %v (source %v)", m, gm)
		}
	}
	if num(t, mm, "n_past") != num(t, pm, "n_past") {
		t.Fatalf("restored n_past %v, want %v", mm["n_past"], pm["n_past"])
	}
	want, _ := decodeText(t, cs, "0", 10)
	if got, _ := decodeText(t, c2, "1", 10); got != want {
		t.Fatalf("decode after the restore %q, want %q", got, want)
	}
	if m, _ := mustOK(t, c2, transport.OpStateMeta, "1", nil); m["source_model_hash"] != gm["model_hash"] {
		t.Fatalf("DECODE continued the restored sequence, yet the source is gone: %v", m)
	}
	mustOK(t, c2, transport.OpPrefill, "1", chat("evaluated here"))
	if m, _ := mustOK(t, c2, transport.OpStateMeta, "1", nil); m["source_model_hash"] != nil {
		t.Fatalf("a PREFILLed slot still names a source: %v", m)
	}
	// A malformed layout extra.
	bad := bytes.Clone(blob)
	bad[flagsAt(bad)+5] = '['
	if st, em, _ := call(t, c2, transport.OpStatePut, "1", bad); st != transport.StatusError || !strings.Contains(fmt.Sprint(em["error"]), "malformed KV blob") {
		t.Fatalf("malformed layout: %v %v", st, em)
	}
	if st, _, _ := call(t, c2, transport.OpStateGet, "0", []byte(`{"blob_layout":"yes"}`)); st != transport.StatusError {
		t.Fatalf("STATE_GET with a bad blob_layout: %v", st)
	}
}
