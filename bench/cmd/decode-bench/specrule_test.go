package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestRuleFacts: the rule's series read from /metrics text, summed over a
// concurrency's rounds as changes, make its line; a concurrency without
// decode steps has none.
func TestRuleFacts(t *testing.T) {
	text := func(plain, drafted, probes, plainS, draftS, verifyS float64) map[string]float64 {
		return seriesOf(strings.Join([]string{
			"# HELP hydra_engine_spec_steps_total x",
			`hydra_engine_spec_steps_total{drafts="no"} ` + ftoa(plain),
			`hydra_engine_spec_steps_total{drafts="yes"} ` + ftoa(drafted),
			"hydra_engine_spec_probes_total " + ftoa(probes),
			"hydra_engine_spec_stops_total 1",
			`hydra_engine_spec_step_seconds_total{part="plain"} ` + ftoa(plainS),
			`hydra_engine_spec_step_seconds_total{part="draft"} ` + ftoa(draftS),
			`hydra_engine_spec_step_seconds_total{part="verify"} ` + ftoa(verifyS),
			`hydra_engine_draft_tokens_total 99`,
		}, "\n"), ruleSeries)
	}
	var r systemRun
	r.addRule(4, text(10, 5, 1, 0.02, 0.005, 0.015), text(110, 15, 3, 0.22, 0.015, 0.040))
	r.addRule(4, text(200, 20, 3, 0.4, 0.02, 0.05), text(300, 20, 3, 0.6, 0.02, 0.05))
	r.addRule(8, text(300, 20, 3, 0.6, 0.02, 0.05), text(300, 20, 3, 0.6, 0.02, 0.05))
	r.addRule(16, nil, text(1, 1, 1, 1, 1, 1))
	got := r.ruleFacts()
	want := "speculative rule at c=4: 10 of 210 decode steps drafted (2 probes, 0 stops); a plain step 2.00 ms; " +
		"a drafted step 1.00 ms drafting + 0.00 catch-up + 0.00 save + 2.50 verify + 0.00 replay"
	if len(got) != 1 || got[0] != want {
		t.Errorf("facts %q\nwant %q", got, want)
	}
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
