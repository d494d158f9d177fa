package request

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's dotted per-request fields become the decode's speculative
// bounds, the fields not given the backend's; none given, none are sent.
func TestSpeculativeFields(t *testing.T) {
	for _, tc := range []struct {
		body string
		want *iface.SpeculativeParams
		bad  bool
	}{
		{`{}`, nil, false},
		{`{"speculative.n_max": 0}`, &iface.SpeculativeParams{NMax: 0, NMin: -1, PMin: -1}, false},
		{`{"speculative.n_max": 8, "speculative.n_min": 2, "speculative.p_min": 0.5}`, &iface.SpeculativeParams{NMax: 8, NMin: 2, PMin: 0.5}, false},
		{`{"speculative.n_max": -1}`, nil, true},
		{`{"speculative.p_min": 1.5}`, nil, true},
	} {
		var f speculativeFields
		if err := json.Unmarshal([]byte(tc.body), &f); err != nil {
			t.Fatal(err)
		}
		got, err := f.parse()
		switch {
		case tc.bad && err == nil:
			t.Errorf("%s: accepted as %+v", tc.body, got)
		case !tc.bad && err != nil:
			t.Errorf("%s: %v", tc.body, err)
		case !tc.bad && (got == nil) != (tc.want == nil), got != nil && *got != *tc.want:
			t.Errorf("%s: %+v, want %+v", tc.body, got, tc.want)
		}
	}
}

// A field of a struct the request embeds is named by its JSON key alone,
// as every other field is.
func TestSpeculativeFieldTypeError(t *testing.T) {
	for _, chat := range []bool{true, false} {
		body := `{"prompt":"hi","speculative.n_max":"x"}`
		if chat {
			body = `{"messages":[{"role":"user","content":"hi"}],"speculative.n_max":"x"}`
		}
		_, err := Parse([]byte(body), chat, iface.SamplerParams{}, 16, iface.BackendInfo{})
		var e *run.Error
		if !errors.As(err, &e) || e.Msg != "field speculative.n_max: expected an integer, got a string" || e.Param != "speculative.n_max" {
			t.Errorf("chat %v: %#v", chat, err)
		}
	}
}
