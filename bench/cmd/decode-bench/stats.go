package main

import (
	"math"
	"slices"
	"time"
)

// percentile is the q-quantile (0 ≤ q ≤ 1) of xs by linear interpolation
// between the closest ranks (the usual "type 7"); NaN for no values. With
// few values p99 is close to the largest, which is what a tail of a handful
// of requests can say.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	h := q * float64(len(s)-1)
	lo := int(math.Floor(h))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (h-float64(lo))*(s[hi]-s[lo])
}

func median(xs []float64) float64 { return percentile(xs, 0.5) }

// ms converts durations to milliseconds for the statistics.
func ms(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// round is c requests started at once.
type round struct {
	C       int      `json:"c"`
	Samples []sample `json:"samples"`
	Ref     *sample  `json:"ref,omitempty"` // the same prompt alone, after the round
}

// wall is the round's time from its start to its last token.
func (r round) wall() time.Duration {
	var last time.Duration
	for _, s := range r.Samples {
		last = max(last, s.Last)
	}
	return last
}

func (r round) tokens() int {
	n := 0
	for _, s := range r.Samples {
		n += s.Tokens
	}
	return n
}

// aggregate is the round's tokens over its wall time.
func (r round) aggregate() float64 {
	w := r.wall().Seconds()
	if w <= 0 {
		return 0
	}
	return float64(r.tokens()) / w
}

// concStats summarises one system's rounds at one concurrency.
type concStats struct {
	C         int
	Rounds    int
	Agg       float64 // tokens/s, median over rounds
	Stream    float64 // per-stream decode tokens/s, median over requests
	TTFT50    float64 // ms
	TTFT99    float64 // ms
	Identical float64 // share of requests whose text equals the prompt alone; NaN without references
	Agree     float64 // mean share of the reference's text a request repeats before it departs from it
	Full      float64 // share of requests that generated all n tokens
	Tokens    float64 // mean tokens a request
	Counted   string  // what counted the tokens
	Busy      int     // 503 retries (ours queues nothing)
	Errors    int
}

func summarise(c, n int, rounds []round) concStats {
	st := concStats{C: c, Rounds: len(rounds), Identical: math.NaN(), Agree: math.NaN()}
	agree := 0.0
	var aggs, rates []float64
	var ttfts []time.Duration
	same, refs, full, reqs, toks := 0, 0, 0, 0, 0
	counted := map[string]bool{}
	for _, r := range rounds {
		aggs = append(aggs, r.aggregate())
		for _, s := range r.Samples {
			reqs++
			if s.Err != "" {
				st.Errors++
				continue
			}
			ttfts = append(ttfts, s.ttft())
			rates = append(rates, s.decodeRate())
			toks += s.Tokens
			st.Busy += s.Busy
			counted[s.Counted] = true
			if s.Tokens == n {
				full++
			}
			if r.Ref != nil && r.Ref.Err == "" {
				refs++
				if s.Text == r.Ref.Text {
					same++
				}
				agree += agreement(s.Text, r.Ref.Text)
			}
		}
	}
	st.Agg, st.Stream = median(aggs), median(rates)
	st.TTFT50, st.TTFT99 = percentile(ms(ttfts), 0.5), percentile(ms(ttfts), 0.99)
	if refs > 0 {
		st.Identical, st.Agree = float64(same)/float64(refs), agree/float64(refs)
	}
	if ok := reqs - st.Errors; ok > 0 {
		st.Full = float64(full) / float64(ok)
		st.Tokens = float64(toks) / float64(ok)
	}
	for _, k := range []string{"usage", "eval_count", "chunks"} {
		if counted[k] {
			if st.Counted != "" {
				st.Counted += "+"
			}
			st.Counted += k
		}
	}
	return st
}

// agreement is the share of ref that text repeats from its start: 1 for the
// same text, less where greedy decoding took another token (a departure
// late in the text is a rounding difference, not a wrong prompt).
func agreement(text, ref string) float64 {
	if len(ref) == 0 {
		if len(text) == 0 {
			return 1
		}
		return 0
	}
	n := 0
	for n < len(text) && n < len(ref) && text[n] == ref[n] {
		n++
	}
	if n == len(ref) && len(text) != len(ref) {
		n-- // a longer (or shorter) text is not the same text
	}
	return float64(n) / float64(len(ref))
}
