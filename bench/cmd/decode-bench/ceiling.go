package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ceilingSetup and ceilingResult are llama-batched's "setup" and "result"
// lines (bench/cmd/llama-batched).
type ceilingSetup struct {
	ModelDesc  string `json:"model_desc"`
	ModelBytes uint64 `json:"model_bytes"`
	NParams    uint64 `json:"n_params"`
	Device     string `json:"device"`
	NGPULayers int    `json:"n_gpu_layers"`
	NCtx       int    `json:"n_ctx"`
	NSeqMax    int    `json:"n_seq_max"`
	Threads    int    `json:"threads"`
	FlashAttn  string `json:"flash_attn"`
	KVUnified  bool   `json:"kv_unified"`
	NPrompt    int    `json:"n_prompt"`
	NGen       int    `json:"n_gen"`
	Llama      string `json:"llama"`
	System     string `json:"system"`
}

type ceilingResult struct {
	NP      int     `json:"np"`
	PPSec   float64 `json:"pp_s"`
	TGSec   float64 `json:"tg_s"`
	PPTPS   float64 `json:"pp_tps"`
	TGTPS   float64 `json:"tg_tps"`
	Stream  float64 `json:"stream_tps"`
	E2ETPS  float64 `json:"e2e_tps"`
	StepMS  float64 `json:"step_ms"`
	Same    float64 `json:"same_as_alone"`
	EOGSeen int     `json:"eog_seen"`
}

// ceilingRun is one llama-batched run: every N of the concurrency list with
// one KV layout.
type ceilingRun struct {
	Label   string          `json:"label"`
	Args    []string        `json:"args"`
	Setup   ceilingSetup    `json:"setup"`
	Results []ceilingResult `json:"results"`
}

// byNP is the result for n sequences, if measured.
func (c *ceilingRun) byNP(n int) (ceilingResult, bool) {
	for _, r := range c.Results {
		if r.NP == n {
			return r, true
		}
	}
	return ceilingResult{}, false
}

// runCeiling runs llama-batched on the prompt's text with every
// concurrency as N, each sequence generating n tokens.
func runCeiling(ctx context.Context, o options, p prompt, unified bool) (*ceilingRun, error) {
	pf := filepath.Join(o.work, "ceiling-prompt.txt")
	if err := os.WriteFile(pf, []byte(p.Text), 0o644); err != nil {
		return nil, err
	}
	label := "ceiling"
	if !unified {
		label = "ceiling, KV per sequence"
	}
	// As much KV as the servers hold (slots × ctx), or as the largest N
	// needs to give each sequence ctx cells when the cache is split.
	nCtx := max(o.slots, slices.Max(o.conc)) * o.ctx
	args := []string{"-m", o.model, "-np", joinInts(o.conc), "-n", strconv.Itoa(o.n), "-c", strconv.Itoa(nCtx), "-prompt-file", pf,
		"-t", strconv.Itoa(o.threads), "-fa", o.flashAttn, "-ngl", strconv.Itoa(o.ngl),
		"-kvu=" + strconv.FormatBool(unified)}
	cmd := exec.CommandContext(ctx, o.llamaBatched, args...)
	logName := "ceiling.log"
	if !unified {
		logName = "ceiling-split.log"
	}
	logf, err := os.Create(filepath.Join(o.work, logName))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(logf, prefixWriter{os.Stderr, "  llama-batched: "})
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("%s: %w\n%s", o.llamaBatched, err, tail(string(b), 4000))
	}
	run, err := parseCeiling(&out)
	if err != nil {
		return nil, err
	}
	run.Label, run.Args = label, append([]string{filepath.Base(o.llamaBatched)}, args...)
	return run, nil
}

// parseCeiling reads llama-batched's JSON lines.
func parseCeiling(r io.Reader) (*ceilingRun, error) {
	run := &ceilingRun{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	setup := false
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var kind struct {
			Kind string `json:"kind"`
		}
		if err := json.Unmarshal(line, &kind); err != nil {
			return nil, fmt.Errorf("llama-batched: bad line %.200q: %w", line, err)
		}
		switch kind.Kind {
		case "setup":
			if err := json.Unmarshal(line, &run.Setup); err != nil {
				return nil, err
			}
			setup = true
		case "result":
			var res ceilingResult
			if err := json.Unmarshal(line, &res); err != nil {
				return nil, err
			}
			run.Results = append(run.Results, res)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !setup || len(run.Results) == 0 {
		return nil, fmt.Errorf("llama-batched printed no setup or no result lines")
	}
	return run, nil
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// prefixWriter writes each line with a prefix (a child's notes on stderr).
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			if _, err := io.WriteString(p.w, p.prefix+line); err != nil {
				return 0, err
			}
		}
	}
	return len(b), nil
}
