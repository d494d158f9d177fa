package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// ruleSeries prefixes the /metrics series of ours' speculative rule.
const ruleSeries = "hydra_engine_spec_"

// ruleNow is ours' rule series now; nil where the run does not speculate
// or the server has none (llama-server, Ollama).
func ruleNow(ctx context.Context, o options, ep *endpoint) map[string]float64 {
	if !o.speculating() {
		return nil
	}
	m, err := metricSeries(ctx, ep, ruleSeries)
	if err != nil || len(m) == 0 {
		return nil
	}
	return m
}

// addRule adds the change of the rule's series from before to after (one
// round at concurrency c) to r.Rule[c].
func (r *systemRun) addRule(c int, before, after map[string]float64) {
	if before == nil || after == nil {
		return
	}
	if r.Rule == nil {
		r.Rule = map[int]map[string]float64{}
	}
	if r.Rule[c] == nil {
		r.Rule[c] = map[string]float64{}
	}
	for k, v := range after {
		r.Rule[c][k] += v - before[k]
	}
}

// ruleFacts is a line per concurrency on what ours' rule did over its
// rounds: the steps that drafted and probed, and where a step's time went
// with and without drafts, so that a rate lost or gained has its cause.
func (r *systemRun) ruleFacts() []string {
	var out []string
	for _, c := range slices.Sorted(maps.Keys(r.Rule)) {
		if f := ruleFact(c, r.Rule[c]); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// ruleFact is ruleFacts' line for concurrency c from the series' changes d.
func ruleFact(c int, d map[string]float64) string {
	plain, drafted := d[`steps_total{drafts="no"}`], d[`steps_total{drafts="yes"}`]
	if plain+drafted == 0 {
		return ""
	}
	sec := func(part string) float64 { return d[`step_seconds_total{part="`+part+`"}`] }
	msPer := func(v, n float64) string {
		if n == 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", 1000*v/n)
	}
	f := fmt.Sprintf("speculative rule at c=%d: %.0f of %.0f decode steps drafted (%.0f probes, %.0f stops); a plain step %s ms",
		c, drafted, plain+drafted, d["probes_total"], d["stops_total"], msPer(sec("plain"), plain))
	if drafted > 0 {
		f += fmt.Sprintf("; a drafted step %s ms drafting + %s catch-up + %s save + %s verify + %s replay",
			msPer(sec("draft"), drafted), msPer(sec("catch_up"), drafted), msPer(sec("save"), drafted),
			msPer(sec("verify"), drafted), msPer(sec("replay"), drafted))
	}
	return f
}
