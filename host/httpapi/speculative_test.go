package httpapi

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/host"
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

// draftingBackend is the mock whose decodes report draft tokens, as the
// llama plugin's do with speculative decoding, and remember the bounds the
// request carried.
type draftingBackend struct {
	iface.Backend
	got *iface.SpeculativeParams
}

func (b *draftingBackend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	b.got, req.Speculative = req.Speculative, nil // the mock itself refuses them
	res, err := b.Backend.Decode(ctx, req, emit)
	res.DraftTokens, res.DraftAccepted = 6, 4
	return res, err
}

// A completion's timings carry the decode's draft counts as llama-server's
// draft_n and draft_n_accepted, /metrics sums them, and the request's
// speculative.* fields reach the backend.
func TestSpeculativeCompletion(t *testing.T) {
	m, info := loadMock(t, 1)
	b := &draftingBackend{Backend: m}
	s := host.NewServer(b, info, nil, host.Config{})
	t.Cleanup(s.Close)
	h := Handler(s, Options{})
	rec := post(h, "/v1/completions", `{"prompt":"hello","max_tokens":4,"speculative.n_max":2}`)
	var r struct {
		Timings map[string]float64 `json:"timings"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if r.Timings["draft_n"] != 6 || r.Timings["draft_n_accepted"] != 4 {
		t.Errorf("timings %v", r.Timings)
	}
	if b.got == nil || b.got.NMax != 2 || b.got.NMin != -1 || b.got.PMin != -1 {
		t.Errorf("the backend got %+v", b.got)
	}
	metrics := httptest.NewRecorder()
	h.ServeHTTP(metrics, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{"hydra_engine_draft_tokens_total 6", "hydra_engine_draft_tokens_accepted_total 4"} {
		if !strings.Contains(metrics.Body.String(), want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
}
