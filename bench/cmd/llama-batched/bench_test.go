package main

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeLlama records the batches it decodes; its "model" predicts token
// (last token of the sequence + 1), so every sequence of a prompt generates
// the same tokens, as greedy llama.cpp does on one machine.
type fakeLlama struct {
	pending  []entry
	batches  [][]entry
	lastRows []entry
	last     map[int]int32 // per sequence: the last token it was fed
	kv       map[int]int   // per sequence: cells held
	cleared  int
}

type entry struct {
	tok      int32
	pos, seq int
	logits   bool
}

func newFake() *fakeLlama { return &fakeLlama{last: map[int]int32{}, kv: map[int]int{}} }

func (f *fakeLlama) setup() setupInfo                 { return setupInfo{NVocab: 1000} }
func (f *fakeLlama) tokenize(string) ([]int32, error) { return nil, nil }
func (f *fakeLlama) makeContext(int, int) error       { return nil }
func (f *fakeLlama) batchAdd(tok int32, pos, seq int, logits bool) {
	f.pending = append(f.pending, entry{tok, pos, seq, logits})
}
func (f *fakeLlama) batchLen() int { return len(f.pending) }
func (f *fakeLlama) decode() error {
	for _, e := range f.pending {
		f.last[e.seq] = e.tok
		f.kv[e.seq]++
	}
	f.batches = append(f.batches, f.pending)
	f.lastRows, f.pending = f.pending, nil
	return nil
}
func (f *fakeLlama) argmax(i int) int32 {
	e := f.lastRows[i]
	if !e.logits {
		panic("argmax of a row without logits")
	}
	return e.tok + 1
}
func (f *fakeLlama) isEOG(tok int32) bool { return tok == 2 }
func (f *fakeLlama) clear()               { f.cleared++; f.kv = map[int]int{} }
func (f *fakeLlama) close()               {}

func TestPrefillChunksAndReadsEachSequencesLastRow(t *testing.T) {
	f := newFake()
	prompt := []int32{1, 10, 11, 12, 13}
	next, err := prefill(f, prompt, 3, 4) // 15 tokens in batches of 4
	if err != nil {
		t.Fatal(err)
	}
	if got := len(f.batches); got != 4 {
		t.Fatalf("%d batches, want 4 (4+4+4+3)", got)
	}
	for s, n := range next {
		if n != 14 {
			t.Errorf("sequence %d: first token %d, want 14 (after its last prompt token 13)", s, n)
		}
	}
	for s := range 3 {
		if f.kv[s] != len(prompt) {
			t.Errorf("sequence %d holds %d cells, want %d", s, f.kv[s], len(prompt))
		}
	}
	n := 0
	for _, b := range f.batches {
		for _, e := range b {
			if e.logits {
				n++
				if e.tok != 13 || e.pos != 4 {
					t.Errorf("logits asked for %+v, want only each sequence's last prompt token", e)
				}
			}
		}
	}
	if n != 3 {
		t.Errorf("%d rows with logits, want 3", n)
	}
}

func TestMeasureDecodesOneBatchPerStep(t *testing.T) {
	f := newFake()
	prompt := []int32{1, 20, 21}
	clock := fakeClock(time.Second)
	r, toks, err := measure(f, prompt, 4, 5, 2048, clock)
	if err != nil {
		t.Fatal(err)
	}
	if f.cleared != 1 {
		t.Errorf("cache cleared %d times, want 1", f.cleared)
	}
	// One prefill batch (12 tokens), then 4 decode steps of 4 tokens.
	if len(f.batches) != 5 {
		t.Fatalf("%d batches, want 5", len(f.batches))
	}
	for i, b := range f.batches[1:] {
		if len(b) != 4 {
			t.Errorf("step %d: %d tokens, want one per sequence", i+1, len(b))
		}
		for _, e := range b {
			if e.pos != len(prompt)+i {
				t.Errorf("step %d: position %d, want %d", i+1, e.pos, len(prompt)+i)
			}
		}
	}
	want := []int32{22, 23, 24, 25, 26}
	for s, got := range toks {
		if !slices.Equal(got, want) {
			t.Errorf("sequence %d generated %v, want %v", s, got, want)
		}
	}
	// The fake clock: prefill 1 s, decode 1 s.
	if r.PPSec != 1 || r.TGSec != 1 || r.TGTPS != 16 || r.Stream != 4 || r.E2ETPS != 10 || r.StepMS != 250 {
		t.Errorf("timings %+v", r)
	}
}

func fakeClock(step time.Duration) func() time.Time {
	t := time.Unix(0, 0)
	return func() time.Time { t = t.Add(step); return t }
}

func TestMeasureAllPrintsOneResultLinePerN(t *testing.T) {
	f := newFake()
	var out bytes.Buffer
	cfg := config{nps: []int{1, 3}, nGen: 4, nBatch: 2048, warmup: true}
	if err := measureAll(f, []int32{1, 30}, cfg, json.NewEncoder(&out), io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), out.String())
	}
	for i, np := range cfg.nps {
		var r result
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
			t.Fatal(err)
		}
		if r.Kind != "result" || r.NP != np || r.Same != 1 || r.NGen != 4 || r.NPrompt != 2 {
			t.Errorf("line %d: %+v", i, r)
		}
	}
}

func TestSameShare(t *testing.T) {
	ref := []int32{5, 6}
	if got := sameShare([][]int32{{5, 6}, {5, 7}, {5, 6}, {6, 6}}, ref); got != 0.5 {
		t.Errorf("sameShare = %v, want 0.5", got)
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-m", "x.gguf", "-np", "1, 2,8", "-n", "16", "-fa", "off", "-kvu=false"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.nps, []int{1, 2, 8}) || c.nGen != 16 || c.flashAttn != "off" || c.kvUnified {
		t.Errorf("parsed %+v", c)
	}
	for _, bad := range [][]string{
		{"-np", "1"},
		{"-m", "x", "-np", "0"},
		{"-m", "x", "-np", "1,a"},
		{"-m", "x", "-fa", "maybe"},
		{"-m", "x", "-tokenize"},
		{"-m", "x", "-np", "64", "-b", "32"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestContextSize(t *testing.T) {
	if got := contextSize(config{nps: []int{1, 4, 2}, nGen: 128}, 100); got != 1024 {
		t.Errorf("contextSize = %d, want 4 × 228 = 912 rounded up to 1024", got)
	}
	if got := contextSize(config{nCtx: 777}, 100); got != 777 {
		t.Errorf("an explicit -c must win, got %d", got)
	}
}

func TestSyntheticPromptStaysInTheVocabulary(t *testing.T) {
	p := syntheticPrompt(5000, 300, 1)
	if p[0] != 1 {
		t.Errorf("first token %d, want BOS (1)", p[0])
	}
	for i, tok := range p[1:] {
		if tok < 5 || tok >= 300 {
			t.Fatalf("token %d = %d outside [5, 300)", i+1, tok)
		}
	}
}
