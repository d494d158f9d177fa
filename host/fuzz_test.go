package host

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// The payload parsers must never panic and must keep their invariants on any
// input; the seed corpora live in testdata/fuzz.

func FuzzParseConfigure(f *testing.F) {
	for _, s := range []string{`{"state_chunk_size":2097152}`, `{"state_chunk_size":-1}`, `{"temperature":0.5,"top_k":4}`, `{"test":"value"}`, ``, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		req, _, err := parseConfigure(p, 0)
		if err != nil {
			return
		}
		tun := NewTunables()
		res := req.apply(tun, nil)
		if n := uint64(tun.StateChunkSize()); n < MinStateChunkSize || n > MaxStateChunkSize {
			t.Fatalf("chunk size %d out of bounds", n)
		}
		if req.StateChunkSize != nil && res.ChunkApplied != uint64(tun.StateChunkSize()) {
			t.Fatalf("applied %d but tunable is %d", res.ChunkApplied, tun.StateChunkSize())
		}
	})
}

func FuzzParsePrefill(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0})
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := ParsePrefill(p, 3, iface.BackendInfo{})
		if err != nil {
			return
		}
		if (r.Messages == nil) == (r.Tokens == nil) || r.Slot != 3 {
			t.Fatalf("exactly one of messages and tokens must be set: %+v", r)
		}
		if r.Tokens != nil && len(r.Tokens)*4 != len(p) {
			t.Fatalf("%d tokens from %d bytes", len(r.Tokens), len(p))
		}
		for _, tok := range r.Tokens {
			if tok < 0 {
				t.Fatalf("negative token %d", tok)
			}
		}
	})
}

func FuzzParseDecode(f *testing.F) {
	f.Add([]byte(`{"n_predict":10,"messages":null}`))
	f.Add([]byte{10, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 5, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		d, err := parseDecode(p, 0, NewTunables().Sampler(), iface.BackendInfo{})
		if err != nil {
			return
		}
		if d.nPredict < 0 || d.sampler.Temperature < 0 {
			t.Fatalf("accepted %+v", d)
		}
	})
}

func FuzzParseSwapQuant(f *testing.F) {
	f.Add(append([]byte{0x0c, 0}, "Q6_K/expertsblk\\.5\\.ffn_.*_exps"...))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		k, pat, err := parseSwapQuant(p)
		if err != nil {
			return
		}
		if !bytes.Equal(append([]byte(k), pat...), p[2:]) {
			t.Fatalf("key %q + pattern %q != payload", k, pat)
		}
	})
}

// FuzzConfigureInfo: whatever CONFIGURE accepts, the next INFO answers OK
// with a meta that is valid JSON; a CONFIGURE never stops the engine.
func FuzzConfigureInfo(f *testing.F) {
	for _, s := range []string{`{"temperature":1e300}`, `{"temperature":3.4e38}`, `{"repeat_penalty":1.1,"repeat_last_n":2147483647}`,
		`{"top_p":1e-46,"min_p":1,"presence_penalty":-1e6,"frequency_penalty":1e6}`, `{"seed":18446744073709551615,"n_predict":-1}`,
		`{"repeat_last_n":4096,"temperature":1e6}`, `{"state_chunk_size":1e400}`} {
		f.Add([]byte(s))
	}
	info := iface.BackendInfo{Name: "fuzz", NSlots: 2, NCtx: 4096, NVocab: 512}
	f.Fuzz(func(t *testing.T, p []byte) {
		s := NewServer(&stateBackend{}, info, nil, Config{})
		st, _ := handle(t, s, s.handleConfigure, p)
		if st != transport.StatusOK && st != transport.StatusError {
			t.Fatalf("CONFIGURE status %v", st)
		}
		st, meta := handle(t, s, s.handleInfo, nil)
		var m map[string]any
		if st != transport.StatusOK || json.Unmarshal(meta, &m) != nil {
			t.Fatalf("INFO after CONFIGURE %q: %v %s", p, st, meta)
		}
		if n := s.tun.Sampler().RepeatLastN; n > int32(info.NCtx) {
			t.Fatalf("CONFIGURE %q left repeat_last_n %d past n_ctx %d", p, n, info.NCtx)
		}
	})
}
