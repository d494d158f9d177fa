package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// report is everything one run measured, and writes the page.
type report struct {
	Opts        options
	Mach        machine
	Date        time.Time
	Elapsed     time.Duration
	Plan        plan
	Binaries    []binary
	Ours        *systemRun
	LlamaServer *systemRun // llama.cpp's server built from the plugin's tree
	Ollama      *systemRun
	Ceilings    []*ceilingRun
	StateGet    *stateGetRun      // decode beside a state transfer; nil when not measured
	PromptCache *promptCacheRun   // a prefix that left its slot; nil when not measured
	Checkpoints *ckptRun          // prompts that part from a slot's sequence; nil when not measured
	Agent       *agentRun         // an agent's conversation turn by turn; nil when not measured
	Errors      map[string]string // system or measurement → what failed, with its log's tail
}

func (r *report) fail(system string, err error, logs string) {
	msg := err.Error()
	if logs != "" {
		msg += "\n--- log tail ---\n" + logs
	}
	logf("%s FAILED: %s", system, msg)
	if prev, ok := r.Errors[system]; ok {
		msg = prev + "\n" + msg
	}
	r.Errors[system] = msg
}

// cacheOnly reports whether the run measured the prompt cache alone
// (-systems ""): its page has that section only, and no chart.
func (r *report) cacheOnly() bool {
	return len(r.Opts.systems) == 0 && (r.PromptCache != nil || r.Checkpoints != nil || r.Agent != nil)
}

// write writes NAME.md, NAME.svg and, with -raw, the measurements.
func (r *report) write() error {
	if err := os.MkdirAll(r.Opts.out, 0o755); err != nil {
		return err
	}
	var md bytes.Buffer
	r.markdown(&md)
	base := filepath.Join(r.Opts.out, r.Opts.name)
	if err := os.WriteFile(base+".md", md.Bytes(), 0o644); err != nil {
		return err
	}
	if !r.cacheOnly() {
		var svg bytes.Buffer
		if err := r.chart(&svg); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		if err := os.WriteFile(base+".svg", svg.Bytes(), 0o644); err != nil {
			return err
		}
	}
	logf("wrote %s.md (and, with systems measured, %s.svg)", base, base)
	if r.Opts.raw != "" {
		raw := map[string]any{"ours": r.Ours, "llama_server": r.LlamaServer, "ollama": r.Ollama, "ceilings": r.Ceilings, "state_get": r.StateGet,
			"prompt_cache": r.PromptCache, "checkpoints": r.Checkpoints, "agent": r.Agent, "errors": r.Errors}
		if err := writeRaw(r.Opts.raw, raw); err != nil {
			return err
		}
		logf("wrote %s", r.Opts.raw)
	}
	return nil
}

// stat is one system's summary at c, if measured.
func (s *systemRun) stat(c int) (concStats, bool) {
	if s == nil || s.Conc == nil {
		return concStats{}, false
	}
	st, ok := s.Conc[c]
	return st, ok
}

func (r *report) ceiling(i, c int) (ceilingResult, bool) {
	if i >= len(r.Ceilings) {
		return ceilingResult{}, false
	}
	return r.Ceilings[i].byNP(c)
}

// markdown writes the page: what was measured, the tables, the machine.
func (r *report) markdown(w io.Writer) {
	o := r.Opts
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	if r.cacheOnly() {
		title, flags := "A prefix that left its slot: the prompt cache", fmt.Sprintf("-prompt-cache-tokens %d", o.cacheTokens)
		if r.PromptCache == nil {
			title, flags = "Prompts that part from the slot's sequence: context checkpoints", ""
			if len(o.ckptTokens) > 0 {
				flags = "-checkpoint-tokens " + joinInts(o.ckptTokens)
			}
			if len(o.agentTokens) > 0 {
				flags = strings.TrimSpace(flags + fmt.Sprintf(" -agent-tokens %s -agent-turns %d", joinInts(o.agentTokens), o.agentTurns))
			}
		}
		p("# %s (%s)", title, r.Mach.tag())
		p("")
		p("Written by `bench/cmd/decode-bench -systems \"\" %s` on %s (%s in all); re-run it rather than edit this page.",
			flags, r.Date.UTC().Format("2006-01-02 15:04 MST"), r.Elapsed.Round(time.Second))
		p("")
		r.writeErrors(p)
		r.writePromptCache(p)
		r.writeCheckpoints(p)
		r.writeAgent(p)
		r.writeMachine(p)
		return
	}
	p("# Decode throughput at 1–%d concurrent streams: ours, Ollama, llama.cpp's batched decode (%s)", o.conc[len(o.conc)-1], r.Mach.tag())
	p("")
	p("Written by `bench/cmd/decode-bench` on %s (%s in all); re-run it rather than edit this page. "+
		"[Chart](%s.svg): aggregate tokens/s against concurrency.", r.Date.UTC().Format("2006-01-02 15:04 MST"), r.Elapsed.Round(time.Second), o.name)
	p("")
	r.writeSetup(p)
	r.writeErrors(p)
	r.writeThroughput(p)
	r.writeLlamaServer(p)
	r.writeLatency(p)
	r.writeJoins(p)
	r.writePrefix(p)
	r.writeStateGet(p)
	r.writePromptCache(p)
	r.writeCheckpoints(p)
	r.writeAgent(p)
	r.writeMethod(p)
	r.writeMachine(p)
}

func (r *report) writeSetup(p func(string, ...any)) {
	o := r.Opts
	size := ""
	if st, err := os.Stat(o.model); err == nil {
		size = fmt.Sprintf(", %.2f GB", float64(st.Size())/1e9)
	}
	desc := ""
	if len(r.Ceilings) > 0 {
		s := r.Ceilings[0].Setup
		desc = fmt.Sprintf(", %s, %.1f M parameters", s.ModelDesc, float64(s.NParams)/1e6)
	}
	p("- **Model**: `%s`%s%s, the same file for all three.", filepath.Base(o.model), size, desc)
	p("- **Requests**: at concurrency c, c streaming requests start at once with the same prompt of %s tokens "+
		"(a fresh prompt each round), each generating %d tokens, temperature 0 (greedy), seed %d. "+
		"Ours and Ollama hold %d sequences at once (`--slots %d`, `OLLAMA_NUM_PARALLEL=%d`), %d tokens of context each; "+
		"%d round(s) per concurrency.", r.promptTokens(), o.n, seed, o.slots, o.slots, o.slots, o.ctx, o.reps)
	p("- **APIs**: ours %s; Ollama %s.", apiName(r.Ours), apiName(r.Ollama))
	if counts := promptCounts(r.Ours, r.Ollama); counts != "" {
		p("- **Prompt tokens as each server counted them** (the warm-up request): %s.", counts)
	}
	if r.Ollama != nil && r.Ollama.Runner != "" {
		p("- **Ollama's runner**: %s.", r.Ollama.Runner)
	}
	p("")
}

// promptCounts compares the tokens sent with the servers' own counts: the
// same count says both evaluated the same tokens.
func promptCounts(ss ...*systemRun) string {
	var parts []string
	for _, s := range ss {
		if s != nil && s.Warm.Err == "" && s.Sent > 0 {
			parts = append(parts, fmt.Sprintf("%s %d of %d sent", s.Name, s.Warm.Prompt, s.Sent))
		}
	}
	return strings.Join(parts, ", ")
}

func apiName(s *systemRun) string {
	if s == nil {
		return "not measured"
	}
	return "`" + s.API + "`"
}

// promptTokens is the rounds' prompt length, min–max.
func (r *report) promptTokens() string {
	lo, hi := math.MaxInt, 0
	for _, ps := range r.Plan.rounds {
		for _, q := range ps {
			lo, hi = min(lo, len(q.Tokens)), max(hi, len(q.Tokens))
		}
	}
	if hi == 0 {
		return "?"
	}
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

func (r *report) writeErrors(p func(string, ...any)) {
	if len(r.Errors) == 0 {
		return
	}
	p("## Failures")
	p("")
	for _, k := range sortedKeys(r.Errors) {
		p("**%s** failed:", k)
		p("")
		p("```")
		p("%s", strings.TrimSpace(r.Errors[k]))
		p("```")
		p("")
	}
}

func (r *report) writeThroughput(p func(string, ...any)) {
	p("## Throughput")
	p("")
	p("Aggregate: all tokens of a round over its wall time, from the requests' start to the last token (prefill included); "+
		"for the ceiling, N × %d tokens over its prefill and decode. Per stream: a request's tokens after its first over the time after its first token "+
		"(median); for the ceiling, one sequence's decode rate.", r.Opts.n)
	p("")
	hdr := "| c | ours tok/s | Ollama tok/s | ceiling tok/s | ours ÷ Ollama | ours ÷ ceiling | ours per stream | Ollama per stream | ceiling per stream |"
	sep := "|---|---|---|---|---|---|---|---|---|"
	if len(r.Ceilings) > 1 {
		hdr += " " + r.Ceilings[1].Label + " tok/s |"
		sep += "---|"
	}
	p("%s", hdr)
	p("%s", sep)
	for _, c := range r.Opts.conc {
		ou, okO := r.Ours.stat(c)
		ol, okL := r.Ollama.stat(c)
		ce, okC := r.ceiling(0, c)
		row := fmt.Sprintf("| %d | %s | %s | %s | %s | %s | %s | %s | %s |", c,
			num(ou.Agg, okO, 1), num(ol.Agg, okL, 1), num(ce.E2ETPS, okC, 1),
			ratio(ou.Agg, ol.Agg, okO && okL), ratio(ou.Agg, ce.E2ETPS, okO && okC),
			num(ou.Stream, okO, 1), num(ol.Stream, okL, 1), num(ce.Stream, okC, 1))
		if len(r.Ceilings) > 1 {
			cs, okS := r.ceiling(1, c)
			row += " " + num(cs.E2ETPS, okS, 1) + " |"
		}
		p("%s", row)
	}
	p("")
	if len(r.Ceilings) > 0 {
		p("The ceiling's decode alone (no prefill), tokens/s of all N sequences: %s.", r.ceilingDecode())
		p("")
	}
}

func (r *report) ceilingDecode() string {
	var parts []string
	for _, run := range r.Ceilings {
		var xs []string
		for _, res := range run.Results {
			xs = append(xs, fmt.Sprintf("N=%d %.1f", res.NP, res.TGTPS))
		}
		parts = append(parts, run.Label+": "+strings.Join(xs, ", "))
	}
	return strings.Join(parts, "; ")
}

func (r *report) writeLatency(p func(string, ...any)) {
	p("## Time to first token and correctness")
	p("")
	p("TTFT: from a request's start to its first token (queueing included: both queue a request while every slot is busy; ours answers 503 only when its queue is full, and the client then retries every %s). "+
		"Identical: the share of requests whose text equals the same prompt's request sent alone (greedy, so on one machine they should all be), "+
		"and in brackets the share of that text a request repeats, on average, before it departs from it. "+
		"Full: the share that generated all %d tokens (a stream ends early at an end-of-generation token; no server here can be told to ignore it). "+
		"Counted by: where the token counts come from (`usage`: the final usage chunk, `eval_count`: Ollama's last line, `chunks`: messages with text).",
		busyRetry, r.Opts.n)
	p("")
	p("| c | ours TTFT p50 / p99 ms | Ollama TTFT p50 / p99 ms | ours identical | Ollama identical | ceiling identical | ours full | Ollama full | counted by (ours, Ollama) | ours 503 retries |")
	p("|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range r.Opts.conc {
		ou, okO := r.Ours.stat(c)
		ol, okL := r.Ollama.stat(c)
		ce, okC := r.ceiling(0, c)
		p("| %d | %s | %s | %s | %s | %s | %s | %s | %s, %s | %s |", c,
			pair(ou.TTFT50, ou.TTFT99, okO), pair(ol.TTFT50, ol.TTFT99, okL),
			identical(ou, okO), identical(ol, okL), share(ce.Same, okC),
			share(ou.Full, okO), share(ol.Full, okL), text(ou.Counted, okO), text(ol.Counted, okL), num(float64(ou.Busy), okO, 0))
	}
	p("")
}

func (r *report) writeJoins(p func(string, ...any)) {
	if r.Opts.joins == 0 {
		return
	}
	p("## A request joining running streams")
	p("")
	p("With c−1 streams generating, a one-token request with a prompt of its own joins (%d joins, one after another); "+
		"its TTFT against the same kind of request with nothing running (its prefill alone, median of %d).", r.Opts.joins, r.Opts.joins)
	p("")
	p("| c | ours alone ms | ours join p50 / p99 ms | ours join ÷ alone | Ollama alone ms | Ollama join p50 / p99 ms | Ollama join ÷ alone |")
	p("|---|---|---|---|---|---|---|")
	shown := false
	for _, c := range r.Opts.conc {
		ou, okO := joinOf(r.Ours, c)
		ol, okL := joinOf(r.Ollama, c)
		if !okO && !okL {
			continue
		}
		shown = true
		p("| %d | %s | %s | %s | %s | %s | %s |", c,
			num(ou.AloneP50, okO, 0), pair(ou.JoinP50, ou.JoinP99, okO), ratio(ou.JoinP50, ou.AloneP50, okO),
			num(ol.AloneP50, okL, 0), pair(ol.JoinP50, ol.JoinP99, okL), ratio(ol.JoinP50, ol.AloneP50, okL))
	}
	if !shown {
		p("| — | no concurrency between 2 and the slot count (%d) | | | | | |", r.Opts.slots)
	}
	p("")
}

func joinOf(s *systemRun, c int) (joinStats, bool) {
	if s == nil || s.JoinSt == nil {
		return joinStats{}, false
	}
	j, ok := s.JoinSt[c]
	return j, ok
}

func (r *report) writePrefix(p func(string, ...any)) {
	if r.Opts.prefixReps == 0 {
		return
	}
	ou, ol := prefixOf(r.Ours), prefixOf(r.Ollama)
	p("## Shared prefix")
	p("")
	p("Request A (a prompt of %d tokens, one token generated), then request B: A's prompt and a few words more (%d tokens); "+
		"each alone, %d pairs, medians. A server that keeps A's KV and reuses the common prefix answers B in a fraction of A's time.",
		ou.first(ol).ATokens, ou.first(ol).BTokens, r.Opts.prefixReps)
	p("")
	p("| | ours | Ollama |")
	p("|---|---|---|")
	p("| TTFT A ms | %s | %s |", num(ou.st.A, ou.ok, 0), num(ol.st.A, ol.ok, 0))
	p("| TTFT B ms | %s | %s |", num(ou.st.B, ou.ok, 0), num(ol.st.B, ol.ok, 0))
	p("| B ÷ A | %s | %s |", ratio(ou.st.B, ou.st.A, ou.ok), ratio(ol.st.B, ol.st.A, ol.ok))
	p("| TTFT B sent again to its slot (`id_slot`; all of it cached but its last token) ms, ÷ A | %s | — |", slotCell(ou))
	p("")
}

type prefixCell struct {
	st prefixStats
	ok bool
}

func prefixOf(s *systemRun) prefixCell {
	if s == nil || len(s.PrefA) == 0 {
		return prefixCell{}
	}
	return prefixCell{st: s.Prefix, ok: true}
}

// first is c's numbers, or other's where c has none.
func (c prefixCell) first(other prefixCell) prefixStats {
	if c.ok {
		return c.st
	}
	return other.st
}

func slotCell(c prefixCell) string {
	if !c.ok || math.IsNaN(c.st.BSlot) {
		return "—"
	}
	return fmt.Sprintf("%.0f, %s", c.st.BSlot, ratio(c.st.BSlot, c.st.A, true))
}

func (r *report) writeMethod(p func(string, ...any)) {
	o := r.Opts
	p("## How it was measured")
	p("")
	p("- One system at a time, alone on the machine: ours started, measured, stopped; then Ollama; then llama-batched. Each server gets one untimed request first (Ollama loads the model on first use).")
	p("- The same prompts for both servers, in the same order. A prompt is text tokenized by llama-batched with the model's own vocabulary (BOS added, special tokens parsed, as Ollama's llamarunner tokenizes): ours gets the token ids, Ollama the text (`raw: true`, no template). Every round, join and A/B pair has a prompt of its own, because both servers reuse a cached common prefix (Ollama's llamarunner always, the longest a free slot holds: `cache_prompt` cannot be turned off; ours too, see the shared-prefix table): with one prompt throughout, prefills would be skipped and the aggregates would not count them.")
	p("- After each round the same prompt is sent alone; its text is the reference of the round's identical share. Before it, short requests with prompts of their own (%d tokens) fill every slot at once, so that neither server answers the reference from the KV the round computed (both reuse a cached common prefix: see the shared-prefix table).", flushTokens)
	p("- Ollama's default `repeat_penalty` is 1.1 even at temperature 0; the benchmark sets 1 (request options and the Modelfile), so all three decode greedily. Ollama's OpenAI chat endpoint maps `max_tokens` to `num_predict` and keeps `temperature` and `seed`; it has no option to ignore end-of-generation tokens (nor has ours), so a stream that reaches one ends early, which the Full column shows. Ollama also ends a stream whose last %d tokens are the same text, without its done line (its repeat guard); such a stream's tokens are counted as its lines.", ollamaRepeatCut)
	p("- The ceiling is `llama-batched` (bench/cmd/llama-batched): llama.cpp's C API from the same sources as our plugin, N sequences prefilled with the prompt, then one `llama_batch` of N tokens a step, greedy argmax, end-of-generation ignored.")
	p("- %d threads for every system; flash attention %s; n_gpu_layers %d.", o.threads, o.flashAttn, o.ngl)
	p("")
}

func (r *report) writeMachine(p func(string, ...any)) {
	m := r.Mach
	p("## Machine and builds")
	p("")
	p("- CPU: %s, %d cores visible; memory %s; kernel %s; load average %s at the start, %s at the end "+
		"(other work on the machine slows every system alike only if it lasts the whole run).", m.CPU, m.Cores, m.Memory, m.Kernel, m.LoadStart, loadAvg())
	if len(m.GPUs) == 0 {
		p("- GPU: none (no nvidia-smi).")
	}
	for _, g := range m.GPUs {
		p("- GPU: %s.", g)
	}
	p("- Driver built with %s.", m.Go)
	for _, b := range r.Binaries {
		cf := b.CFlags
		if cf == "" {
			cf = "unknown (no " + filepath.Base(b.Path) + ".cflags beside it)"
		}
		p("- %s: `%s`, %s; C flags (CGO_CFLAGS, CGO_CXXFLAGS): `%s`.", b.Role, filepath.Base(b.Path), b.Version, cf)
	}
	for _, s := range []*systemRun{r.Ours, r.Ollama} {
		if s == nil {
			continue
		}
		for _, st := range s.Settings {
			p("- %s: `%s`", s.Name, st)
		}
		for _, f := range s.Facts {
			p("- %s log: `%s`", s.Name, f)
		}
	}
	for _, c := range r.Ceilings {
		s := c.Setup
		p("- %s: `%s`; device %s, n_gpu_layers %d, n_ctx %d, %d sequences, flash attention %s, kv_unified %v; %s.",
			c.Label, strings.Join(c.Args, " "), s.Device, s.NGPULayers, s.NCtx, s.NSeqMax, s.FlashAttn, s.KVUnified, s.System)
	}
	p("")
}

// Cell formatting: a dash where a system has no value.

func num(x float64, ok bool, prec int) string {
	if !ok || math.IsNaN(x) {
		return "—"
	}
	return fmt.Sprintf("%.*f", prec, x)
}

func ratio(a, b float64, ok bool) string {
	if !ok || b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func pair(a, b float64, ok bool) string {
	if !ok || math.IsNaN(a) {
		return "—"
	}
	return fmt.Sprintf("%.0f / %.0f", a, b)
}

func share(x float64, ok bool) string {
	if !ok {
		return "—"
	}
	return pct(x)
}

func identical(st concStats, ok bool) string {
	if !ok || math.IsNaN(st.Identical) {
		return "—"
	}
	return fmt.Sprintf("%s (%s)", pct(st.Identical), pct(st.Agree))
}

func text(s string, ok bool) string {
	if !ok || s == "" {
		return "—"
	}
	return s
}

// writeLlamaServer is ours beside llama-server from the same llama.cpp tree,
// the same model file, prompts as token ids and slots (its -np): the
// aggregate, each stream's rate, the time to first token and, where
// measured, a request joining running streams.
func (r *report) writeLlamaServer(p func(string, ...any)) {
	if r.LlamaServer == nil {
		return
	}
	p("## Ours and llama-server")
	p("")
	p("llama-server built from the llama.cpp tree the plugin links (`make llama-server`), `-np %d -c %d --kv-unified`, the same requests "+
		"(POST /v1/completions, prompt as token ids). Settings: %s.", r.Opts.slots, r.Opts.slots*r.Opts.ctx, strings.Join(r.LlamaServer.Settings, "; "))
	p("")
	p("| c | ours tok/s | llama-server tok/s | ours ÷ llama-server | ours per stream | llama-server per stream | ours TTFT p50 ms | llama-server TTFT p50 ms | ours join p50 ms | llama-server join p50 ms | identical (ours, llama-server) |")
	p("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range r.Opts.conc {
		ou, okO := r.Ours.stat(c)
		ls, okS := r.LlamaServer.stat(c)
		jo, okJO := joinOf(r.Ours, c)
		js, okJS := joinOf(r.LlamaServer, c)
		p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s, %s |", c,
			num(ou.Agg, okO, 1), num(ls.Agg, okS, 1), ratio(ou.Agg, ls.Agg, okO && okS),
			num(ou.Stream, okO, 1), num(ls.Stream, okS, 1), num(ou.TTFT50, okO, 0), num(ls.TTFT50, okS, 0),
			num(jo.JoinP50, okJO, 0), num(js.JoinP50, okJS, 0), identical(ou, okO), identical(ls, okS))
	}
	p("")
}
