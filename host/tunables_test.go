package host

import (
	"math"
	"testing"
)

func TestClampStateChunkSize(t *testing.T) {
	// The C++ engine's tests/test-hydra-state-chunk-size.cpp table.
	cases := []struct{ in, want uint64 }{
		{0, 64 << 10},
		{1024, 64 << 10},
		{64 << 10, 64 << 10},
		{2 << 20, 2 << 20},
		{64 << 20, 64 << 20},
		{64<<20 + 1, 64 << 20},
		{math.MaxUint64, 64 << 20},
	}
	for _, c := range cases {
		if got := ClampStateChunkSize(c.in); got != c.want {
			t.Errorf("ClampStateChunkSize(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestConfigureChunkSize(t *testing.T) {
	cases := []struct {
		json string
		want uint64
	}{
		{`{"state_chunk_size":2097152}`, 2 << 20},
		{`{"state_chunk_size":0}`, 64 << 10},
		{`{"state_chunk_size":-1}`, 64 << 20},       // wraps like size_t, then clamps
		{`{"state_chunk_size":1048576.9}`, 1 << 20}, // fraction truncated
		{`{"state_chunk_size":1e6}`, 1000000},       // float form
		{`{"state_chunk_size":99999999999999999999999}`, 64 << 20},
		{`{"state_chunk_size":-2.5}`, 64 << 20},
	}
	for _, c := range cases {
		tun := NewTunables()
		req, _, err := parseConfigure([]byte(c.json), 0)
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		res := req.apply(tun, nil)
		if res.ChunkApplied != c.want || uint64(tun.StateChunkSize()) != c.want {
			t.Errorf("%s: applied %d (tunable %d), want %d", c.json, res.ChunkApplied, tun.StateChunkSize(), c.want)
		}
	}
}

func TestConfigureRejectsAndChangesNothing(t *testing.T) {
	bad := []string{
		`{"state_chunk_size":"big"}`,
		`{"state_chunk_size":true}`,
		`{"temperature":-1}`,
		`{"temperature":"hot"}`,
		`{"top_p":0}`,
		`{"top_k":-3}`,
		`{"n_predict":-2}`,
		`[1,2]`,
		`{"state_chunk_size":65536`,
		`{"state_chunk_size":65536} {}`,
		`not json`,
	}
	for _, b := range bad {
		if _, _, err := parseConfigure([]byte(b), 0); err == nil {
			t.Errorf("%s: accepted", b)
		}
	}
}

func TestConfigureSamplerAndUnknownKeys(t *testing.T) {
	tun := NewTunables()
	req, ignored, err := parseConfigure([]byte(`{"temperature":0.7,"top_k":40,"top_p":0.9,"seed":42,"n_predict":16,"test":"value","zzz":1}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	res := req.apply(tun, ignored)
	sp := tun.Sampler()
	if sp.Temperature != 0.7 || sp.TopK != 40 || sp.TopP != 0.9 || sp.Seed != 42 || tun.NPredict() != 16 {
		t.Fatalf("sampler not applied: %+v n_predict %d", sp, tun.NPredict())
	}
	if len(res.Ignored) != 2 || res.Ignored[0] != "test" || res.Ignored[1] != "zzz" {
		t.Fatalf("ignored = %v", res.Ignored)
	}
	if res.ChunkRequested != "" || tun.StateChunkSize() != DefaultStateChunkSize {
		t.Fatalf("chunk size changed without being asked")
	}
	// An empty payload is a no-op success.
	if _, _, err := parseConfigure(nil, 0); err != nil {
		t.Fatal(err)
	}
}
