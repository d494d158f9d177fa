package main

import (
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

func TestPromptCacheFlags(t *testing.T) {
	o, err := parseFlags([]string{"-model", "m.gguf", "-systems", "", "-prompt-cache-tokens", "16384"}, io.Discard)
	if err != nil || len(o.systems) != 0 || o.cacheTokens != 16384 || o.cacheReps != 3 || o.cacheRAM != 8192 || o.cacheOther != 512 {
		t.Fatalf("%+v, %v", o, err)
	}
	for _, bad := range [][]string{
		{"-model", "m", "-systems", ""},
		{"-model", "m", "-prompt-cache-tokens", "-1"},
		{"-model", "m", "-prompt-cache-tokens", "10"},
		{"-model", "m", "-prompt-cache-tokens", "4096", "-prompt-cache-reps", "0"},
		{"-model", "m", "-prompt-cache-tokens", "4096", "-prompt-cache-ram", "0"},
		{"-model", "m", "-prompt-cache-tokens", "4096", "-prompt-cache-other", "5000"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPromptCacheSummary(t *testing.T) {
	text := "# HELP hydra_engine_prompt_cache_hits_total x\nhydra_engine_prompt_cache_hits_total 4\n" +
		"hydra_engine_prompt_cache_restores_total 4\nhydra_engine_prompt_cache_restored_bytes_total 8e+09\n" +
		"hydra_engine_prompt_cache_restore_seconds_total 0.5\nhydra_engine_prompt_cache_failures_total{op=\"save\"} 0\n" +
		"hydra_engine_tokens_total{phase=\"prefill\"} 9\n"
	m := seriesOf(text, "hydra_engine_prompt_cache_")
	if len(m) != 5 || m["hits_total"] != 4 || m[`failures_total{op="save"}`] != 0 {
		t.Fatalf("series %v", m)
	}
	at := func(ms ...float64) sample {
		return sample{Start: 0, First: time.Duration(ms[0] * float64(time.Millisecond))}
	}
	e := cacheEngine{Cache: true, Metrics: m, Rounds: []cacheRound{
		{A: at(100), Other: at(10), Back: at(5), InSlot: at(4)},
		{A: at(120), Other: at(12), Back: at(7), InSlot: at(4)},
		{A: at(110), Other: at(11), Back: at(6), InSlot: at(5)},
		{A: sample{Err: "boom"}},
	}}
	s := summariseCache(e)
	if s.A != 110 || s.Other != 11 || s.Back != 6 || s.InSlot != 4 || s.Errors != 1 || s.Restores != 4 ||
		s.RestoreGBps != 16 || s.RestoreBytes != 2e9 || !math.IsNaN(float64(s.SaveGBps)) {
		t.Fatalf("summary %+v", s)
	}
}

// The prompt cache alone (-systems "") is a page of its own: the section,
// its medians and rounds, no throughput tables.
func TestPromptCachePage(t *testing.T) {
	at := func(ms float64) sample { return sample{First: time.Duration(ms * float64(time.Millisecond))} }
	rd := func(a, s, o, b float64) cacheRound {
		return cacheRound{A: at(a), InSlot: at(s), Other: at(o), Back: at(b)}
	}
	on := cacheEngine{Cache: true, Rounds: []cacheRound{rd(1500, 30, 40, 60)},
		Metrics: map[string]float64{"hits_total": 2, "restores_total": 2, "restored_bytes_total": 1.6e9, "restore_seconds_total": 0.08}}
	off := cacheEngine{Rounds: []cacheRound{rd(1490, 31, 35, 1480)}}
	on.Sum, off.Sum = summariseCache(on), summariseCache(off)
	r := &report{Opts: options{cacheTokens: 16384}, Errors: map[string]string{},
		PromptCache: &promptCacheRun{Tokens: 16384, Prefix: 16380, Other: 512, RAM: 8192, Reps: 1, NCtx: 16896, Engines: []cacheEngine{on, off}}}
	var buf strings.Builder
	r.markdown(&buf)
	md := buf.String()
	for _, want := range []string{
		"# A prefix that left its slot: the prompt cache",
		"`--slots 1`, `n_ctx=16896`",
		"a prefix of 16380 tokens",
		"| **back (TTFT): a question on it after it left its slot** | 60.0 | 1480.0 | 0.04 |",
		"2 restores of 800000000 bytes each at 20.000 GB/s",
		"| on | 1 | 1500.0 | 30.0 | 40.0 | 60.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("page lacks %q\n%s", want, md)
		}
	}
	if strings.Contains(md, "## Throughput") {
		t.Error("the prompt cache's page has the throughput tables")
	}
}
