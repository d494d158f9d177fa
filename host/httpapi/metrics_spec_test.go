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
	st := &iface.SpeculativeStats{Rule: "measured", PlainRate: 465, DraftRate: 300, Stops: 2, Probes: 9,
		PlainSteps: 1000, DraftSteps: 40, PlainSeconds: 2.5, DraftSeconds: 0.5, CatchUpSeconds: 0.25, SaveSeconds: 0.125,
		VerifySeconds: 0.75, ReplaySeconds: 0.0625}
	_, h := serve(t, &infoBackend{Backend: m, edit: func(i *iface.BackendInfo) { i.Speculative = st }}, info, nil)
	text := scrape(t, h)
	for series, want := range map[string]float64{
		`hydra_engine_spec_drafting{rule="measured"}`:           0,
		"hydra_engine_spec_expected_plain_tokens_per_second":    465,
		"hydra_engine_spec_expected_draft_tokens_per_second":    300,
		"hydra_engine_spec_stops_total":                         2,
		"hydra_engine_spec_probes_total":                        9,
		`hydra_engine_spec_steps_total{drafts="no"}`:            1000,
		`hydra_engine_spec_steps_total{drafts="yes"}`:           40,
		`hydra_engine_spec_step_seconds_total{part="plain"}`:    2.5,
		`hydra_engine_spec_step_seconds_total{part="draft"}`:    0.5,
		`hydra_engine_spec_step_seconds_total{part="catch_up"}`: 0.25,
		`hydra_engine_spec_step_seconds_total{part="save"}`:     0.125,
		`hydra_engine_spec_step_seconds_total{part="verify"}`:   0.75,
		`hydra_engine_spec_step_seconds_total{part="replay"}`:   0.0625,
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
