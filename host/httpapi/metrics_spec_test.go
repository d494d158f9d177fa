package httpapi

import (
	"context"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// TestSpecSeen: the speculative rule's decision shows on /metrics; a
// backend that does not speculate has none of its series.
func TestSpecSeen(t *testing.T) {
	m := mock.New(nil)
	info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 2})
	if err != nil {
		t.Fatal(err)
	}
	st := &iface.SpeculativeStats{Rule: "measured", PlainRate: 465, DraftRate: 300, Stops: 2, Probes: 9}
	_, h := serve(t, &infoBackend{Backend: m, edit: func(i *iface.BackendInfo) { i.Speculative = st }}, info, nil)
	text := scrape(t, h)
	for series, want := range map[string]float64{
		`hydra_engine_spec_drafting{rule="measured"}`:        0,
		"hydra_engine_spec_expected_plain_tokens_per_second": 465,
		"hydra_engine_spec_expected_draft_tokens_per_second": 300,
		"hydra_engine_spec_stops_total":                      2,
		"hydra_engine_spec_probes_total":                     9,
	} {
		if got := metricValue(t, text, series); got != want {
			t.Errorf("%s = %v, want %v\n%s", series, got, want, grep(text, "spec_"))
		}
	}
	_, h = serve(t, m, info, nil)
	if text := scrape(t, h); strings.Contains(text, "hydra_engine_spec_") {
		t.Errorf("a backend without speculative decoding has its series:\n%s", grep(text, "spec_"))
	}
}
