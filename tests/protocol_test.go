package tests

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exchange writes raw request bytes and reads one reply: header, meta, payload.
func exchange(t testing.TB, c io.ReadWriter, req []byte) (hdr, meta, payload []byte) {
	t.Helper()
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	hdr = make([]byte, 12)
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Fatalf("reading reply header: %v", err)
	}
	h, _ := transport.ParseResponseHeader(hdr)
	meta = make([]byte, h.MetaLen)
	payload = make([]byte, h.PayloadLen)
	if _, err := io.ReadFull(c, meta); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, payload); err != nil {
		t.Fatal(err)
	}
	return hdr, meta, payload
}

// TestVectors replays the protocol doc's §10 request vectors byte for byte
// over both transports and checks the replies that §10 fixes.
func TestVectors(t *testing.T) {
	for _, unix := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "unix"}[unix], func(t *testing.T) {
			e := startEngine(t)
			url := e.tcp
			if unix {
				url = e.unix
			}
			c := rawConn(t, url)
			// INFO, key "0", trace "t1".
			hdr, meta, _ := exchange(t, c, unhex(t, "59 48 41 00 01 00 00 00 00 00 00 00 00 00 02 00 30 74 31"))
			if hdr[0] != 0 || !bytes.Contains(meta, []byte(`"capabilities":["prefill","decode","state_transfer"`)) {
				t.Fatalf("INFO: % x %s", hdr, meta)
			}
			// CONFIGURE state_chunk_size 2097152 → the exact 51-byte reply.
			hdr, meta, _ = exchange(t, c, unhex(t, "59 48 40 00 01 00 1c 00 00 00 00 00 00 00 11 00 30 73 74 61 72 74 75 70 2d 63 6f 6e 66 69 67 75 72 65 7b 22 73 74 61 74 65 5f 63 68 75 6e 6b 5f 73 69 7a 65 22 3a 32 30 39 37 31 35 32 7d"))
			want := unhex(t, "00 33 00 00 00 00 00 00 00 00 00 00 7b 22 73 75 63 63 65 73 73 22 3a 74 72 75 65 2c 22 73 74 61 74 65 5f 63 68 75 6e 6b 5f 73 69 7a 65 5f 61 70 70 6c 69 65 64 22 3a 32 30 39 37 31 35 32 7d")
			if got := append(hdr, meta...); !bytes.Equal(got, want) {
				t.Fatalf("CONFIGURE reply\n got % x\nwant % x", got, want)
			}
			// Clamped to 65536 → a 49-byte meta.
			body := []byte(`{"state_chunk_size":1024}`)
			req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpConfigure, KeyLen: 1, PayloadLen: uint64(len(body))})
			req = append(append(req, '0'), body...)
			hdr, meta, _ = exchange(t, c, req)
			if !bytes.Equal(hdr, unhex(t, "00 31 00 00 00 00 00 00 00 00 00 00")) || string(meta) != `{"success":true,"state_chunk_size_applied":65536}` {
				t.Fatalf("clamp: % x %s", hdr, meta)
			}
			// SET_EXPERT_MODE "combined" → solo (no peer), 30-byte meta.
			hdr, meta, _ = exchange(t, c, unhex(t, "59 48 44 00 01 00 08 00 00 00 00 00 00 00 02 00 30 74 72 63 6f 6d 62 69 6e 65 64"))
			if !bytes.Equal(hdr, unhex(t, "00 1e 00 00 00 00 00 00 00 00 00 00")) || string(meta) != `{"success":true,"mode":"solo"}` {
				t.Fatalf("SET_EXPERT_MODE: % x %s", hdr, meta)
			}
			// PIPELINE_ATTACH → NOT_IMPLEMENTED with the 103-byte meta.
			pa := []byte(`{"peer":"10.0.0.2:9503","ot_split":"blk"}`)
			req = transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpPipelineAttach, KeyLen: 1, PayloadLen: uint64(len(pa))})
			req = append(append(req, '0'), pa...)
			hdr, _, _ = exchange(t, c, req)
			if !bytes.Equal(hdr, unhex(t, "06 67 00 00 00 00 00 00 00 00 00 00")) {
				t.Fatalf("PIPELINE_ATTACH: % x", hdr)
			}
			// Empty slot 0 STATE_GET: meta order and the v2 wrapper of an empty
			// slot, flags bit2: the integrity trailer ends the payload
			// (docs/protocol.md; the reference engine ignores the bit).
			req = transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStateGet, KeyLen: 1})
			hdr, meta, payload := exchange(t, c, append(req, '0'))
			if hdr[0] != 0 || !bytes.HasPrefix(meta, []byte(`{"n_past":0,"state_size":`)) ||
				!bytes.HasPrefix(payload, unhex(t, "02 00 00 00 00 00 00 00 00 04")) || !bytes.Equal(payload[len(payload)-16:][:4], []byte("HYCK")) {
				t.Fatalf("empty STATE_GET: % x %s % x", hdr, meta, payload[:min(len(payload), 16)])
			}
			// E1 PREFILL, tokens 1..5, key "0", trace "test".
			hdr, meta, payload = exchange(t, c, unhex(t, "59 48 42 00 01 00 14 00 00 00 00 00 00 00 04 00 30 74 65 73 74 01 00 00 00 02 00 00 00 03 00 00 00 04 00 00 00 05 00 00 00"))
			if hdr[0] != 0 || !bytes.HasPrefix(meta, []byte(`{"n_past":5,`)) {
				t.Fatalf("E1 PREFILL: % x %s", hdr, meta)
			}
			wantBlob := unhex(t, "02 05 00 00 00 05 00 00 00 01 00 00 00 02 00 00 00 03 00 00 00 04 00 00 00 05 00 00 00 04") // flags bit2: the trailer
			if !bytes.HasPrefix(payload, wantBlob) {
				t.Fatalf("E1 PREFILL blob header: % x", payload[:len(wantBlob)])
			}
			// STATE_META, key "1", no trace.
			hdr, meta, _ = exchange(t, c, unhex(t, "59 48 32 00 01 00 00 00 00 00 00 00 00 00 00 00 31"))
			if hdr[0] != 0 || !bytes.HasPrefix(meta, []byte(`{"slot_id":1,"n_past":0,`)) {
				t.Fatalf("STATE_META: % x %s", hdr, meta)
			}
			// E1 DECODE, n_predict 10, continues slot 0: 9-byte frames, last final.
			hdr, meta, payload = exchange(t, c, unhex(t, "59 48 43 00 01 00 04 00 00 00 00 00 00 00 04 00 30 74 65 73 74 0a 00 00 00"))
			frames, err := transport.ParseDecodeFrames(payload)
			if hdr[0] != 0 || err != nil || len(frames) == 0 || len(frames) > 10 || !frames[len(frames)-1].Final {
				t.Fatalf("E1 DECODE: % x %s %d frames %v", hdr, meta, len(frames), err)
			}
			// SWAP_QUANT (§10 payload, key = a worker name) → NOT_IMPLEMENTED, framed.
			sq := unhex(t, "0c 00 51 36 5f 4b 2f 65 78 70 65 72 74 73 62 6c 6b 5c 2e 35 5c 2e 66 66 6e 5f 2e 2a 5f 65 78 70 73")
			req = transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpSwapQuant, KeyLen: 8, PayloadLen: uint64(len(sq))})
			req = append(append(req, "worker-1"...), sq...)
			hdr, meta, _ = exchange(t, c, req)
			if hdr[0] != 0x06 || !bytes.Contains(meta, []byte(`"success":false`)) {
				t.Fatalf("SWAP_QUANT: % x %s", hdr, meta)
			}
		})
	}
}

// TestBadMagicCloses: a header without the magic gets no reply, the
// connection is closed, and the engine keeps serving.
func TestBadMagicCloses(t *testing.T) {
	e := startEngine(t)
	c := rawConn(t, e.tcp)
	if _, err := c.Write(unhex(t, "48 59 41 00 01 00 00 00 00 00 00 00 00 00 00 00 30")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after bad magic: n=%d err=%v, want EOF", n, err)
	}
	mustOK(t, client(t, e.tcp), transport.OpInfo, "0", nil)
}

// TestNoDesync: an unknown op, a bad slot key, a refused oversized payload
// and a bad SWAP_QUANT each get a framed error, their payloads are drained,
// and the next request on the same connection works.
func TestNoDesync(t *testing.T) {
	e := startEngine(t)
	c := client(t, e.unix)
	junk := bytes.Repeat([]byte{0x59, 0x48}, 40000) // looks like magic if left unread
	cases := []struct {
		op      transport.Op
		key     string
		payload []byte
		want    transport.Status
	}{
		{0x7f, "0", junk, transport.StatusNotImplemented},
		{0x00, "", junk, transport.StatusNotImplemented},
		{transport.OpStateGet, "abc", junk, transport.StatusError},
		{transport.OpStatePut, "", junk, transport.StatusError},
		{transport.OpPrefill, "x1", junk, transport.StatusError},
		{transport.OpStateMeta, "", nil, transport.StatusError},
		{transport.OpSwapQuant, "w", []byte{0xff, 0xff, 1}, transport.StatusError},
		{transport.OpSetExpertMode, "0", []byte("Combined"), transport.StatusError},
		{transport.OpConfigure, "0", []byte(`{"state_chunk_size":`), transport.StatusError},
		{transport.OpDecode, "0", []byte(`{"n_predict":-1}`), transport.StatusError},
		{transport.OpPrefill, "0", []byte(`{"messages":[]}`), transport.StatusError},
	}
	for _, tc := range cases {
		st, m, _ := call(t, c, tc.op, tc.key, tc.payload)
		if st != tc.want {
			t.Errorf("%v key %q: status %v, want %v (meta %v)", tc.op, tc.key, st, tc.want, m)
		}
		if msg, _ := m["error"].(string); msg == "" {
			t.Errorf("%v key %q: no error message in meta %v", tc.op, tc.key, m)
		}
		mustOK(t, c, transport.OpInfo, "", nil)
	}
}

// TestOversizedJSONRefused: a payload over the 16 MiB JSON cap is refused
// before it is read and then drained; the connection stays usable.
func TestOversizedJSONRefused(t *testing.T) {
	e := startEngine(t)
	c := client(t, e.tcp)
	big := make([]byte, 16<<20+1)
	st, m, _ := call(t, c, transport.OpConfigure, "0", big)
	if st != transport.StatusError || !strings.Contains(m["error"].(string), "exceeds") {
		t.Fatalf("status %v meta %v", st, m)
	}
	mustOK(t, c, transport.OpInfo, "0", nil)
}

// TestStatePutTooLarge: a STATE_PUT announcing more than 4 GiB is answered
// at once with ERROR (the engine then drains what the client sends).
func TestStatePutTooLarge(t *testing.T) {
	e := startEngine(t)
	c := rawConn(t, e.tcp)
	req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStatePut, KeyLen: 1, PayloadLen: 4<<30 + 1})
	if _, err := c.Write(append(req, '0')); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 12)
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	h, _ := transport.ParseResponseHeader(hdr)
	meta := make([]byte, h.MetaLen)
	io.ReadFull(c, meta)
	if h.Status != transport.StatusError || !bytes.Contains(meta, []byte("exceeds")) {
		t.Fatalf("% x %s", hdr, meta)
	}
}

// TestMissingSlot: slot ops on a slot that does not exist answer NOT_FOUND.
func TestMissingSlot(t *testing.T) {
	e := startEngine(t, "--slots", "2")
	c := client(t, e.tcp)
	for _, op := range []transport.Op{transport.OpStateGet, transport.OpStateMeta, transport.OpStatePut, transport.OpPrefill, transport.OpDecode} {
		payload := []byte(nil)
		switch op {
		case transport.OpPrefill:
			payload = chat("hi")
		case transport.OpDecode:
			payload = decodeJSON(1)
		case transport.OpStatePut:
			payload = []byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		}
		for _, key := range []string{"2", "-1", "99"} {
			st, m, _ := call(t, c, op, key, payload)
			if st != transport.StatusNotFound || m["error"] != "invalid slot ID" {
				t.Errorf("%v slot %s: %v %v", op, key, st, m)
			}
		}
	}
}

// TestBusy: while a PREFILL runs on a slot, STATE_GET/PUT, PREFILL and DECODE
// of that slot answer BUSY, STATE_META reports it processing, and other slots
// are served.
func TestBusy(t *testing.T) {
	e := startEngine(t, "--backend-opt", "op_delay_ms=1500")
	slow := client(t, e.tcp)
	done := make(chan error, 1)
	go func() {
		resp, _, err := slow.Call(ctxT(t), transport.OpPrefill, "0", chat("hold the slot"))
		if err == nil {
			err = resp.Err()
		}
		done <- err
	}()
	c := client(t, e.unix)
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
		if m["is_processing"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("slot 0 never reported processing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	hdr, meta, _ := func() ([]byte, []byte, []byte) {
		rc := rawConn(t, e.tcp)
		req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStateGet, KeyLen: 1})
		return exchange(t, rc, append(req, '0'))
	}()
	if hdr[0] != byte(transport.StatusBusy) || !bytes.Contains(meta, []byte("busy")) {
		t.Fatalf("STATE_GET while busy: % x %s", hdr, meta)
	}
	for _, tc := range []struct {
		op transport.Op
		p  []byte
	}{{transport.OpStatePut, []byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0}}, {transport.OpPrefill, chat("x")}, {transport.OpDecode, decodeJSON(1)}} {
		if st, m, _ := call(t, c, tc.op, "0", tc.p); st != transport.StatusBusy {
			t.Errorf("%v while busy: %v %v", tc.op, st, m)
		}
	}
	mustOK(t, c, transport.OpStateGet, "1", nil)
	if err := <-done; err != nil {
		t.Fatalf("slow PREFILL: %v", err)
	}
	m, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
	if m["is_processing"] != false || num(t, m, "n_past") == 0 {
		t.Fatalf("after PREFILL: %v", m)
	}
}

// TestPrefillAndDecodeJSON: the JSON forms, the reply shapes and identity.
func TestPrefillAndDecodeJSON(t *testing.T) {
	e := startEngine(t)
	c := client(t, e.tcp)
	m, payload := mustOK(t, c, transport.OpPrefill, "1", chat("Hello, Hydra"))
	nPast, stateSize, logitsSize := num(t, m, "n_past"), num(t, m, "state_size"), num(t, m, "logits_size")
	if nPast <= int64(len("Hello, Hydra")) || logitsSize != 257*4 || m["model_alias"] != "mock" || m["model_hash"] == "" || m["model_fallback"] != false {
		t.Fatalf("PREFILL meta %v", m)
	}
	if int64(len(payload)) != 10+4*nPast+stateSize+logitsSize+transport.TrailerSize {
		t.Fatalf("PREFILL payload %d bytes, want v2 header + %d state + %d logits + the integrity trailer", len(payload), stateSize, logitsSize)
	}
	if binary.LittleEndian.Uint32(payload[1:]) != uint32(nPast) {
		t.Fatal("blob n_past differs from meta")
	}
	m, frames := mustOK(t, c, transport.OpDecode, "1", decodeJSON(12))
	fr, err := transport.ParseDecodeFrames(frames)
	if err != nil || int64(len(fr)) != num(t, m, "tokens_generated") || num(t, m, "n_past") != nPast+int64(len(fr)) {
		t.Fatalf("DECODE %v, %d frames, %v", m, len(fr), err)
	}
	if text, _ := m["text"].(string); len(text) != len(fr) {
		t.Fatalf("text %q for %d tokens", text, len(fr))
	}
	// A model alias that is not resident falls back to the resident one.
	m, _ = mustOK(t, c, transport.OpPrefill, "2", []byte(`{"model":"other","messages":[{"role":"user","content":"x"}]}`))
	if m["model_fallback"] != true {
		t.Fatalf("fallback not reported: %v", m)
	}
	// DECODE with messages prefills first; on an empty slot without them it fails.
	m, _ = mustOK(t, c, transport.OpDecode, "3", []byte(`{"n_predict":4,"messages":[{"role":"user","content":"Hello, Hydra"}]}`))
	if num(t, m, "n_past") != nPast+num(t, m, "tokens_generated") {
		t.Fatalf("DECODE with messages: %v", m)
	}
	if st, _, _ := call(t, c, transport.OpDecode, "0", decodeJSON(4)); st != transport.StatusError {
		t.Fatalf("DECODE on an empty slot: %v", st)
	}
}
