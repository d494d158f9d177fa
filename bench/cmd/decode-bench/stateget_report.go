package main

import (
	"fmt"
	"math"
)

// writeStateGet is the page's section "Decode beside a state transfer":
// what was measured, the comparison against issue 26's target, and every
// round.
func (r *report) writeStateGet(p func(string, ...any)) {
	s := r.StateGet
	if s == nil {
		return
	}
	p("## Decode beside a state transfer")
	p("")
	op := s.op()
	p("Issue 26's target: while a %s of slot 0 (%.2f GB of KV state asked for) streams, the other slots' aggregate tokens/s is at least %.1f of what it is without. "+
		"Ours only, in an engine of its own: `--slots %d`, `n_ctx=%d`, one cache all slots share (slot 0's sequence and %d cells for each stream).",
		op, float64(s.Bytes)/1e9, stateTarget, s.Slots, s.NCtx, s.PerStream)
	if s.NPast == 0 {
		p("")
		p("Not measured: it failed (see Failures).")
		p("")
		return
	}
	p("Slot 0 holds %d tokens, put there by one PREFILL over Hydra RPC with raw token ids (n_past %d, state_size %d bytes, prefill %.0f ms; "+
		"%d tokens because the backend's state is %.0f bytes a token and %d bytes besides, from PREFILLs of %d and %d tokens in a probe engine); "+
		"a STATE_GET of it is %d bytes, streamed in pieces of `state_chunk_size` %d (the engine's default). Every %s's reply repeats slot 0's n_past: no completion took the slot.",
		s.Tokens, s.NPast, s.StateSize, s.PrefillMS, s.Tokens, s.Model.PerToken, s.Model.Fixed, probeA, probeB, s.BlobBytes, s.ChunkSize, op)
	loop := "pulls it over the engine's Unix socket, as a coordinator on the same host would, discarding the bytes"
	if s.Put {
		loop = "puts one STATE_GET's bytes, held in memory, back into it over the engine's Unix socket, as a coordinator moving a sequence in would"
	}
	p("%d streaming completions (a fresh prompt of %s tokens each round, %d tokens each, greedy) run on the other slots, once alone and once while a loop of %ss of slot 0 "+
		"%s; the loop starts before the round's requests and ends after its last stream. "+
		"%d pairs of rounds, in the order without, with; with, without; … so that a drift in the machine's speed falls on both kinds alike. "+
		"Slot 0's sequence is in the cache in both kinds of round, so they differ by the transfers alone. "+
		"Aggregate: a round's tokens over its wall time, prefill included (as in Throughput), the mean of the rounds of a kind; "+
		"per stream and TTFT: medians over the streams of those rounds. GB/s in the rounds: the bytes received (sent, for STATE_PUTs) during the rounds over their time; alone: the median of %d %ss with nothing decoding (half before the rounds, half after).",
		s.Streams, r.statePromptTokens(), s.N, op, loop, s.Reps, s.Sum.AloneN, op)
	p("")
	u := s.Sum
	verdict := "not met"
	if u.Met {
		verdict = "met"
	}
	p("| | without | with the %s loop | with ÷ without |", op)
	p("|---|---|---|---|")
	p("| aggregate tok/s | %s | %s | **%s** (target ≥ %.2f: %s) |", fcell(u.AggWithout, 1), fcell(u.AggWith, 1), fratio(u.AggWith, u.AggWithout), stateTarget, verdict)
	p("| per-stream decode tok/s | %s | %s | %s |", fcell(u.StreamWithout, 1), fcell(u.StreamWith, 1), fratio(u.StreamWith, u.StreamWithout))
	p("| TTFT p50 ms | %s | %s | %s |", fcell(u.TTFTWithout, 0), fcell(u.TTFTWith, 0), fratio(u.TTFTWith, u.TTFTWithout))
	p("| %s GB/s | %s alone (%d transfers, nothing decoding) | %s (%d transfers in the rounds) | %s |", op,
		fcell(u.GBpsAlone, gbPrec), u.AloneN, fcell(u.GBpsRounds, gbPrec), u.TransfersRounds, num(float64(u.GBpsRounds/u.GBpsAlone), u.GBpsAlone > 0, gbPrec))
	p("")
	p("| round | %s loop | aggregate tok/s | per-stream tok/s | TTFT p50 ms | %ss | GB/s during the round | errors |", op, op)
	p("|---|---|---|---|---|---|---|---|")
	for i, sr := range s.Rounds {
		gets, gb := "—", "—"
		if sr.WithGet {
			gets, gb = fmt.Sprint(sr.Overlap), fcell(sr.GetGBps, gbPrec)
		}
		p("| %d | %s | %s | %s | %s | %s | %s | %d |", i+1, onOff(sr.WithGet), fcell(sr.Agg, 1), fcell(sr.Stream, 1), fcell(sr.TTFT50, 0), gets, gb, sr.Errors)
	}
	p("")
	for _, st := range s.Settings {
		p("- engine: `%s`", st)
	}
	p("")
}

// statePromptTokens is the state rounds' prompt length, min–max.
func (r *report) statePromptTokens() string {
	lo, hi := math.MaxInt, 0
	for _, q := range r.Plan.state {
		lo, hi = min(lo, len(q.Tokens)), max(hi, len(q.Tokens))
	}
	switch {
	case hi == 0:
		return "?"
	case lo == hi:
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

// gbPrec is the decimals of GB/s: a transfer that crawls beside decoding
// (megabytes a second) must not read as zero.
const gbPrec = 3

func fcell(x fnum, prec int) string { return num(float64(x), true, prec) }

func fratio(a, b fnum) string { return ratio(float64(a), float64(b), true) }
