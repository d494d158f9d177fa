package host

import (
	"errors"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

func testInfo() iface.BackendInfo {
	return iface.BackendInfo{Name: "mock", Model: iface.ModelIdentity{Alias: "m", Hash: "ab"}, StateLayout: `{"kv_type":"f16"}`}
}

func TestCheckLayout(t *testing.T) {
	here := `{"arch":"llama","kv_type":"q8_0","n_layer":48,"heads":{"kv":8,"q":32}}`
	for _, tc := range []struct {
		name, blob, want string // want "" accepted, else the error
	}{
		{"same", `{"layout":{"n_layer":48.0,"heads":{"q":32,"kv":8},"kv_type":"q8_0","arch":"llama"},"source":{"model_hash":"ab"}}`, ""},
		{"kv type", `{"layout":{"arch":"llama","kv_type":"f16","n_layer":48,"heads":{"kv":8,"q":32}}}`,
			"state layout differs: kv_type q8_0 here, f16 in the blob"},
		{"two keys and a missing one", `{"layout":{"arch":"qwen3","kv_type":"q8_0","heads":{"kv":4,"q":32},"v_trans":true}}`,
			`state layout differs: arch llama here, qwen3 in the blob; heads {"kv":8,"q":32} here, {"kv":4,"q":32} in the blob; n_layer 48 here, absent in the blob; v_trans absent here, true in the blob`},
		{"null layout", `{"layout":null}`, ""},
		{"not an object", `[1]`, "malformed KV blob"},
		{"layout not an object", `{"layout":"llama"}`, "malformed KV blob"},
	} {
		src, err := checkLayout([]byte(tc.blob), here)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		case tc.name == "same" && (src == nil || src.ModelHash != "ab"):
			t.Errorf("same: source %+v", src)
		}
		if strings.HasPrefix(tc.want, "state layout") && !errors.Is(err, ErrLayout) {
			t.Errorf("%s: not ErrLayout: %v", tc.name, err)
		}
	}
	if _, err := checkLayout([]byte(`{"layout":{"x":1}}`), ""); err != nil {
		t.Errorf("a backend naming no layout compares none: %v", err)
	}
}

func TestBlobOptions(t *testing.T) {
	s := &Server{}
	for _, tc := range []struct {
		p             string
		layout, trail bool
		wantErr       bool
	}{
		{"", false, true, false},
		{"not json", false, true, false},
		{`{"blob_layout":true}`, true, true, false},
		{`{"blob_trailer":false,"other":1}`, false, false, false},
		{`{"blob_layout":"yes"}`, false, false, true},
	} {
		o, err := parseBlobOptions([]byte(tc.p))
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: %v", tc.p, err)
			continue
		}
		if err != nil {
			continue
		}
		x, err := s.blobExtras(o, testInfo())
		if err != nil || (x.Layout != nil) != tc.layout || x.Trailer != tc.trail {
			t.Errorf("%q: extras %+v, %v", tc.p, x, err)
		}
	}
	info := testInfo()
	info.StateLayout = "{not json"
	if _, err := s.blobExtras(blobOptions{Layout: true}, info); err == nil {
		t.Error("a backend layout that is not JSON went into a blob")
	}
	if x, _ := s.blobExtras(blobOptions{Layout: true}, testInfo()); len(x.Layout) > transport.MaxBlobLayout {
		t.Error("layout too large")
	}
}
