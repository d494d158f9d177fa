package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"
)

// backend is what the measurement needs of llama.cpp (llama.go), behind an
// interface so that the schedule of batches is tested without a model.
type backend interface {
	setup() setupInfo
	tokenize(text string) ([]int32, error)
	// makeContext creates the llama_context: nCtx KV cells, nSeqMax sequences.
	makeContext(nCtx, nSeqMax int) error
	// batchAdd appends a token to the pending batch; logits asks for its row.
	batchAdd(tok int32, pos, seq int, logits bool)
	batchLen() int
	// decode evaluates the pending batch and empties it.
	decode() error
	// argmax is the greedy token of row i (its index in the batch last decoded).
	argmax(i int) int32
	isEOG(tok int32) bool
	// clear empties the KV cache of every sequence.
	clear()
	close()
}

// setupInfo is the "setup" line: what was measured on what.
type setupInfo struct {
	Kind       string `json:"kind"`
	Model      string `json:"model"`
	ModelDesc  string `json:"model_desc"`
	ModelBytes uint64 `json:"model_bytes"`
	NParams    uint64 `json:"n_params"`
	NVocab     int    `json:"n_vocab"`
	BOS        int32  `json:"bos"`
	Device     string `json:"device"` // "CPU" or the GPU's name
	GPULib     string `json:"gpu_lib,omitempty"`
	NGPULayers int    `json:"n_gpu_layers"`
	NCtx       int    `json:"n_ctx"`
	NSeqMax    int    `json:"n_seq_max"`
	NBatch     int    `json:"n_batch"`
	NUBatch    int    `json:"n_ubatch"`
	Threads    int    `json:"threads"`
	FlashAttn  string `json:"flash_attn"`
	KVUnified  bool   `json:"kv_unified"`
	NPrompt    int    `json:"n_prompt"`
	NGen       int    `json:"n_gen"`
	Llama      string `json:"llama"`  // the module the llama.cpp sources came from
	System     string `json:"system"` // llama_print_system_info
}

// result is one "result" line: N sequences, each prefilled with the prompt
// and then generating NGen tokens (the first from the prefill's logits, the
// rest from NGen-1 batched decode steps).
type result struct {
	Kind    string  `json:"kind"`
	NP      int     `json:"np"`
	NPrompt int     `json:"n_prompt"`
	NGen    int     `json:"n_gen"`
	PPSec   float64 `json:"pp_s"`       // prefill of all N prompts
	TGSec   float64 `json:"tg_s"`       // the NGen-1 decode steps
	PPTPS   float64 `json:"pp_tps"`     // prompt tokens per second
	TGTPS   float64 `json:"tg_tps"`     // generated tokens per second of decode, all sequences
	Stream  float64 `json:"stream_tps"` // the same, per sequence
	E2ETPS  float64 `json:"e2e_tps"`    // N × NGen over prefill + decode
	StepMS  float64 `json:"step_ms"`    // one decode step
	Same    float64 `json:"same_as_alone"`
	EOGSeen int     `json:"eog_seen"` // generated end-of-generation tokens (a server would have stopped)
}

// measureAll runs each N of the list after an untimed warm-up, comparing
// every sequence's tokens with those of one sequence alone.
func measureAll(b backend, prompt []int32, cfg config, enc *json.Encoder, notes io.Writer) error {
	if cfg.warmup {
		if _, _, err := measure(b, prompt, min(cfg.nps[0], 2), min(cfg.nGen, 8), cfg.nBatch, time.Now); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	// The reference: one sequence alone, as a server's request alone.
	ref, refToks, err := measure(b, prompt, 1, cfg.nGen, cfg.nBatch, time.Now)
	if err != nil {
		return err
	}
	for _, np := range cfg.nps {
		r, toks := ref, refToks
		if np != 1 {
			if r, toks, err = measure(b, prompt, np, cfg.nGen, cfg.nBatch, time.Now); err != nil {
				return fmt.Errorf("np %d: %w", np, err)
			}
		}
		r.Same = sameShare(toks, refToks[0])
		r.EOGSeen = countEOG(b, toks)
		fmt.Fprintf(notes, "np %3d: prefill %.3f s, decode %.1f tok/s (%.1f per sequence), %.0f%% as alone\n",
			np, r.PPSec, r.TGTPS, r.Stream, 100*r.Same)
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// measure prefills np sequences with prompt and decodes nGen tokens for
// each, returning the timings and every sequence's tokens.
func measure(b backend, prompt []int32, np, nGen, nBatch int, now func() time.Time) (result, [][]int32, error) {
	b.clear()
	t0 := now()
	next, err := prefill(b, prompt, np, nBatch)
	if err != nil {
		return result{}, nil, err
	}
	t1 := now()
	toks := make([][]int32, np)
	for s := range toks {
		toks[s] = append(make([]int32, 0, nGen), next[s])
	}
	for step := 1; step < nGen; step++ {
		for s := range np {
			b.batchAdd(next[s], len(prompt)+step-1, s, true)
		}
		if err := b.decode(); err != nil {
			return result{}, nil, fmt.Errorf("decode step %d: %w", step, err)
		}
		for s := range np {
			next[s] = b.argmax(s)
			toks[s] = append(toks[s], next[s])
		}
	}
	t2 := now()
	return timings(np, len(prompt), nGen, t1.Sub(t0), t2.Sub(t1)), toks, nil
}

// prefill evaluates np copies of prompt, sequence after sequence, in
// batches of at most nBatch tokens, and returns each sequence's first
// generated token (read right after the batch holding its last prompt
// token: a later decode overwrites the logits).
func prefill(b backend, prompt []int32, np, nBatch int) ([]int32, error) {
	next := make([]int32, np)
	type row struct{ seq, idx int }
	var pending []row
	flush := func() error {
		if err := b.decode(); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		for _, r := range pending {
			next[r.seq] = b.argmax(r.idx)
		}
		pending = pending[:0]
		return nil
	}
	for s := range np {
		for i, t := range prompt {
			if b.batchLen() == nBatch {
				if err := flush(); err != nil {
					return nil, err
				}
			}
			last := i == len(prompt)-1
			if last {
				pending = append(pending, row{s, b.batchLen()})
			}
			b.batchAdd(t, i, s, last)
		}
	}
	if b.batchLen() > 0 {
		if err := flush(); err != nil {
			return nil, err
		}
	}
	return next, nil
}

func timings(np, nPrompt, nGen int, pp, tg time.Duration) result {
	r := result{Kind: "result", NP: np, NPrompt: nPrompt, NGen: nGen, PPSec: pp.Seconds(), TGSec: tg.Seconds()}
	if r.PPSec > 0 {
		r.PPTPS = float64(np*nPrompt) / r.PPSec
	}
	if steps := nGen - 1; steps > 0 && r.TGSec > 0 {
		r.TGTPS = float64(np*steps) / r.TGSec
		r.Stream = float64(steps) / r.TGSec
		r.StepMS = 1000 * r.TGSec / float64(steps)
	}
	if total := r.PPSec + r.TGSec; total > 0 {
		r.E2ETPS = float64(np*nGen) / total
	}
	return r
}

// sameShare is the share of sequences whose tokens equal ref.
func sameShare(toks [][]int32, ref []int32) float64 {
	if len(toks) == 0 {
		return 0
	}
	n := 0
	for _, t := range toks {
		if slices.Equal(t, ref) {
			n++
		}
	}
	return float64(n) / float64(len(toks))
}

func countEOG(b backend, toks [][]int32) int {
	n := 0
	for _, seq := range toks {
		for _, t := range seq {
			if b.isEOG(t) {
				n++
			}
		}
	}
	return n
}
