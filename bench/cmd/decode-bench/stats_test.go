package main

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	xs := []float64{40, 10, 30, 20}
	for _, tc := range []struct{ q, want float64 }{
		{0, 10}, {0.5, 25}, {1, 40}, {0.99, 39.7}, {1.0 / 3, 20},
	} {
		if got := percentile(xs, tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("percentile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := percentile([]float64{7}, 0.99); got != 7 {
		t.Errorf("one value: %v", got)
	}
	if !math.IsNaN(median(nil)) {
		t.Error("no values must give NaN")
	}
	if xs[0] != 40 {
		t.Error("percentile sorted its argument in place")
	}
}

func TestSampleRates(t *testing.T) {
	s := sample{Start: 10 * time.Millisecond, First: 110 * time.Millisecond, Last: 1110 * time.Millisecond, Tokens: 101}
	if got := s.ttft(); got != 100*time.Millisecond {
		t.Errorf("ttft %v", got)
	}
	if got := s.decodeRate(); math.Abs(got-100) > 1e-9 {
		t.Errorf("decodeRate %v, want 100 tokens/s after the first", got)
	}
	if got := (sample{Tokens: 1, First: 1, Last: 1}).decodeRate(); got != 0 {
		t.Errorf("one token has no rate, got %v", got)
	}
}

func sampleOf(start, first, last time.Duration, tokens int, text string) sample {
	return sample{Start: start, First: first, Last: last, Tokens: tokens, Text: text, Counted: "usage", Slot: -1}
}

func TestSummarise(t *testing.T) {
	ms := time.Millisecond
	ref := sampleOf(0, 100*ms, 1000*ms, 10, "abc")
	r1 := round{C: 2, Ref: &ref, Samples: []sample{
		sampleOf(0, 100*ms, 1000*ms, 10, "abc"),
		sampleOf(0, 300*ms, 2000*ms, 10, "abd"), // differs from the reference
	}}
	ref2 := sampleOf(0, 100*ms, 1000*ms, 10, "xyz")
	r2 := round{C: 2, Ref: &ref2, Samples: []sample{
		sampleOf(0, 200*ms, 1000*ms, 10, "xyz"),
		sampleOf(0, 200*ms, 1000*ms, 6, "xy"), // stopped early
	}}
	if w := r1.wall(); w != 2*time.Second {
		t.Errorf("wall %v, want the last token's time", w)
	}
	if a := r1.aggregate(); a != 10 {
		t.Errorf("aggregate %v, want 20 tokens / 2 s", a)
	}
	st := summarise(2, 10, []round{r1, r2})
	// Aggregates 10 and 16: median 13.
	if st.Agg != 13 {
		t.Errorf("Agg %v, want 13", st.Agg)
	}
	if st.TTFT50 != 200 {
		t.Errorf("TTFT p50 %v, want 200 ms", st.TTFT50)
	}
	// "abd" repeats 2 of "abc"'s 3 bytes, "xy" 2 of "xyz"'s: (1 + 2/3 + 1 + 2/3) / 4.
	if math.Abs(st.Agree-5.0/6) > 1e-9 {
		t.Errorf("Agree %v, want 5/6", st.Agree)
	}
	if st.Identical != 0.5 || st.Full != 0.75 {
		t.Errorf("identical %v, full %v, want 0.5 and 0.75", st.Identical, st.Full)
	}
	if st.Counted != "usage" || st.Errors != 0 || st.Tokens != 9 {
		t.Errorf("%+v", st)
	}
}

func TestSummariseCountsErrorsApart(t *testing.T) {
	r := round{C: 2, Samples: []sample{sampleOf(0, 100*time.Millisecond, 200*time.Millisecond, 4, "a"), {Err: "boom", Slot: -1}}}
	st := summarise(2, 4, []round{r})
	if st.Errors != 1 || st.Full != 1 || !math.IsNaN(st.Identical) {
		t.Errorf("%+v", st)
	}
}

func TestAgreement(t *testing.T) {
	for _, tc := range []struct {
		text, ref string
		want      float64
	}{
		{"abcd", "abcd", 1}, {"abxx", "abcd", 0.5}, {"ab", "abcd", 0.5}, {"abcdef", "abcd", 0.75}, {"", "", 1}, {"x", "", 0},
	} {
		if got := agreement(tc.text, tc.ref); got != tc.want {
			t.Errorf("agreement(%q, %q) = %v, want %v", tc.text, tc.ref, got, tc.want)
		}
	}
}
