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
