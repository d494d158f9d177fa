package httpapi

import (
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/prometheus/client_golang/prometheus"
)

// Speculative decoding's rule on /metrics, read from BackendInfo's
// Speculative at scrape time, so that an operator sees whether drafts are
// made and why; a backend that does not speculate has none of these series.
type specDescs struct {
	drafting, plainRate, draftRate, stops, probes, steps, seconds *prometheus.Desc
}

func newSpecDescs() specDescs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("hydra_engine_spec_"+name, help, labels, nil)
	}
	return specDescs{
		drafting:  d("drafting", "1 while the rule drafts (draft_rule=always: always; measured: the last decision, probes aside).", "rule"),
		plainRate: d("expected_plain_tokens_per_second", "The tokens a second the measured rule expected of its last decided step without drafts (0: not measured yet)."),
		draftRate: d("expected_draft_tokens_per_second", "The tokens a second it expected of the same step with its best drafts."),
		stops:     d("stops_total", "Decisions that stopped drafting: drafts cost more than they brought."),
		probes:    d("probes_total", "Steps drafted while stopped, to measure the costs and acceptance again."),
		steps:     d("steps_total", "Decode-only steps, by whether they drafted (probes among those that did).", "drafts"),
		seconds: d("step_seconds_total", "The time of decode-only steps by part: plain (steps without drafts), and of steps with drafts "+
			"draft (drafting, the catch-up apart), catch_up (the draft model evaluating tokens it had not seen), save (rollback states of "+
			"a target that cannot cut its memory), verify (the target's step) and replay (undoing rejected drafts).", "part"),
	}
}

func (d specDescs) descs() []*prometheus.Desc {
	return []*prometheus.Desc{d.drafting, d.plainRate, d.draftRate, d.stops, d.probes, d.steps, d.seconds}
}

// collectSpec writes the rule's series from the backend's figures p (nil:
// it does not speculate).
func (m *metrics) collectSpec(ch chan<- prometheus.Metric, p *iface.SpeculativeStats) {
	if p == nil {
		return
	}
	d := m.spec
	drafting := 0.0
	if p.Drafting || p.Rule == "always" {
		drafting = 1
	}
	ch <- prometheus.MustNewConstMetric(d.drafting, prometheus.GaugeValue, drafting, p.Rule)
	ch <- prometheus.MustNewConstMetric(d.plainRate, prometheus.GaugeValue, p.PlainRate)
	ch <- prometheus.MustNewConstMetric(d.draftRate, prometheus.GaugeValue, p.DraftRate)
	ch <- prometheus.MustNewConstMetric(d.stops, prometheus.CounterValue, float64(p.Stops))
	ch <- prometheus.MustNewConstMetric(d.probes, prometheus.CounterValue, float64(p.Probes))
	ch <- prometheus.MustNewConstMetric(d.steps, prometheus.CounterValue, float64(p.PlainSteps), "no")
	ch <- prometheus.MustNewConstMetric(d.steps, prometheus.CounterValue, float64(p.DraftSteps), "yes")
	for _, part := range []struct {
		name string
		v    float64
	}{{"plain", p.PlainSeconds}, {"draft", p.DraftSeconds}, {"catch_up", p.CatchUpSeconds}, {"save", p.SaveSeconds},
		{"verify", p.VerifySeconds}, {"replay", p.ReplaySeconds}} {
		ch <- prometheus.MustNewConstMetric(d.seconds, prometheus.CounterValue, part.v, part.name)
	}
}
