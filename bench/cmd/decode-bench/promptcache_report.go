package main

import "fmt"

// writePromptCache is the page's section "A prefix that left its slot":
// the prompt cache measurement's medians, with the cache and without, and
// every round.
func (r *report) writePromptCache(p func(string, ...any)) {
	c := r.PromptCache
	if c == nil {
		return
	}
	p("## A prefix that left its slot: the prompt cache")
	p("")
	p("Ours only, `--slots 1`, `n_ctx=%d`, one engine with the host-memory prompt cache (`cache_ram=%d`, MiB) and one without (`cache_ram=0`), "+
		"each alone, one after the other. Each round, prompts as token ids, one request at a time: "+
		"**A**, a prefix of %d tokens and a question of about %d; **in its slot**, A and a second question, which finds A in its slot (the floor: only the question is evaluated); "+
		"**other**, %d tokens of another text, which takes the slot (with the cache, the sequence in it is saved first); "+
		"**back**, in its slot's prompt and a third question (with the cache, that sequence comes back from the cache and only the question is evaluated; without, all of it). "+
		"A, in its slot and other generate nothing (`max_tokens` 0: their time is the prompt's, and the sequence they leave is their prompt, which the next one extends, "+
		"so that a hybrid model's recurrent state, which cannot be cut, serves it as a plain cache does); back generates %d tokens and its time is its TTFT. "+
		"Times are from the request sent to its first token (or its reply), through HTTP; medians over %d rounds, each of its own prefix, after an untimed warm-up round. "+
		"Restore and save GB/s: the state bytes over the time of every restore and save (warm-up included; a save's time includes finding its memory), from `/metrics`.",
		c.NCtx, c.RAM, c.Prefix, cacheSuffix, c.Other, cacheN, c.Reps)
	p("")
	if len(c.Engines) < 2 {
		p("Not measured: it failed (see Failures).")
		p("")
		return
	}
	on, off := c.Engines[0].Sum, c.Engines[1].Sum
	p("| p50 ms | cache on | cache off | on ÷ off |")
	p("|---|---|---|---|")
	for _, row := range []struct {
		name   string
		on, of fnum
	}{{"A: the prefix, first time", on.A, off.A}, {"in its slot: a question on A, in its slot", on.InSlot, off.InSlot},
		{"other: takes the slot", on.Other, off.Other}, {"**back (TTFT): a question on it after it left its slot**", on.Back, off.Back}} {
		p("| %s | %s | %s | %s |", row.name, fcell(row.on, 1), fcell(row.of, 1), fratio(row.on, row.of))
	}
	p("")
	p("With the cache: %.0f hits, %.0f restores of %s bytes each at %s GB/s, %.0f saves at %s GB/s (`/metrics`: %s).",
		on.Hits, on.Restores, fcell(on.RestoreBytes, 0), fcell(on.RestoreGBps, gbPrec), on.Saves, fcell(on.SaveGBps, gbPrec), metricsLine(c.Engines[0].Metrics))
	p("")
	p("| engine | round | A ms | in its slot ms | other ms | back ms |")
	p("|---|---|---|---|---|---|")
	for _, e := range c.Engines {
		for i, rd := range e.Rounds {
			p("| %s | %d | %.1f | %.1f | %.1f | %.1f |", onOff(e.Cache), i+1, msOf(rd.A.ttft()), msOf(rd.InSlot.ttft()), msOf(rd.Other.ttft()), msOf(rd.Back.ttft()))
		}
	}
	p("")
	for _, e := range c.Engines {
		for _, s := range e.Settings {
			p("- cache %s: `%s`", onOff(e.Cache), s)
		}
	}
	p("")
}

// metricsLine is the cache's series, name=value, in name order.
func metricsLine(m map[string]float64) string {
	s := ""
	for i, k := range sortedKeys(m) {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s=%g", k, m[k])
	}
	return s
}
