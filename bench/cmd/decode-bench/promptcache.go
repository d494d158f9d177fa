package main

// The prompt cache measurement (-prompt-cache-tokens N): the time to first
// token of a request whose N-token prefix left its slot for another
// prompt, on an engine with the host-memory prompt cache (cache_ram) and on
// one without, in the same run. Ours only: the cache is the llama plugin's.

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// cacheN is what the request whose prefix comes back generates: its time
// to first token is what is measured, the rest only ends it. The others
// generate nothing (max_tokens 0, a prefill): the sequence they leave is
// their prompt exactly, which the next prompt extends, so that a hybrid or
// recurrent model's state, which cannot be cut, serves it too.
const cacheN = 4

// cacheSuffix is the length of the questions after the shared prefix.
const cacheSuffix = 32

// cachePrompts is one round's prompts, in the order sent: the prefix and a
// question (A); A and a second question (inSlot), which finds A in its
// slot; another text (other), which takes the slot; inSlot and a third
// question (back), which finds inSlot's sequence in the cache or nowhere.
type cachePrompts struct {
	A, InSlot, Other, Back prompt
	Prefix                 int // the prefix's tokens
}

// promptCacheRun is everything the measurement did and measured.
type promptCacheRun struct {
	Tokens  int           `json:"prefix_tokens"` // -prompt-cache-tokens, as asked
	Prefix  int           `json:"prefix_tokens_sent"`
	Other   int           `json:"other_tokens"`
	RAM     int           `json:"cache_ram_mib"`
	Reps    int           `json:"reps"`
	NCtx    int           `json:"n_ctx"`
	Engines []cacheEngine `json:"engines"` // with the cache, then without
}

// cacheEngine is one engine's rounds, with the cache or without.
type cacheEngine struct {
	Cache    bool               `json:"cache"`
	Settings []string           `json:"settings"`
	Warm     cacheRound         `json:"warm"`
	Rounds   []cacheRound       `json:"rounds"`
	Metrics  map[string]float64 `json:"prompt_cache_metrics"` // /metrics' hydra_engine_prompt_cache_* after the rounds
	Sum      cacheSummary       `json:"summary"`
}

// cacheRound is one round's requests.
type cacheRound struct {
	A      sample `json:"a"`
	InSlot sample `json:"in_slot"`
	Other  sample `json:"other"`
	Back   sample `json:"back"`
}

// cacheSummary is the rounds' TTFT medians (ms) and, from /metrics, the
// cache's saves and restores over the whole engine (warm-up included).
type cacheSummary struct {
	A, Other, Back, InSlot fnum
	Errors                 int
	Hits, Restores, Saves  float64
	RestoreBytes           fnum // per restore
	RestoreGBps, SaveGBps  fnum // bytes ÷ seconds of all restores, saves
}

// cachePlan makes the measurement's prompts: a warm-up round and reps
// rounds, each of its own seeds, so that no round finds another's prefix.
func cachePlan(ctx context.Context, tk tokenizer, o options) ([]cachePrompts, error) {
	n := o.cacheReps + 1
	seeds := func(base, k int) []int {
		s := make([]int, k)
		for i := range s {
			s[i] = base + i
		}
		return s
	}
	prefixes, err := tk.prompts(ctx, seeds(400000, n), o.cacheTokens)
	if err != nil {
		return nil, err
	}
	others, err := tk.prompts(ctx, seeds(500000, n), o.cacheOther)
	if err != nil {
		return nil, err
	}
	questions, err := tk.prompts(ctx, seeds(600000, 3*n), cacheSuffix)
	if err != nil {
		return nil, err
	}
	join := func(p, q prompt) prompt { // q without its BOS
		return prompt{Text: p.Text + " " + q.Text, Tokens: append(append([]int32(nil), p.Tokens...), q.Tokens[1:]...)}
	}
	out := make([]cachePrompts, n)
	for i := range out {
		a := join(prefixes[i], questions[3*i])
		in := join(a, questions[3*i+1])
		out[i] = cachePrompts{A: a, InSlot: in, Other: others[i], Back: join(in, questions[3*i+2]), Prefix: len(prefixes[i].Tokens)}
	}
	return out, nil
}

// measurePromptCache runs the rounds on an engine with the cache and on
// one without, one after the other, each alone on the machine.
func measurePromptCache(ctx context.Context, o options, pl plan, rep *report) *promptCacheRun {
	r := &promptCacheRun{Tokens: o.cacheTokens, RAM: o.cacheRAM, Reps: o.cacheReps}
	if len(pl.cache) == 0 {
		rep.fail("prompt-cache", fmt.Errorf("no prompts"), "")
		return r
	}
	longest := 0
	for _, c := range pl.cache {
		longest = max(longest, len(c.A.Tokens), len(c.Back.Tokens), len(c.InSlot.Tokens), len(c.Other.Tokens))
	}
	r.Prefix, r.Other = pl.cache[0].Prefix, len(pl.cache[0].Other.Tokens)
	// Room for the other prompt beside the prefix: a save in the background
	// holds the leaving sequence's cells until its bytes are written, and a
	// context of the prefix alone would make the other prompt wait for them.
	r.NCtx = (longest + r.Other + cacheN + 256 + 255) / 256 * 256
	for _, on := range []bool{true, false} {
		name, ram := "off", "0"
		if on {
			name, ram = "on", strconv.Itoa(o.cacheRAM)
		}
		logf("prompt cache %s: a %d-token prefix leaves its one slot and comes back", name, r.Prefix)
		eng, err := runCacheEngine(ctx, o, pl, r.NCtx, on, ram)
		r.Engines = append(r.Engines, eng)
		if err != nil {
			rep.fail("prompt-cache "+name, err, "")
			continue
		}
		s := eng.Sum
		logf("  p50: A %.0f ms, in its slot %.0f, other %.0f, back (TTFT) %.0f; restores %.0f at %.2f GB/s, saves at %.2f GB/s",
			s.A, s.InSlot, s.Other, s.Back, s.Restores, s.RestoreGBps, s.SaveGBps)
	}
	return r
}

// runCacheEngine starts one engine of one slot, runs the warm-up round and
// the rounds, reads the cache's figures and stops it.
func runCacheEngine(ctx context.Context, o options, pl plan, nCtx int, on bool, ram string) (cacheEngine, error) {
	eng := cacheEngine{Cache: on}
	log := "ours-cache-off.log"
	if on {
		log = "ours-cache-on.log"
	}
	srv, err := startOurs(ctx, o, oursRaw, engineLayout{slots: 1, nCtx: nCtx, log: log, opts: []string{"cache_ram=" + ram}})
	if err != nil {
		return eng, err
	}
	eng.Settings = srv.settings()
	err = func() error {
		ep := srv.endpoint()
		if eng.Warm = cacheRoundOf(ctx, ep, pl.cache[0]); eng.Warm.failed() != "" {
			return fmt.Errorf("warm-up round: %s", eng.Warm.failed())
		}
		for i, cp := range pl.cache[1:] {
			rd := cacheRoundOf(ctx, ep, cp)
			eng.Rounds = append(eng.Rounds, rd)
			if e := rd.failed(); e != "" {
				return fmt.Errorf("round %d: %s", i+1, e)
			}
			logf("  round %d: A %.0f ms, in its slot %.0f, other %.0f, back (TTFT) %.0f",
				i+1, msOf(rd.A.ttft()), msOf(rd.InSlot.ttft()), msOf(rd.Other.ttft()), msOf(rd.Back.ttft()))
		}
		m, err := cacheMetrics(ctx, ep)
		eng.Metrics = m
		return err
	}()
	logs := srv.logTail()
	if serr := srv.stop(); serr != nil && err == nil && ctx.Err() == nil {
		err = fmt.Errorf("stopping: %w", serr)
	}
	eng.Sum = summariseCache(eng)
	if err == nil && on && eng.Sum.Restores < float64(len(eng.Rounds)+1) {
		err = fmt.Errorf("%.0f restores from the cache in %d rounds: the prefix did not come back from it (cache_ram %s MiB too small for its state?)",
			eng.Sum.Restores, len(eng.Rounds)+1, ram)
	}
	if err != nil {
		return eng, fmt.Errorf("%w\n--- log tail ---\n%s", err, logs)
	}
	return eng, nil
}

// cacheRoundOf sends a round's requests one after the other.
func cacheRoundOf(ctx context.Context, ep *endpoint, cp cachePrompts) cacheRound {
	do := func(p prompt, n int) sample { return ep.do(ctx, time.Now(), call{p: p, n: n, slot: -1}, nil) }
	var r cacheRound
	r.A = do(cp.A, 0)
	r.InSlot = do(cp.InSlot, 0)
	r.Other = do(cp.Other, 0)
	r.Back = do(cp.Back, cacheN)
	return r
}

func (r cacheRound) failed() string {
	for _, s := range []sample{r.A, r.InSlot, r.Other, r.Back} {
		if s.Err != "" {
			return s.Err
		}
	}
	return ""
}

// cacheMetrics reads the hydra_engine_prompt_cache_* series of /metrics.
func cacheMetrics(ctx context.Context, ep *endpoint) (map[string]float64, error) {
	return metricSeries(ctx, ep, "hydra_engine_prompt_cache_")
}

// metricSeries reads the series of /metrics whose names start with prefix,
// by series less the prefix.
func metricSeries(ctx context.Context, ep *endpoint, prefix string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := ep.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s %v", resp.Status, err)
	}
	return seriesOf(string(b), prefix), nil
}

// seriesOf is the lines of a /metrics text whose series start with
// prefix, by series less the prefix.
func seriesOf(text, prefix string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); i > 0 && err == nil {
			out[strings.TrimPrefix(line[:i], prefix)] = v
		}
	}
	return out
}

// summariseCache is an engine's medians and the cache's speeds.
func summariseCache(e cacheEngine) cacheSummary {
	var a, other, back, in []float64
	s := cacheSummary{}
	for _, r := range e.Rounds {
		if r.failed() != "" {
			s.Errors++
			continue
		}
		a, other = append(a, msOf(r.A.ttft())), append(other, msOf(r.Other.ttft()))
		back, in = append(back, msOf(r.Back.ttft())), append(in, msOf(r.InSlot.ttft()))
	}
	s.A, s.Other, s.Back, s.InSlot = fnum(median(a)), fnum(median(other)), fnum(median(back)), fnum(median(in))
	m := e.Metrics
	s.Hits, s.Restores, s.Saves = m["hits_total"], m["restores_total"], m["saves_total"]
	rate := func(bytes, secs float64) fnum {
		if secs <= 0 {
			return fnum(math.NaN())
		}
		return fnum(bytes / secs / 1e9)
	}
	s.RestoreGBps, s.SaveGBps = rate(m["restored_bytes_total"], m["restore_seconds_total"]), rate(m["saved_bytes_total"], m["save_seconds_total"])
	s.RestoreBytes = fnum(math.NaN())
	if s.Restores > 0 {
		s.RestoreBytes = fnum(m["restored_bytes_total"] / s.Restores)
	}
	return s
}
