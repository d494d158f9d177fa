// Command llama-batched is the ceiling of decode-bench: llama.cpp's own
// batched decode through its C API, no server in between. Like llama.cpp's
// llama-batched-bench it loads a model, prefills N sequences with the same
// prompt tokens, then decodes T tokens for all N with one llama_batch per
// step (greedy: the argmax of each row's logits, EOS ignored), for each N of
// a list:
//
//	llama-batched -m model.gguf -np 1,2,4,8,16,32 -n 128 -p 512 [-ngl -1] [-c 0] [-t 8] [-fa on] [-kvu]
//	llama-batched -m model.gguf -tokenize -prompt-file text.txt   # the prompt's token ids, as JSON
//	llama-batched -m model.gguf -tokenize -prompt-file texts.json # a JSON array of texts: an array of token arrays
//
// It is compiled against the llama plugin's llama.cpp tree (build tag llama,
// the Makefile's LLAMA_ENV: mk/llama-pin.mk), and loads libggml-cuda.so from
// beside itself (or -lib-dir) when present and stamped with that tree's
// commit (make cuda). Output: one JSON object a line on stdout, a "setup"
// line, then a "result" line per N; notes go to stderr.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// config is the command line.
type config struct {
	model      string
	nps        []int // sequence counts, in order
	nGen       int   // tokens generated per sequence
	nPrompt    int   // synthetic prompt length (without -prompt-file)
	promptFile string
	ngl        int    // layers on the GPU; -1: all
	nCtx       int    // KV cells; 0: enough for the largest N
	threads    int    // CPU threads
	flashAttn  string // on, off, auto
	kvUnified  bool   // one KV stream for all sequences (the llama plugin's setting)
	nBatch     int
	nUBatch    int
	libDir     string // where libggml-cuda.so is; "": beside the executable
	tokenize   bool
	warmup     bool
	verbose    bool
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "llama-batched:", err)
		os.Exit(2)
	}
	if err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "llama-batched:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, errOut io.Writer) (config, error) {
	c := config{}
	fs := flag.NewFlagSet("llama-batched", flag.ContinueOnError)
	fs.SetOutput(errOut)
	nps := fs.String("np", "1,2,4,8,16,32", "sequence counts (comma-separated)")
	fs.StringVar(&c.model, "m", "", "GGUF model (required)")
	fs.IntVar(&c.nGen, "n", 128, "tokens generated per sequence")
	fs.IntVar(&c.nPrompt, "p", 512, "prompt tokens (synthetic; -prompt-file gives a text instead)")
	fs.StringVar(&c.promptFile, "prompt-file", "", "prompt text, tokenized with the model's vocabulary (BOS added, special tokens parsed)")
	fs.IntVar(&c.ngl, "ngl", -1, "layers on the GPU (-1: all; ignored without a GPU)")
	fs.IntVar(&c.nCtx, "c", 0, "KV cells (0: N × (prompt + n) for the largest N)")
	fs.IntVar(&c.threads, "t", min(runtime.NumCPU(), 16), "CPU threads")
	fs.StringVar(&c.flashAttn, "fa", "on", "flash attention: on, off or auto")
	fs.BoolVar(&c.kvUnified, "kvu", true, "one unified KV stream for all sequences (as the llama plugin); false: one per sequence")
	fs.IntVar(&c.nBatch, "b", 2048, "logical batch (tokens per llama_decode in the prefill)")
	fs.IntVar(&c.nUBatch, "ub", 512, "physical batch")
	fs.StringVar(&c.libDir, "lib-dir", "", "directory of libggml-cuda.so and hydra-ggml.version (default: beside this executable)")
	fs.BoolVar(&c.tokenize, "tokenize", false, "print the -prompt-file's token ids as a JSON array and exit")
	fs.BoolVar(&c.warmup, "warmup", true, "one short untimed run first")
	fs.BoolVar(&c.verbose, "v", false, "llama.cpp's own log on stderr (default: warnings and errors)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if c.nps, err = parseList(*nps); err != nil {
		return c, fmt.Errorf("-np: %w", err)
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.model == "":
		return errors.New("-m MODEL is required")
	case c.tokenize && c.promptFile == "":
		return errors.New("-tokenize needs -prompt-file")
	case c.nGen < 1:
		return fmt.Errorf("-n %d: at least one token", c.nGen)
	case c.promptFile == "" && c.nPrompt < 1:
		return fmt.Errorf("-p %d: at least one prompt token", c.nPrompt)
	case c.threads < 1:
		return fmt.Errorf("-t %d: at least one thread", c.threads)
	case c.nBatch < 1 || c.nUBatch < 1:
		return errors.New("-b and -ub must be positive")
	case slicesMax(c.nps) > c.nBatch:
		return fmt.Errorf("-np %d exceeds the batch -b %d (one decode step is one batch)", slicesMax(c.nps), c.nBatch)
	}
	switch c.flashAttn {
	case "on", "off", "auto":
	default:
		return fmt.Errorf("-fa %q: on, off or auto", c.flashAttn)
	}
	return nil
}

// parseList reads "1,2,4": positive counts of at most 255 sequences
// (llama.cpp's limit is 256).
func parseList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 255 {
			return nil, fmt.Errorf("%q is not a count in [1, 255]", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

func slicesMax(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// run loads the model and measures every N, or tokenizes the prompt.
func run(cfg config, out, notes io.Writer) error {
	if cfg.tokenize {
		return printTokens(cfg, out)
	}
	prompt, lib, err := openForBench(cfg, notes)
	if err != nil {
		return err
	}
	defer lib.close()
	enc := json.NewEncoder(out)
	setup := lib.setup()
	setup.Kind = "setup"
	setup.NPrompt, setup.NGen = len(prompt), cfg.nGen
	if err := enc.Encode(setup); err != nil {
		return err
	}
	return measureAll(lib, prompt, cfg, enc, notes)
}

// printTokens prints the prompt file's token ids: decode-bench sends them
// to servers that take token ids, so all systems see the same tokens. A
// file holding a JSON array of strings gives an array of token arrays.
func printTokens(cfg config, out io.Writer) error {
	b, err := os.ReadFile(cfg.promptFile)
	if err != nil {
		return err
	}
	var texts []string
	list := json.Unmarshal(b, &texts) == nil
	if !list {
		texts = []string{string(b)}
	}
	toks, err := tokenizeOnly(cfg, texts)
	if err != nil {
		return err
	}
	if list {
		return json.NewEncoder(out).Encode(toks)
	}
	return json.NewEncoder(out).Encode(toks[0])
}

// openForBench loads the model, builds the prompt and then the context,
// whose size depends on the prompt's length.
func openForBench(cfg config, notes io.Writer) ([]int32, backend, error) {
	lib, err := openBackend(cfg, notes)
	if err != nil {
		return nil, nil, err
	}
	prompt, err := benchPrompt(cfg, lib)
	if err == nil {
		err = lib.makeContext(contextSize(cfg, len(prompt)), slicesMax(cfg.nps))
	}
	if err != nil {
		lib.close()
		return nil, nil, err
	}
	return prompt, lib, nil
}

// benchPrompt is the -prompt-file's tokens, or a synthetic prompt of -p
// tokens.
func benchPrompt(cfg config, lib backend) ([]int32, error) {
	if cfg.promptFile == "" {
		return syntheticPrompt(cfg.nPrompt, lib.setup().NVocab, lib.setup().BOS), nil
	}
	text, err := os.ReadFile(cfg.promptFile)
	if err != nil {
		return nil, err
	}
	toks, err := lib.tokenize(string(text))
	if err == nil && len(toks) == 0 {
		err = fmt.Errorf("%s tokenizes to nothing", cfg.promptFile)
	}
	return toks, err
}

// syntheticPrompt is BOS and n-1 token ids varied so that no cache can
// shorten the work, all inside the vocabulary and above gguf-gen's five
// special tokens.
func syntheticPrompt(n, vocab int, bos int32) []int32 {
	p := make([]int32, n)
	p[0] = bos
	span := max(vocab-5, 1)
	for i := 1; i < n; i++ {
		p[i] = int32(5 + (i*7919)%span)
	}
	return p
}

// contextSize is the KV cells the runs need: every sequence holds the
// prompt and its generated tokens, rounded up to llama.cpp's 256-cell
// padding.
func contextSize(cfg config, promptLen int) int {
	if cfg.nCtx > 0 {
		return cfg.nCtx
	}
	n := slicesMax(cfg.nps) * (promptLen + cfg.nGen)
	return (n + 255) / 256 * 256
}
