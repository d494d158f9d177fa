// Command decode-bench measures decode throughput at 1–32 concurrent
// streams, side by side in one run: ours (hydra-engine with the llama
// plugin, over its OpenAI HTTP API), Ollama (bin/ollama, built from the
// module version the product pins, so the same llama.cpp) on the same GGUF
// file, and the ceiling, llama.cpp's own batched decode with no server
// (bin/llama-batched). It writes docs/benchmarks/decode-MACHINE.md and its
// chart (`make bench-decode` at the repository's root; on the H200,
// bench/scripts/gpu-decode.sh).
//
//	decode-bench -model m.gguf [-c 1,2,4,8,16,32] [-n 128] [-p 512] [-slots 4] [-ctx 4096] [-out docs/benchmarks]
//	             [-state-get-bytes 1200000000 -state-get-c 8 -state-get-reps 2]
//
// Each system runs alone while measured (never two models loaded at once):
// the driver starts ours (internal/enginetest, as the end-to-end tests do),
// measures, stops it, then Ollama (`ollama serve` on a free loopback port,
// its store and home in a work directory), then llama-batched. Logs stay in
// the work directory and are printed when something fails. With
// -state-get-bytes, ours is also measured decoding beside a loop of
// STATE_GETs of a slot holding that much state (stateget.go), in an engine
// of its own.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// options is the command line.
type options struct {
	bin, plugin, ollama, llamaBatched, model string
	llamaServer                              string
	systems                                  []string
	conc                                     []int
	n, p, slots, ctx, threads, ngl           int
	flashAttn                                string
	reps, joins, prefixReps, prefixTokens    int
	apiKind                                  string // raw or chat
	banBytes                                 bool   // -ban-bytes
	ceilingKV                                string // unified, split or both
	ollamaEngine                             bool
	out, name, raw, work                     string
	keep                                     bool
	stateBytes                               int64 // 0: no state-transfer measurement
	stateC, stateN, stateReps                int
	statePut                                 bool     // the state loop puts slot 0's state back instead of getting it
	oursOpts                                 []string // more --backend-opt KEY=VALUE for ours
	oursLogLevel                             string
	// Speculative decoding, the same for ours and llama-server (spec.go).
	draftModel, draftPMin, specType string
	draftMax, draftMin              int
	// The prompt cache measurement (promptcache.go): the prefix's tokens
	// (0: not measured), rounds, cache_ram, the other prompt's tokens.
	cacheTokens, cacheReps, cacheRAM, cacheOther int
	// The context checkpoint measurement (checkpoints.go): A's tokens at
	// each size (none: not measured), reps.
	ckptTokens []int
	ckptReps   int
	// The agent measurement (agent.go): the system prompt's tokens, the
	// conversation's turns, its reps.
	agentTokens           []int
	agentTurns, agentReps int
}

var allSystems = []string{"ours", "llama-server", "ollama", "ceiling"}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "decode-bench:", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "decode-bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, errOut io.Writer) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("decode-bench", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.StringVar(&o.bin, "bin", "bin", "directory of hydra-engine (and the defaults below)")
	fs.StringVar(&o.plugin, "plugin", "", "llama plugin executable (default BIN/hydra-plugin-cuda-llama)")
	fs.StringVar(&o.ollama, "ollama", "", "ollama executable (default BIN/ollama)")
	fs.StringVar(&o.llamaBatched, "llama-batched", "", "llama-batched executable (default BIN/llama-batched)")
	fs.StringVar(&o.llamaServer, "llama-server", "", "llama-server executable, built from the plugin's llama.cpp tree (default BIN/llama-server/llama-server: make llama-server)")
	fs.StringVar(&o.model, "model", "", "GGUF model, the same file for every system (required)")
	fs.StringVar(&o.draftModel, "draft-model", "", "speculative decoding with this draft GGUF: ours draft_model, llama-server -md (a run without it is the baseline)")
	fs.IntVar(&o.draftMax, "draft-max", 0, "with -draft-model: ours draft_max, llama-server --spec-draft-n-max (0: each one's default, 3)")
	fs.IntVar(&o.draftMin, "draft-min", -1, "with -draft-model: ours draft_min, llama-server --spec-draft-n-min (-1: each one's default)")
	fs.StringVar(&o.draftPMin, "draft-p-min", "", "with -draft-model: ours draft_p_min, llama-server --spec-draft-p-min (\"\": each one's default)")
	fs.StringVar(&o.specType, "spec-type", "", "ours spec_type, llama-server --spec-type (e.g. ngram-simple: drafting without a model; \"\": draft-simple with -draft-model)")
	oursOpts := fs.String("ours-opt", "", "more backend options for ours, KEY=VALUE[,KEY=VALUE…] (an A/B of a plugin option)")
	fs.StringVar(&o.oursLogLevel, "ours-log-level", "info", "ours --log-level (trace: the llama plugin logs every batch step; its log is WORK/ours.log)")
	systems := fs.String("systems", strings.Join(allSystems, ","), "systems to measure, in this order: ours, llama-server, ollama, ceiling")
	conc := fs.String("c", "1,2,4,8,16,32", "concurrencies: requests started at once")
	fs.IntVar(&o.n, "n", 128, "tokens each request generates")
	fs.IntVar(&o.p, "p", 512, "prompt tokens, about")
	fs.IntVar(&o.slots, "slots", 4, "sequences each server holds at once: ours --slots, Ollama OLLAMA_NUM_PARALLEL")
	fs.IntVar(&o.ctx, "ctx", 4096, "context of each sequence: Ollama num_ctx; ours n_ctx = slots × ctx, one unified cache")
	fs.IntVar(&o.threads, "threads", min(runtime.NumCPU(), 16), "CPU threads of every system")
	fs.IntVar(&o.ngl, "ngl", -1, "layers on the GPU (-1: all; ignored without one)")
	fs.StringVar(&o.flashAttn, "fa", "on", "flash attention of every system: on, off or auto")
	fs.IntVar(&o.reps, "reps", 1, "rounds at each concurrency")
	fs.IntVar(&o.joins, "joins", 3, "joining requests at each concurrency (0: no join measurement)")
	fs.IntVar(&o.prefixReps, "prefix-reps", 2, "A/B pairs of the shared-prefix measurement (0: none)")
	fs.IntVar(&o.prefixTokens, "prefix-tokens", 2000, "request A's prompt tokens, about")
	fs.BoolVar(&o.banBytes, "ban-bytes", true, "ours and llama-server: ban gguf-gen's byte tokens 0x80–0xFF (logit_bias), whose invalid UTF-8 fails llama-server's streams; false for a model with another vocabulary")
	fs.StringVar(&o.apiKind, "api", "raw", "raw: ours /v1/completions with token ids, Ollama /api/generate raw; chat: /v1/chat/completions on both")
	fs.StringVar(&o.ceilingKV, "ceiling-kv", "unified", "the ceiling's KV cache: unified (one stream, as our plugin), split (one per sequence, as Ollama's llamarunner) or both")
	fs.BoolVar(&o.ollamaEngine, "ollama-engine", false, "OLLAMA_NEW_ENGINE=1: Ollama's Go engine instead of its llama.cpp runner")
	fs.StringVar(&o.out, "out", "docs/benchmarks", "directory of the page and chart")
	fs.StringVar(&o.name, "name", "", "base name of the page and chart (default decode-MACHINE: the GPU's model, else cpu)")
	fs.StringVar(&o.raw, "raw", "", "also write every request's measurements to this JSON file")
	fs.StringVar(&o.work, "work", "", "work directory for logs, prompts and Ollama's store (default a new temporary one, removed after a clean run)")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory")
	fs.Int64Var(&o.stateBytes, "state-get-bytes", 0, "ours: decode beside STATE_GETs of a slot 0 holding about this many bytes of KV state (0: not measured)")
	fs.IntVar(&o.stateC, "state-get-c", 8, "the state measurement's engine slots: slot 0 and c-1 streams")
	fs.BoolVar(&o.statePut, "state-put", false, "the state measurement's loop STATE_PUTs slot 0's state (one STATE_GET's bytes, held in memory) back into it instead of getting it")
	fs.IntVar(&o.stateN, "state-get-n", 0, "tokens each stream of the state measurement generates (0: -n)")
	fs.IntVar(&o.stateReps, "state-get-reps", 2, "pairs of rounds (one without, one with the STATE_GET loop) of the state measurement")
	fs.IntVar(&o.cacheTokens, "prompt-cache-tokens", 0, "ours: TTFT of a request whose prefix of about this many tokens left its one slot, with the host-memory prompt cache and without (0: not measured; with -systems \"\", only this)")
	fs.IntVar(&o.cacheReps, "prompt-cache-reps", 3, "rounds of the prompt cache measurement on each engine, after a warm-up round")
	fs.IntVar(&o.cacheRAM, "prompt-cache-ram", 8192, "the prompt cache measurement's cache_ram, MiB")
	fs.IntVar(&o.cacheOther, "prompt-cache-other", 512, "tokens of the prompt that takes the prefix's slot")
	ckpt := fs.String("checkpoint-tokens", "", "ours and llama-server: prompt tokens evaluated and time when a prompt parts from a one-slot sequence of about these many tokens (A + 64, A again, A cut 200 + 64), e.g. 32768,131072 (\"\": not measured; with -systems \"\", only this)")
	fs.IntVar(&o.ckptReps, "checkpoint-reps", 2, "rounds of the checkpoint measurement's cases")
	agent := fs.String("agent-tokens", "", "ours and llama-server: each turn's prompt tokens evaluated and time to first token in an agent's conversation on /v1/chat/completions whose system prompt is about these many tokens, e.g. 32768,131072; the model needs a chat template (\"\": not measured; with -systems \"\", only this)")
	fs.IntVar(&o.agentTurns, "agent-turns", 9, "the agent conversation's turns")
	fs.IntVar(&o.agentReps, "agent-reps", 2, "conversations played on each server")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *ckpt != "" {
		var err error
		if o.ckptTokens, err = parseInts(*ckpt, maxPromptTokens); err != nil {
			return o, fmt.Errorf("-checkpoint-tokens: %w", err)
		}
	}
	if *agent != "" {
		var err error
		if o.agentTokens, err = parseInts(*agent, maxPromptTokens); err != nil {
			return o, fmt.Errorf("-agent-tokens: %w", err)
		}
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.conc, err = parseInts(*conc, 255); err != nil {
		return o, fmt.Errorf("-c: %w", err)
	}
	o.systems = splitList(*systems)
	if *oursOpts != "" {
		for _, kv := range strings.Split(*oursOpts, ",") {
			if !strings.Contains(kv, "=") {
				return o, fmt.Errorf("-ours-opt: %q is not KEY=VALUE", kv)
			}
			o.oursOpts = append(o.oursOpts, strings.TrimSpace(kv))
		}
	}
	o.setDefaults()
	return o, o.validate()
}

func (o *options) setDefaults() {
	if o.plugin == "" {
		o.plugin = filepath.Join(o.bin, "hydra-plugin-cuda-llama")
	}
	if o.ollama == "" {
		o.ollama = filepath.Join(o.bin, "ollama")
	}
	if o.llamaServer == "" {
		o.llamaServer = filepath.Join(o.bin, "llama-server", "llama-server")
	}
	if o.llamaBatched == "" {
		o.llamaBatched = filepath.Join(o.bin, "llama-batched")
	}
	if o.stateN == 0 {
		o.stateN = o.n
	}
	// Absolute: Ollama's Modelfile takes a bare name for a model to pull,
	// and the servers run from other directories.
	for _, p := range []*string{&o.bin, &o.plugin, &o.ollama, &o.llamaServer, &o.llamaBatched, &o.model, &o.draftModel} {
		if abs, err := filepath.Abs(*p); err == nil && *p != "" {
			*p = abs
		}
	}
}

func (o options) validate() error {
	switch {
	case o.model == "":
		return errors.New("-model is required")
	case o.n < 2:
		return fmt.Errorf("-n %d: at least 2 tokens (a decode rate needs two)", o.n)
	case o.p < 2 || o.slots < 1 || o.threads < 1 || o.reps < 1 || o.joins < 0 || o.prefixReps < 0:
		return errors.New("-p, -slots, -threads and -reps must be positive, -joins and -prefix-reps not negative")
	case o.p+o.n+8 > o.ctx:
		return fmt.Errorf("-ctx %d is too small for a prompt of %d and %d tokens", o.ctx, o.p, o.n)
	case o.prefixReps > 0 && o.prefixTokens+64 > o.ctx:
		return fmt.Errorf("-ctx %d is too small for the shared-prefix prompt of %d tokens", o.ctx, o.prefixTokens)
	case !slices.Contains([]string{"raw", "chat"}, o.apiKind):
		return fmt.Errorf("-api %q: raw or chat", o.apiKind)
	case !slices.Contains([]string{"unified", "split", "both"}, o.ceilingKV):
		return fmt.Errorf("-ceiling-kv %q: unified, split or both", o.ceilingKV)
	case !slices.Contains([]string{"on", "off", "auto"}, o.flashAttn):
		return fmt.Errorf("-fa %q: on, off or auto", o.flashAttn)
	}
	for _, s := range o.systems {
		if !slices.Contains(allSystems, s) {
			return fmt.Errorf("-systems: %q is not one of %v", s, allSystems)
		}
	}
	if len(o.systems) == 0 && o.cacheTokens == 0 && len(o.ckptTokens) == 0 && len(o.agentTokens) == 0 {
		return errors.New("-systems: none")
	}
	for _, n := range o.ckptTokens {
		if n < ckptCut+2*ckptMore || o.ckptReps < 1 {
			return fmt.Errorf("-checkpoint-tokens %d: at least %d, with -checkpoint-reps at least 1", n, ckptCut+2*ckptMore)
		}
	}
	for _, n := range o.agentTokens {
		if n < 64 || o.agentTurns < 1 || o.agentReps < 1 {
			return fmt.Errorf("-agent-tokens %d: at least 64, with -agent-turns and -agent-reps at least 1", n)
		}
	}
	if err := o.validateCache(); err != nil {
		return err
	}
	return o.validateState()
}

// validateState checks the state measurement's flags when it is on.
func (o options) validateState() error {
	switch {
	case o.stateBytes < 0:
		return fmt.Errorf("-state-get-bytes %d: not negative", o.stateBytes)
	case o.stateBytes == 0:
		return nil
	case !o.has("ours"):
		return errors.New("-state-get-bytes measures ours: -systems must include ours")
	case o.stateC < 2 || o.stateC > 255:
		return fmt.Errorf("-state-get-c %d: slot 0 and at least one stream, at most 255 slots", o.stateC)
	case o.stateN < 2:
		return fmt.Errorf("-state-get-n %d: at least 2 tokens", o.stateN)
	case o.stateReps < 1:
		return fmt.Errorf("-state-get-reps %d: at least 1", o.stateReps)
	}
	return nil
}

// validateCache checks the prompt cache measurement's flags when it is on.
func (o options) validateCache() error {
	switch {
	case o.cacheTokens < 0:
		return fmt.Errorf("-prompt-cache-tokens %d: not negative", o.cacheTokens)
	case o.cacheTokens == 0:
		return nil
	case o.cacheTokens < 2*cacheSuffix:
		return fmt.Errorf("-prompt-cache-tokens %d: at least %d", o.cacheTokens, 2*cacheSuffix)
	case o.cacheReps < 1:
		return fmt.Errorf("-prompt-cache-reps %d: at least 1", o.cacheReps)
	case o.cacheRAM < 1:
		return fmt.Errorf("-prompt-cache-ram %d: at least 1 MiB", o.cacheRAM)
	case o.cacheOther < 2 || o.cacheOther > o.cacheTokens:
		return fmt.Errorf("-prompt-cache-other %d: between 2 and -prompt-cache-tokens", o.cacheOther)
	}
	return nil
}

func (o options) has(system string) bool { return slices.Contains(o.systems, system) }

// parseInts reads "1,2,4": positive, ascending-or-not, no repeats.
// maxPromptTokens bounds the prompt sizes a measurement takes: llama.cpp's
// contexts of the models measured end well below it.
const maxPromptTokens = 1 << 20

// parseInts reads a list of distinct counts in [1, most].
func parseInts(s string, most int) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > most {
			return nil, fmt.Errorf("%q is not a count in [1, %d]", f, most)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("%d twice", n)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// run measures every system, one after another, and writes the page. A
// system that fails is reported as failed and the others still run.
func run(ctx context.Context, o options) (err error) {
	if err := o.checkFiles(); err != nil {
		return err
	}
	if o.work, err = workDir(o.work); err != nil {
		return err
	}
	failed := false
	defer func() {
		if failed || o.keep {
			logf("work directory (logs, prompts, Ollama's store): %s", o.work)
			return
		}
		os.RemoveAll(o.work)
	}()
	start := time.Now()
	mach := probeMachine(ctx)
	if o.name == "" {
		o.name = "decode-" + mach.tag()
		if len(o.systems) == 0 && o.cacheTokens > 0 {
			o.name = "prompt-cache-" + mach.tag()
		} else if len(o.systems) == 0 && len(o.ckptTokens) == 0 {
			o.name = "agent-" + mach.tag()
		} else if len(o.systems) == 0 {
			o.name = "checkpoints-" + mach.tag()
		}
	}
	logf("decode-bench: %s, %s; prompts…", mach.CPU, mach.GPUName())
	pl, err := makePlan(ctx, o)
	if err != nil {
		failed = true
		return err
	}
	rep := &report{Opts: o, Mach: mach, Date: start, Plan: pl, Errors: map[string]string{}}
	rep.Binaries = describeBinaries(o)
	if o.has("ours") {
		rep.Ours = measureSystem(ctx, o, "ours", pl, rep)
	}
	if o.stateBytes > 0 {
		rep.StateGet = measureStateGet(ctx, o, pl, rep)
	}
	if o.cacheTokens > 0 {
		rep.PromptCache = measurePromptCache(ctx, o, pl, rep)
	}
	if len(o.ckptTokens) > 0 {
		rep.Checkpoints = measureCheckpoints(ctx, o, rep)
	}
	if len(o.agentTokens) > 0 {
		rep.Agent = measureAgent(ctx, o, rep)
	}
	if o.has("llama-server") {
		rep.LlamaServer = measureSystem(ctx, o, "llama-server", pl, rep)
	}
	if o.has("ollama") {
		rep.Ollama = measureSystem(ctx, o, "ollama", pl, rep)
	}
	if o.has("ceiling") {
		rep.Ceilings = measureCeilings(ctx, o, pl, rep)
	}
	rep.Elapsed = time.Since(start)
	failed = len(rep.Errors) > 0
	if err := rep.write(); err != nil {
		failed = true
		return err
	}
	if failed {
		return fmt.Errorf("failed: %s", strings.Join(sortedKeys(rep.Errors), ", "))
	}
	return ctx.Err()
}

func (o options) checkFiles() error {
	need := map[string]string{"model": o.model, "llama-batched (it tokenizes the prompts)": o.llamaBatched}
	if o.has("ours") || o.cacheTokens > 0 {
		need["hydra-engine"] = filepath.Join(o.bin, "hydra-engine")
		need["llama plugin"] = o.plugin
	}
	if o.has("ollama") {
		need["ollama"] = o.ollama
	}
	if o.has("llama-server") {
		need["llama-server"] = o.llamaServer
	}
	for _, what := range sortedKeys(need) {
		if _, err := os.Stat(need[what]); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

func workDir(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "decode-bench-")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return abs, os.MkdirAll(abs, 0o755)
}

// flushTokens is the length of the prompts that fill every slot before a
// round's reference: any prompt that differs from the first token after BOS
// takes a slot's place in a prompt cache.
const flushTokens = 32

// makePlan makes and tokenizes every prompt of the run, each of its own
// seed.
func makePlan(ctx context.Context, o options) (plan, error) {
	tk := tokenizer{bin: o.llamaBatched, model: o.model, dir: o.work}
	next := 1
	take := func(seeds *[]int, n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = next
			next++
		}
		*seeds = append(*seeds, s...)
		return s
	}
	var long, short []int
	warm := take(&long, 1)
	rounds, flush := map[int][]int{}, map[int][][]int{}
	for _, c := range o.conc {
		rounds[c] = take(&long, o.reps)
		for range o.reps {
			flush[c] = append(flush[c], take(&short, o.slots))
		}
	}
	alone, bg := take(&long, o.joins), take(&long, 1)
	joins := map[int][]int{}
	for _, c := range o.conc {
		if c >= 2 && c <= o.slots && o.joins > 0 {
			joins[c] = take(&long, o.joins)
		}
	}
	// The state measurement's: a warm-up, then a fresh prompt each round.
	var state []int
	if o.stateBytes > 0 {
		state = take(&long, 1+2*o.stateReps)
	}
	byseed := map[int]prompt{}
	for _, g := range []struct {
		seeds []int
		n     int
	}{{long, o.p}, {short, flushTokens}} {
		ps, err := tk.prompts(ctx, g.seeds, g.n)
		if err != nil {
			return plan{}, err
		}
		for i, s := range g.seeds {
			byseed[s] = ps[i]
		}
	}
	pick := func(ss []int) []prompt {
		out := make([]prompt, len(ss))
		for i, s := range ss {
			out[i] = byseed[s]
		}
		return out
	}
	pl := plan{warm: byseed[warm[0]], rounds: map[int][]prompt{}, flush: map[int][][]prompt{},
		alone: pick(alone), joinBG: byseed[bg[0]], joins: map[int][]prompt{}}
	for _, c := range o.conc {
		pl.rounds[c] = pick(rounds[c])
		for _, f := range flush[c] {
			pl.flush[c] = append(pl.flush[c], pick(f))
		}
		if js, ok := joins[c]; ok {
			pl.joins[c] = pick(js)
		}
	}
	if len(state) > 0 {
		pl.stateWarm, pl.state = byseed[state[0]], pick(state[1:])
	}
	if o.cacheTokens > 0 {
		var err error
		if pl.cache, err = cachePlan(ctx, tk, o); err != nil {
			return plan{}, err
		}
	}
	if o.prefixReps > 0 {
		prefSeeds := make([]int, o.prefixReps)
		for i := range prefSeeds {
			prefSeeds[i] = 100000 + i
		}
		var err error
		if pl.prefA, err = tk.prompts(ctx, prefSeeds, o.prefixTokens); err != nil {
			return plan{}, err
		}
		if pl.prefB, err = tk.extend(ctx, pl.prefA, 200000, 6); err != nil {
			return plan{}, err
		}
	}
	return pl, nil
}

// measureSystem starts one server, runs the plan on it and stops it; a
// failure is recorded in the report with the server's log.
func measureSystem(ctx context.Context, o options, name string, pl plan, rep *report) *systemRun {
	ap := oursRaw
	switch {
	case o.apiKind == "chat":
		ap = openAIChat
	case name == "ollama":
		ap = ollamaRaw
	}
	if o.banBytes && name != "ollama" {
		ap = withByteBias(ap)
	}
	r := &systemRun{Name: name, API: ap.name}
	logf("%s: starting", name)
	var srv server
	var err error
	switch name {
	case "ours":
		srv, err = startOurs(ctx, o, ap, mainLayout(o))
	case "llama-server":
		srv, err = startLlamaServer(ctx, o, ap)
	default:
		srv, err = startOllama(ctx, o, ap)
	}
	if err != nil {
		rep.fail(name, err, "")
		return nil
	}
	r.Settings = srv.settings()
	err = measureServer(ctx, o, srv.endpoint(), pl, name == "ours", r)
	logs := srv.logTail()
	if us, ok := srv.(*ours); ok {
		r.Facts = oursFacts(us.e.Logs.String())
	}
	if ls, ok := srv.(*llamaServer); ok {
		r.Facts = llamaServerFacts(ls.logText())
	}
	if name == "ollama" {
		if b, rerr := os.ReadFile(filepath.Join(o.work, "ollama.log")); rerr == nil {
			r.Runner, r.Facts = ollamaRunner(string(b)), ollamaFacts(string(b))
		}
		logf("  ollama ran %s", r.Runner)
	}
	if f := r.draftFact(); f != "" {
		r.Facts = append(r.Facts, f)
	}
	r.Facts = append(r.Facts, r.ruleFacts()...)
	if serr := srv.stop(); serr != nil && err == nil && ctx.Err() == nil {
		err = fmt.Errorf("stopping: %w", serr)
	}
	if err != nil {
		rep.fail(name, err, logs)
	}
	return r
}

// measureCeilings runs llama-batched with each KV layout asked for.
func measureCeilings(ctx context.Context, o options, pl plan, rep *report) []*ceilingRun {
	var layouts []bool
	switch o.ceilingKV {
	case "unified":
		layouts = []bool{true}
	case "split":
		layouts = []bool{false}
	default:
		layouts = []bool{true, false}
	}
	var out []*ceilingRun
	for _, unified := range layouts {
		logf("ceiling: llama-batched, kv_unified=%v", unified)
		run, err := runCeiling(ctx, o, pl.rounds[o.conc[0]][0], unified)
		if err != nil {
			rep.fail("ceiling", err, "")
			continue
		}
		out = append(out, run)
	}
	return out
}

// writeRaw writes every measurement as JSON.
func writeRaw(path string, v any) error {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
