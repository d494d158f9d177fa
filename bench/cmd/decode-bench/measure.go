package main

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// plan holds the prompts every server system gets, in the same order, so
// that both do the same work. Each round, join and prefix request has a
// prompt of its own: a server with a prompt cache (Ollama's llamarunner
// reuses a free slot's longest common prefix and cannot be told not to;
// ours reuses cached prefixes too) must still evaluate every prompt, except
// where the prefix measurement asks it not to.
type plan struct {
	warm   prompt
	rounds map[int][]prompt   // concurrency → a prompt per repetition
	flush  map[int][][]prompt // concurrency → per repetition, a short prompt per slot
	alone  []prompt           // the join baseline: prefill alone
	joinBG prompt             // what the running streams generate from
	joins  map[int][]prompt   // concurrency → a prompt per join
	prefA  []prompt           // ~2,000 tokens each
	prefB  []prompt           // prefA's text and a few words more
	// The state measurement's (stateget.go): its warm-up, and a prompt per
	// round in stateOrder's order.
	stateWarm prompt
	state     []prompt
	// The prompt cache measurement's rounds (promptcache.go), a warm-up first.
	cache []cachePrompts
}

// joinStats is a new request joining c-1 running streams.
type joinStats struct {
	C                int
	Joins            int
	AloneP50         float64 // ms: TTFT of the same kind of request with nothing running
	JoinP50, JoinP99 float64 // ms
	Errors           int
}

// prefixStats is request B sharing request A's prompt but for a few words.
type prefixStats struct {
	ATokens, BTokens int
	A, B             float64 // ms, TTFT medians
	BSlot            float64 // ms: B sent again to its slot (id_slot; ours only), NaN if not measured
	Errors           int
}

// systemRun is everything measured of one server system.
type systemRun struct {
	Name     string            `json:"name"`
	API      string            `json:"api"`
	Settings []string          `json:"settings"`
	Facts    []string          `json:"facts,omitempty"`
	Runner   string            `json:"runner,omitempty"`
	Sent     int               `json:"prompt_tokens_sent"` // the warm-up prompt's tokens
	Warm     sample            `json:"warm"`
	Rounds   map[int][]round   `json:"rounds"`
	Conc     map[int]concStats `json:"-"`
	Alone    []sample          `json:"alone"`
	Joins    map[int][]sample  `json:"joins"`
	JoinSt   map[int]joinStats `json:"-"`
	PrefA    []sample          `json:"prefix_a"`
	PrefB    []sample          `json:"prefix_b"`
	PrefSlot []sample          `json:"prefix_b_same_slot,omitempty"`
	Prefix   prefixStats       `json:"-"`
	// Rule is ours' speculative rule over each concurrency's rounds: the
	// change of its /metrics series (specrule.go).
	Rule map[int]map[string]float64 `json:"spec_rule,omitempty"`
}

// draftFact is the line on speculative decoding's drafts over r's rounds:
// the draft tokens the server verified and the share accepted, by
// concurrency; "" where no request drafted.
func (r *systemRun) draftFact() string {
	var parts []string
	var all, acc int
	for _, c := range slices.Sorted(maps.Keys(r.Rounds)) {
		n, a := 0, 0
		for _, rd := range r.Rounds[c] {
			for _, s := range rd.Samples {
				n, a = n+s.DraftN, a+s.DraftAccepted
			}
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("c=%d %d/%d (%.2f)", c, a, n, float64(a)/float64(n)))
		}
		all, acc = all+n, acc+a
	}
	if all == 0 {
		return ""
	}
	return fmt.Sprintf("draft tokens accepted/verified: %d/%d (%.2f); %s", acc, all, float64(acc)/float64(all), strings.Join(parts, ", "))
}

// measureServer runs the whole plan against one running server.
func measureServer(ctx context.Context, o options, ep *endpoint, pl plan, sameSlot bool, r *systemRun) error {
	// One request first: the model loads (Ollama loads it on first use),
	// caches warm; not counted.
	r.Warm = ep.do(ctx, time.Now(), call{p: pl.warm, n: o.n, slot: -1}, nil)
	if r.Warm.Err != "" {
		return fmt.Errorf("warm-up request: %s", r.Warm.Err)
	}
	r.Sent = len(pl.warm.Tokens)
	logf("  warm-up: %d tokens, TTFT %.0f ms (%s); prompt of %d tokens, %d as the server counted them",
		r.Warm.Tokens, msOf(r.Warm.ttft()), r.Warm.Counted, r.Sent, r.Warm.Prompt)
	r.Rounds, r.Conc = map[int][]round{}, map[int]concStats{}
	for _, c := range o.conc {
		for i, p := range pl.rounds[c] {
			before := ruleNow(ctx, o, ep)
			rd := runRound(ctx, ep, c, call{p: p, n: o.n, slot: -1})
			r.addRule(c, before, ruleNow(ctx, o, ep))
			rd.Ref = reference(ctx, ep, p, o.n, pl.flush[c][i])
			r.Rounds[c] = append(r.Rounds[c], rd)
		}
		st := summarise(c, o.n, r.Rounds[c])
		r.Conc[c] = st
		logf("  c=%-3d aggregate %7.1f tok/s, per stream %6.1f, TTFT p50 %6.0f ms p99 %6.0f ms, identical %s (agreeing %s), %d errors",
			c, st.Agg, st.Stream, st.TTFT50, st.TTFT99, pct(st.Identical), pct(st.Agree), st.Errors)
		if st.Errors > 0 {
			return fmt.Errorf("c=%d: %d of %d requests failed, first: %s", c, st.Errors, c*len(r.Rounds[c]), firstErr(r.Rounds[c]))
		}
	}
	measureJoins(ctx, o, ep, pl, r)
	measurePrefix(ctx, ep, pl, sameSlot, r)
	return nil
}

// runRound starts c identical requests at once and waits for all.
func runRound(ctx context.Context, ep *endpoint, c int, cl call) round {
	rd := round{C: c, Samples: make([]sample, c)}
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var t0 time.Time
	for i := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			rd.Samples[i] = ep.do(ctx, t0, cl, nil)
		}()
	}
	t0 = time.Now()
	close(gate)
	wg.Wait()
	return rd
}

// flushGen is what each flushing request generates: enough decode steps
// that the requests overlap and so take a slot each (one that ended before
// the next arrived would leave its slot to it, and the round's prompt in
// the others).
const flushGen = 16

// reference is p's request alone, for the comparison of tokens, after
// short requests with prompts of their own fill every slot at once: a
// server that reuses a slot's prompt (Ollama's llamarunner always, ours
// when a slot held it) would otherwise answer from the KV the round
// computed, and the reference would not be the request alone.
func reference(ctx context.Context, ep *endpoint, p prompt, n int, flush []prompt) *sample {
	var wg sync.WaitGroup
	for _, f := range flush {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep.do(ctx, time.Now(), call{p: f, n: flushGen, slot: -1}, nil)
		}()
	}
	wg.Wait()
	ref := ep.do(ctx, time.Now(), call{p: p, n: n, slot: -1}, nil)
	return &ref
}

// measureJoins: with nothing running, the TTFT of a one-token request (its
// prefill, in effect); then, at each concurrency the server holds at once,
// the TTFT of such requests joining c-1 streams that keep generating.
func measureJoins(ctx context.Context, o options, ep *endpoint, pl plan, r *systemRun) {
	r.Joins, r.JoinSt = map[int][]sample{}, map[int]joinStats{}
	for _, p := range pl.alone {
		r.Alone = append(r.Alone, ep.do(ctx, time.Now(), call{p: p, n: 1, slot: -1}, nil))
	}
	alone := ttftsOK(r.Alone)
	for _, c := range o.conc {
		if c < 2 || c > o.slots || len(pl.joins[c]) == 0 {
			continue // nothing to join, or the join would queue
		}
		ss := joinRunning(ctx, o, ep, c, pl.joinBG, pl.joins[c])
		r.Joins[c] = ss
		js := joinStats{C: c, Joins: len(ss), AloneP50: median(alone)}
		ok := ttftsOK(ss)
		js.Errors = len(ss) - len(ok)
		js.JoinP50, js.JoinP99 = median(ok), percentile(ok, 0.99)
		r.JoinSt[c] = js
		logf("  join at c=%d: TTFT p50 %.0f ms p99 %.0f ms (alone %.0f ms)", c, js.JoinP50, js.JoinP99, js.AloneP50)
	}
}

// joinRunning keeps c-1 streams generating (each restarts when it ends)
// and sends the joining requests one after another once all of them have
// their first token.
func joinRunning(ctx context.Context, o options, ep *endpoint, c int, bg prompt, joins []prompt) []sample {
	bgCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	first := make(chan struct{}, c)
	long := max(o.ctx-len(bg.Tokens)-16, 1) // as long as a sequence's context allows: restarts are rare
	for range c - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			for bgCtx.Err() == nil {
				ep.do(bgCtx, time.Now(), call{p: bg, n: long, slot: -1}, func() { once.Do(func() { first <- struct{}{} }) })
			}
		}()
	}
	for range c - 1 {
		select {
		case <-first:
		case <-ctx.Done():
		}
	}
	var out []sample
	for i, p := range joins {
		// Joins land at different points of the streams' decode steps.
		time.Sleep(time.Duration(50+(i*37)%100) * time.Millisecond)
		out = append(out, ep.do(ctx, time.Now(), call{p: p, n: 1, slot: -1}, nil))
	}
	stop()
	wg.Wait()
	return out
}

// measurePrefix sends A, then B (A's prompt and a few words), each alone;
// with sameSlot (ours) B once more, to A's slot (id_slot), where B is then
// cached but for its last token.
func measurePrefix(ctx context.Context, ep *endpoint, pl plan, sameSlot bool, r *systemRun) {
	st := prefixStats{BSlot: math.NaN()}
	if len(pl.prefA) == 0 {
		return
	}
	for i := range pl.prefA {
		a := ep.do(ctx, time.Now(), call{p: pl.prefA[i], n: 1, slot: -1}, nil)
		b := ep.do(ctx, time.Now(), call{p: pl.prefB[i], n: 1, slot: -1}, nil)
		r.PrefA, r.PrefB = append(r.PrefA, a), append(r.PrefB, b)
		if sameSlot && a.Slot >= 0 {
			r.PrefSlot = append(r.PrefSlot, ep.do(ctx, time.Now(), call{p: pl.prefB[i], n: 1, slot: a.Slot}, nil))
		}
	}
	st.ATokens, st.BTokens = len(pl.prefA[0].Tokens), len(pl.prefB[0].Tokens)
	as, bs := ttftsOK(r.PrefA), ttftsOK(r.PrefB)
	st.Errors = len(r.PrefA) + len(r.PrefB) - len(as) - len(bs)
	st.A, st.B = median(as), median(bs)
	if len(r.PrefSlot) > 0 {
		bss := ttftsOK(r.PrefSlot)
		st.Errors += len(r.PrefSlot) - len(bss)
		st.BSlot = median(bss)
	}
	r.Prefix = st
	logf("  shared prefix: A %.0f ms (%d tokens), B %.0f ms (+%d tokens): B/A %.2f", st.A, st.ATokens, st.B, st.BTokens-st.ATokens, st.B/st.A)
}

// ttftsOK are the TTFTs in ms of the samples without errors.
func ttftsOK(ss []sample) []float64 {
	var out []float64
	for _, s := range ss {
		if s.Err == "" {
			out = append(out, msOf(s.ttft()))
		}
	}
	return out
}

func firstErr(rs []round) string {
	for _, r := range rs {
		for _, s := range r.Samples {
			if s.Err != "" {
				return s.Err
			}
		}
	}
	return ""
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func pct(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}
