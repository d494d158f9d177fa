package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

const ceilingOutput = `{"kind":"setup","model":"m.gguf","model_desc":"llama ?B F16","model_bytes":112756736,"device":"CPU","n_gpu_layers":0,"n_ctx":1280,"n_seq_max":4,"threads":2,"flash_attn":"on","kv_unified":true,"n_prompt":256,"n_gen":64,"llama":"github.com/ollama/ollama v0.17.4","system":"CPU : AVX2 = 1"}
np   1: a human-readable note on stdout is skipped
{"kind":"result","np":1,"n_prompt":256,"n_gen":64,"pp_s":0.22,"tg_s":0.56,"pp_tps":1150.8,"tg_tps":112.7,"stream_tps":112.7,"e2e_tps":81.9,"step_ms":8.9,"same_as_alone":1,"eog_seen":0}
{"kind":"result","np":2,"n_prompt":256,"n_gen":64,"pp_s":0.41,"tg_s":0.65,"pp_tps":1241.2,"tg_tps":193.6,"stream_tps":96.8,"e2e_tps":120.4,"step_ms":10.3,"same_as_alone":0.5,"eog_seen":0}
`

func TestParseCeiling(t *testing.T) {
	run, err := parseCeiling(strings.NewReader(ceilingOutput))
	if err != nil {
		t.Fatal(err)
	}
	if run.Setup.Device != "CPU" || run.Setup.NCtx != 1280 || !run.Setup.KVUnified || len(run.Results) != 2 {
		t.Fatalf("%+v", run)
	}
	if r, ok := run.byNP(2); !ok || r.E2ETPS != 120.4 || r.Same != 0.5 {
		t.Errorf("np 2: %+v %v", r, ok)
	}
	if _, ok := run.byNP(4); ok {
		t.Error("np 4 was not measured")
	}
	if _, err := parseCeiling(strings.NewReader("no json here\n")); err == nil {
		t.Error("output without results accepted")
	}
}

// testReport is a run of two concurrencies: ours and the ceiling measured
// at both, Ollama failed.
func testReport(t *testing.T) *report {
	t.Helper()
	run, err := parseCeiling(strings.NewReader(ceilingOutput))
	if err != nil {
		t.Fatal(err)
	}
	o := options{conc: []int{1, 2}, n: 64, p: 256, slots: 2, ctx: 1024, threads: 2, ngl: -1, flashAttn: "on",
		reps: 1, joins: 2, prefixReps: 1, name: "decode-test", model: "/x/m.gguf"}
	ours := &systemRun{Name: "ours", API: oursRaw.name, Settings: []string{"hydra-engine --slots 2"},
		Conc: map[int]concStats{
			1: {C: 1, Agg: 50, Stream: 60, TTFT50: 100, TTFT99: 110, Identical: 1, Agree: 1, Full: 1, Counted: "usage"},
			2: {C: 2, Agg: 60, Stream: 40, TTFT50: 150, TTFT99: 190, Identical: 0.5, Agree: 0.75, Full: 1, Counted: "usage", Busy: 3},
		},
		JoinSt: map[int]joinStats{2: {C: 2, Joins: 2, AloneP50: 100, JoinP50: 250, JoinP99: 300}},
		PrefA:  []sample{{}},
		Prefix: prefixStats{ATokens: 2000, BTokens: 2010, A: 1000, B: 1100, BSlot: 50},
	}
	run.Label, run.Args = "ceiling", []string{"llama-batched", "-np", "1,2"}
	pl := plan{rounds: map[int][]prompt{1: {{Tokens: make([]int32, 250)}}, 2: {{Tokens: make([]int32, 256)}}}}
	return &report{Opts: o, Mach: machine{CPU: "Test CPU", Cores: 2}, Date: time.Unix(0, 0), Plan: pl, Ours: ours,
		Ceilings: []*ceilingRun{run}, Errors: map[string]string{"ollama": "ollama create: exit status 1"}}
}

func TestMarkdown(t *testing.T) {
	r := testReport(t)
	var b bytes.Buffer
	r.markdown(&b)
	md := b.String()
	for _, want := range []string{
		"# Decode throughput at 1–2 concurrent streams",
		"(decode-test.svg)",
		"prompt of 250–256 tokens",
		"**ollama** failed:",
		"ollama create: exit status 1",
		// c=2: ours 60, Ollama missing, ceiling e2e 120.4; ours ÷ ceiling 0.50.
		"| 2 | 60.0 | — | 120.4 | — | 0.50 | 40.0 | — | 96.8 |",
		"| 1 | 100 / 110 | — | 100% (100%) | — | 100% | 100% | — | usage, — | 0 |",
		"| 2 | 150 / 190 | — | 50% (75%) | — | 50% | 100% | — | usage, — | 3 |",
		"| 2 | 100 | 250 / 300 | 2.50 | — | — | — |",
		"| B ÷ A | 1.10 | — |",
		"| TTFT B sent again to its slot (`id_slot`; all of it cached but its last token) ms, ÷ A | 50, 0.05 | — |",
		"ceiling: N=1 112.7, N=2 193.6",
		"- CPU: Test CPU, 2 cores visible",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("page lacks %q\n%s", want, md)
		}
	}
}

func TestChart(t *testing.T) {
	r := testReport(t)
	if ls := r.lines(); len(ls) != 2 || ls[0].xy[1].Y != 60 || ls[1].xy[1].Y != 120.4 {
		t.Errorf("lines %+v", ls)
	}
	var b bytes.Buffer
	if err := r.chart(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "<svg") {
		t.Error("no SVG")
	}
}

func TestCells(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{num(1.25, true, 1), "1.2"}, {num(1, false, 1), "—"}, {num(math.NaN(), true, 1), "—"},
		{ratio(1, 4, true), "0.25"}, {ratio(1, 0, true), "—"}, {pair(1.4, 2.6, true), "1 / 3"},
		{share(math.NaN(), true), "—"}, {share(0.5, true), "50%"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
