package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
)

// server is one system under test while it runs: its completion endpoint,
// what it was started with, and its log.
type server interface {
	endpoint() *endpoint
	settings() []string // flags and environment, for the report
	logTail() string
	stop() error
}

// loadTimeout bounds a server's start with its model (2.4 GB onto a GPU,
// or Ollama copying the model into its store first).
const loadTimeout = 5 * time.Minute

// ours is hydra-engine with the llama plugin, started as the end-to-end
// tests and hydra-bench start engines (internal/enginetest), its OpenAI
// API on a free loopback port.
type ours struct {
	e       *enginetest.Engine
	args    []string
	ep      *endpoint
	logFile string
}

// engineLayout is what one of our engines holds: its slots, its KV cells
// (n_ctx, one cache all slots share), and its log's name in the work
// directory.
type engineLayout struct {
	slots, nCtx int
	log         string
	opts        []string // more backend options, after -ours-opt's
}

// mainLayout is the throughput measurement's engine: slots × each
// sequence's context.
func mainLayout(o options) engineLayout {
	return engineLayout{slots: o.slots, nCtx: o.slots * o.ctx, log: "ours.log"}
}

func startOurs(ctx context.Context, o options, ap api, l engineLayout) (*ours, error) {
	// Info: the plugin says at load which device it runs on and why (a
	// missing CUDA library is an info line); per request it logs nothing.
	args := []string{"--model", o.model, "--slots", strconv.Itoa(l.slots), "--log-level", o.oursLogLevel}
	for _, kv := range []string{
		"n_ctx=" + strconv.Itoa(l.nCtx),
		"n_threads=" + strconv.Itoa(o.threads), "n_threads_batch=" + strconv.Itoa(o.threads),
		"flash_attn=" + o.flashAttn, "n_gpu_layers=" + strconv.Itoa(o.ngl),
	} {
		args = append(args, "--backend-opt", kv)
	}
	for _, kv := range slices.Concat(specOurs(o), o.oursOpts, l.opts) {
		args = append(args, "--backend-opt", kv)
	}
	e, err := enginetest.Start(ctx, enginetest.Config{
		Bin: o.bin, Backend: o.plugin, Args: args, HTTP: true, WaitInfo: true,
		LogTail: 1 << 20, DieWithParent: true, StartTimeout: loadTimeout,
	})
	if err != nil {
		return nil, err
	}
	alias := strings.TrimSuffix(filepath.Base(o.model), ".gguf")
	return &ours{e: e, args: e.Args, logFile: filepath.Join(o.work, l.log),
		ep: &endpoint{base: "http://" + e.HTTP, model: alias, api: ap, http: newHTTPClient()}}, nil
}

func (s *ours) endpoint() *endpoint { return s.ep }

func (s *ours) settings() []string {
	return []string{"hydra-engine " + strings.Join(s.args, " ")}
}

func (s *ours) logTail() string { return tail(s.e.Logs.String(), 4000) }

func (s *ours) stop() error {
	err := s.e.Stop()
	_ = os.WriteFile(s.logFile, []byte(s.e.Logs.String()), 0o644)
	return err
}

// ollamaModel is the name the benchmark gives the model in Ollama's store.
const ollamaModel = "decode-bench"

// ollama is `ollama serve` with its store, home and logs in the work
// directory, its API on a free loopback port, the model created from the
// same GGUF file through a Modelfile.
type ollama struct {
	*proc
	env     []string
	ep      *endpoint
	created time.Duration // ollama create: hashing and copying the GGUF into the store
}

// ollamaEnv is the environment Ollama runs with: one loaded model,
// OLLAMA_NUM_PARALLEL sequences of OLLAMA_CONTEXT_LENGTH each (the
// runner's KV cache is their product, as ours), kept loaded, loopback only.
// OLLAMA_NEW_ENGINE decides the runner of a llama-architecture model:
// unset, llama.cpp's (runner/llamarunner, the same llama.cpp as ours).
func ollamaEnv(o options, addr string) []string {
	env := []string{
		"OLLAMA_HOST=" + addr,
		"OLLAMA_MODELS=" + filepath.Join(o.work, "ollama-models"),
		"HOME=" + filepath.Join(o.work, "ollama-home"), // its keys and history stay out of the real home
		"OLLAMA_NUM_PARALLEL=" + strconv.Itoa(o.slots),
		"OLLAMA_CONTEXT_LENGTH=" + strconv.Itoa(o.ctx),
		"OLLAMA_MAX_LOADED_MODELS=1",
		"OLLAMA_KEEP_ALIVE=24h",
		"OLLAMA_LOAD_TIMEOUT=10m",
		"OLLAMA_NOPRUNE=1",
	}
	switch o.flashAttn {
	case "on":
		env = append(env, "OLLAMA_FLASH_ATTENTION=1")
	case "off":
		env = append(env, "OLLAMA_FLASH_ATTENTION=0")
	}
	if o.ollamaEngine {
		env = append(env, "OLLAMA_NEW_ENGINE=1")
	}
	return env
}

// inheritedEnv is the part of this process's environment Ollama keeps:
// PATH, library paths, CUDA's and OLLAMA_LIBRARY_PATH; not OLLAMA_*
// settings of the user's own server.
func inheritedEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "LD_LIBRARY_PATH", k == "TMPDIR", k == "OLLAMA_LIBRARY_PATH",
			strings.HasPrefix(k, "CUDA_"), strings.HasPrefix(k, "NVIDIA_"), strings.HasPrefix(k, "GGML_"):
			env = append(env, kv)
		}
	}
	return env
}

func startOllama(ctx context.Context, o options, ap api) (*ollama, error) {
	port, err := enginetest.FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	s := &ollama{env: ollamaEnv(o, addr)}
	for _, d := range []string{"ollama-models", "ollama-home"} {
		if err := os.MkdirAll(filepath.Join(o.work, d), 0o755); err != nil {
			return nil, err
		}
	}
	// Its process group holds the runner child too.
	if s.proc, err = startProc("ollama", o.ollama, []string{"serve"}, append(inheritedEnv(), s.env...), filepath.Join(o.work, "ollama.log")); err != nil {
		return nil, err
	}
	s.ep = &endpoint{base: "http://" + addr, model: ollamaModel, api: ap, http: newHTTPClient()}
	if err := s.waitServing(ctx); err != nil {
		_ = s.stop()
		return nil, err
	}
	if err := s.create(ctx, o); err != nil {
		_ = s.stop()
		return nil, err
	}
	return s, nil
}

// waitServing polls GET / until Ollama answers.
func (s *ollama) waitServing(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.ep.base+"/", nil)
		if resp, err := s.ep.http.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("ollama serve exited during start:\n%s", s.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ollama serve not answering after a minute:\n%s", s.logTail())
		}
	}
}

// create makes the model from the GGUF file with a Modelfile: every
// sequence's context, the threads, repeat_penalty 1 (greedy, as the
// others), and the GPU layers when limited.
func (s *ollama) create(ctx context.Context, o options) error {
	mf := []string{"FROM " + o.model,
		"PARAMETER num_ctx " + strconv.Itoa(o.ctx),
		"PARAMETER num_thread " + strconv.Itoa(o.threads),
		"PARAMETER repeat_penalty 1",
		"PARAMETER temperature 0",
	}
	if o.ngl >= 0 {
		mf = append(mf, "PARAMETER num_gpu "+strconv.Itoa(o.ngl))
	}
	path := filepath.Join(o.work, "Modelfile")
	if err := os.WriteFile(path, []byte(strings.Join(mf, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, o.ollama, "create", ollamaModel, "-f", path)
	cmd.Env = append(inheritedEnv(), s.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ollama create: %w\n%s", err, tail(string(out), 2000))
	}
	s.created = time.Since(start)
	return nil
}

func (s *ollama) endpoint() *endpoint { return s.ep }

func (s *ollama) settings() []string {
	return []string{"ollama serve with " + strings.Join(s.env, " "),
		fmt.Sprintf("ollama create %s -f Modelfile (%.1f s: hashing and copying the GGUF into OLLAMA_MODELS)", ollamaModel, s.created.Seconds())}
}

func (s *ollama) logTail() string {
	b, _ := os.ReadFile(s.logFile)
	return tail(string(b), 4000)
}

// stop sends SIGTERM to Ollama's process group (serve and its runner),
// SIGKILL after 15 s.

// runnerRe finds the runner Ollama started: "starting runner"
// cmd="… runner [--ollama-engine] --model …".
var runnerRe = regexp.MustCompile(`starting runner.*cmd="([^"]*)"`)

// ollamaRunner names the runner that served the model in Ollama's log:
// llamarunner (llama.cpp, cgo) or ollamarunner (Ollama's Go engine,
// --ollama-engine). The runners started without --model only discover
// GPUs.
func ollamaRunner(log string) string {
	last := ""
	for _, m := range runnerRe.FindAllStringSubmatch(log, -1) {
		if strings.Contains(m[1], "--model") {
			last = m[1]
		}
	}
	if last == "" {
		return "unknown (no \"starting runner\" line with --model in its log)"
	}
	if strings.Contains(last, "--ollama-engine") {
		return "ollamarunner (Ollama's Go engine, --ollama-engine)"
	}
	return "llamarunner (llama.cpp through cgo, the same source as ours)"
}

// oursFacts are the lines of our engine's log that say how the plugin ran
// the model: its device, or why it runs on the CPU.
func oursFacts(log string) []string {
	facts := logFacts(log, "cuda-llama backend loaded", "CUDA backend loaded", "running on CPU", "CUDA backend sees no GPU", "not loading the CUDA backend")
	if f := specRuleFact(log); f != "" {
		facts = append(facts, f)
	}
	return facts
}

// specRuleFact is the line on ours' speculative rule: how often it stopped
// and resumed drafting over the run, and its last decision's line (the
// expected tokens a second with and without drafts); "" where it decided
// nothing (no drafts, or draft_rule=always).
func specRuleFact(log string) string {
	const stopped, drafts = "speculative decoding stopped", "speculative decoding drafts"
	var nStop, nDraft int
	var last string
	for l := range strings.Lines(log) {
		switch {
		case strings.Contains(l, stopped):
			nStop++
		case strings.Contains(l, drafts):
			nDraft++
		default:
			continue
		}
		last = strings.TrimSpace(l)
	}
	if last == "" {
		return ""
	}
	if len(last) > 700 {
		last = last[:700] + "…"
	}
	return fmt.Sprintf("speculative rule: stopped %d times, resumed %d times; last: %s", nStop, nDraft, last)
}

// logFacts is the first line of log holding each key, in log order, each at
// most 700 bytes.
func logFacts(log string, keys ...string) []string {
	var out []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		for _, key := range keys {
			if strings.Contains(l, key) && !seen[key] {
				seen[key] = true
				if len(l) > 700 {
					l = l[:700] + "…"
				}
				out = append(out, l)
			}
		}
	}
	return out
}

// ollamaFacts are the lines of Ollama's log that say how it ran the model:
// offloaded layers, the context and KV cache it made, flash attention.
func ollamaFacts(log string) []string {
	return logFacts(log, "offloaded ", "llama_context: n_ctx ", "llama_context: n_seq_max", "llama_context: flash_attn",
		"llama_kv_cache: size", "load_backend:", "inference compute")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
