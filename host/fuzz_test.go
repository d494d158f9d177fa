package host

import (
	"bytes"
	"testing"
)

// The payload parsers must never panic and must keep their invariants on any
// input; the seed corpora live in testdata/fuzz.

func FuzzParseConfigure(f *testing.F) {
	for _, s := range []string{`{"state_chunk_size":2097152}`, `{"state_chunk_size":-1}`, `{"temperature":0.5,"top_k":4}`, `{"test":"value"}`, ``, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		req, _, err := parseConfigure(p)
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
		r, err := parsePrefill(p, 3)
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
		d, err := parseDecode(p, 0, NewTunables().Sampler())
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
