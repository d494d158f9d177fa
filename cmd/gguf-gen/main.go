// Command gguf-gen writes a deterministic random-weight GGUF model for tests
// and benchmarks of the llama.cpp backend that need no download: llama
// (dense, or with Mixtral-style experts), qwen3 (dense; with -pooling,
// -classifier and -rerank-template an embedding or reranker model as
// Qwen3-Embedding's and Qwen3-Reranker's GGUFs are), qwen3moe, qwen35moe (the production
// Qwen3.6-35B-A3B's hybrid: gated DeltaNet blocks, every fourth a gated full
// attention, routed plus shared experts) or gemma3 (sliding-window
// attention). The vocabulary is a minimal generated one with a ChatML
// template, or with -tokenizer a real Hugging Face tokenizer directory,
// written as llama.cpp's convert_hf_to_gguf.py writes it (make tokenizers
// fetches the tests' ones into bin/tokenizers):
//
//	gguf-gen -o tiny.gguf                              # the tests' tiny model
//	gguf-gen -o big.gguf -layers 32 -embd 1024 -heads 8 -kv-heads 8 -ff 1024 -f16
//	gguf-gen -o moe.gguf -arch qwen3moe -type q8_0     # the tests' tiny MoE model, Q8_0
//	gguf-gen -o moe4.gguf -arch qwen3moe -type q4_0    # the same model at Q4_0
//	gguf-gen -o q35.gguf -arch qwen35moe -tokenizer bin/tokenizers/qwen3
//	gguf-gen -o g3.gguf -arch gemma3 -window 16 -tokenizer bin/tokenizers/gptoss
//	gguf-gen -o rr.gguf -arch qwen3 -pooling rank -classifier yes,no -tokenizer bin/tokenizers/qwen3
//	gguf-gen -o prod.gguf -arch qwen35moe -layers 40 -embd 2048 -heads 16 -kv-heads 2 \
//	    -head-dim 256 -experts 256 -experts-used 8 -expert-ff 512 -shared-ff 512 \
//	    -ssm-state 128 -ssm-groups 16 -ssm-heads 32 -ctx 262144 -type q4_0 -tokenizer bin/tokenizers/qwen3
//
// The second is the GPU benchmark's model: 128 KiB of F16 KV state per token;
// the last has Qwen3.6-35B-A3B's shapes (about 20 GB). Sizes no flag gives
// are the architecture's tiny model's (gguf.TinyFor); with -tokenizer the
// vocabulary is the tokenizer's. One seed and one set of shapes give the
// same weights at every -type.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

func main() {
	c, out, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gguf-gen:", err)
		os.Exit(2)
	}
	if err := gguf.WriteFile(out, c); err != nil {
		fmt.Fprintln(os.Stderr, "gguf-gen:", err)
		os.Exit(1)
	}
	fmt.Println(summary(out, c))
}

// intFlags are the sizes on the command line, each a field of the
// model's configuration; what no flag gives is the architecture's tiny
// model's (gguf.TinyFor).
var intFlags = []struct {
	name, usage string
	field       func(*gguf.Config) *int
}{
	{"layers", "transformer blocks", func(c *gguf.Config) *int { return &c.Layers }},
	{"embd", "embedding width", func(c *gguf.Config) *int { return &c.Embd }},
	{"heads", "attention heads", func(c *gguf.Config) *int { return &c.Heads }},
	{"kv-heads", "KV heads (GQA)", func(c *gguf.Config) *int { return &c.KVHeads }},
	{"head-dim", "head width, qwen35moe and gemma3 (0 = embd / heads)", func(c *gguf.Config) *int { return &c.HeadSize }},
	{"ff", "feed-forward width (llama: also each expert's; not qwen35moe)", func(c *gguf.Config) *int { return &c.FF }},
	{"experts", "experts per block (llama: 0 = dense)", func(c *gguf.Config) *int { return &c.Experts }},
	{"experts-used", "experts each token is routed to", func(c *gguf.Config) *int { return &c.ExpertsUsed }},
	{"expert-ff", "each expert's width, qwen3moe and qwen35moe", func(c *gguf.Config) *int { return &c.ExpertFF }},
	{"shared-ff", "the shared expert's width, qwen35moe", func(c *gguf.Config) *int { return &c.SharedFF }},
	{"full-attn-interval", "every Nth block is full attention, the others gated DeltaNet (qwen35moe)", func(c *gguf.Config) *int { return &c.FullAttnInterval }},
	{"ssm-conv", "DeltaNet convolution taps (qwen35moe)", func(c *gguf.Config) *int { return &c.SSMConv }},
	{"ssm-state", "DeltaNet key and value head width (qwen35moe)", func(c *gguf.Config) *int { return &c.SSMState }},
	{"ssm-groups", "DeltaNet key heads (qwen35moe)", func(c *gguf.Config) *int { return &c.SSMGroups }},
	{"ssm-heads", "DeltaNet value heads, a multiple of ssm-groups (qwen35moe)", func(c *gguf.Config) *int { return &c.SSMHeads }},
	{"mtp", "multi-token-prediction blocks after the layers, 0 or 1 (qwen35moe; llama.cpp's draft-mtp drafts with it)", func(c *gguf.Config) *int { return &c.MTP }},
	{"window", "sliding window in tokens (gemma3)", func(c *gguf.Config) *int { return &c.Window }},
	{"swa-pattern", "of every N blocks the last is global, the others sliding-window (gemma3)", func(c *gguf.Config) *int { return &c.SWAPattern }},
	{"vocab", fmt.Sprintf("vocabulary size (>= %d; with -tokenizer, default and minimum its size)", gguf.MinVocab), func(c *gguf.Config) *int { return &c.Vocab }},
	{"ctx", "training context length", func(c *gguf.Config) *int { return &c.Ctx }},
}

// parseFlags reads the command line into a model configuration and the
// output path; what no flag gives is the architecture's tiny model's
// (gguf.Tiny, TinyQwen3, TinyMoE, TinyQwen35MoE or TinyGemma3), and with -tokenizer
// the vocabulary is the tokenizer's.
func parseFlags(args []string, stderr io.Writer) (gguf.Config, string, error) {
	c := gguf.Tiny()
	fs := flag.NewFlagSet("gguf-gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output file (required)")
	fs.StringVar(&c.Name, "name", c.Name, "general.name")
	fs.StringVar(&c.Arch, "arch", gguf.ArchLlama, "architecture: llama, qwen3, qwen3moe, qwen35moe or gemma3")
	for _, f := range intFlags {
		fs.IntVar(f.field(&c), f.name, *f.field(&c), f.usage)
	}
	tokDir := fs.String("tokenizer", "", "a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json) to write instead of the generated vocabulary")
	tokPre := fs.String("tokenizer-pre", "", "llama.cpp pre-tokenizer name (default: the tokenizer family's)")
	wt := fs.String("type", "f32", "type of the big matrices: f32, f16, q8_0 or q4_0 (norms, routers and other small tensors stay f32)")
	f16 := fs.Bool("f16", false, "the same as -type f16")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "weight seed")
	fs.StringVar(&c.Pooling, "pooling", "", "the pooling the model names for embeddings: none, mean, cls, last or rank (default: none written)")
	classifier := fs.String("classifier", "", "a qwen3 model's classifier head, its labels comma-separated (a reranker's: yes,no)")
	fs.StringVar(&c.RerankTemplate, "rerank-template", "", "tokenizer.chat_template.rerank: {query} and {document} stand for the texts")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: gguf-gen -o FILE [-arch ARCH] [-tokenizer DIR] [flags]\n")
		fs.PrintDefaults()
		fmt.Fprintf(fs.Output(), "\nThe defaults are llama's; other architectures' sizes no flag gives are their tiny model's:\n%s", archDefaults())
	}
	if err := fs.Parse(args); err != nil {
		return c, "", err
	}
	if *out == "" || fs.NArg() > 0 {
		fs.Usage()
		return c, "", errors.New("-o FILE is required, and nothing after the flags")
	}
	set := given(fs)
	if *classifier != "" {
		c.Classifier = strings.Split(*classifier, ",")
	}
	var err error
	if c.Type, err = weightType(*wt, *f16, set["type"]); err != nil {
		return c, "", err
	}
	if c.Arch != gguf.ArchLlama {
		if err := fillArch(&c, set); err != nil {
			return c, "", err
		}
	}
	if *tokDir != "" {
		if c.Tokenizer, err = gguf.LoadTokenizer(*tokDir, *tokPre); err != nil {
			return c, "", err
		}
		if !set["vocab"] {
			c.Vocab = c.Tokenizer.Size()
		}
	} else if *tokPre != "" {
		return c, "", errors.New("-tokenizer-pre needs -tokenizer")
	}
	return c, *out, c.Validate()
}

// archDefaults lists, for each architecture but llama, the sizes its tiny
// model has other than llama's defaults.
func archDefaults() string {
	var b strings.Builder
	llama := gguf.Tiny()
	for _, arch := range []string{gguf.ArchQwen3, gguf.ArchQwen3MoE, gguf.ArchQwen35MoE, gguf.ArchGemma3} {
		tiny, _ := gguf.TinyFor(arch)
		fmt.Fprintf(&b, "  %s:", arch)
		for _, f := range intFlags {
			if v := *f.field(&tiny); v != *f.field(&llama) {
				fmt.Fprintf(&b, " -%s %d", f.name, v)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// given is the set of flags on the command line.
func given(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// weightType is -type, or F16 for -f16; the two must agree when both are
// given.
func weightType(name string, f16, typeGiven bool) (gguf.WeightType, error) {
	t, err := gguf.ParseWeightType(name)
	if err != nil {
		return 0, err
	}
	switch {
	case f16 && typeGiven && t != gguf.WeightF16:
		return 0, fmt.Errorf("-f16 and -type %s contradict each other", t)
	case f16:
		return gguf.WeightF16, nil
	}
	return t, nil
}

// fillArch gives a model of another architecture than llama its tiny
// model's values where the command line gave none: its name and sizes.
func fillArch(c *gguf.Config, given map[string]bool) error {
	tiny, err := gguf.TinyFor(c.Arch)
	if err != nil {
		return err
	}
	for _, f := range intFlags {
		if !given[f.name] {
			*f.field(c) = *f.field(&tiny)
		}
	}
	if !given["experts-used"] {
		c.ExpertsUsed = min(c.ExpertsUsed, c.Experts) // -experts 1 alone routes to the one
	}
	if !given["name"] {
		c.Name = tiny.Name
	}
	return nil
}

// summary is the line gguf-gen prints for the model it wrote.
func summary(out string, c gguf.Config) string {
	s := fmt.Sprintf("%s: %s, %d layers, embd %d, %d/%d heads of %d", out, c.Arch, c.Layers, c.Embd, c.Heads, c.KVHeads, c.HeadDim())
	switch c.Arch {
	case gguf.ArchQwen35MoE:
		s += fmt.Sprintf(", full attention every %d (DeltaNet %d/%d heads of %d, conv %d)", c.FullAttnInterval, c.SSMHeads, c.SSMGroups, c.SSMState, c.SSMConv)
		if c.MTP > 0 {
			s += fmt.Sprintf(", %d MTP block", c.MTP)
		}
	case gguf.ArchGemma3:
		s += fmt.Sprintf(", ff %d, window %d (every %dth block global)", c.FF, c.Window, c.SWAPattern)
	default:
		s += fmt.Sprintf(", ff %d", c.FF)
	}
	s += fmt.Sprintf(", vocab %d", c.Vocab)
	if c.Pooling != "" {
		s += ", pooling " + c.Pooling
	}
	if len(c.Classifier) > 0 {
		s += fmt.Sprintf(", classifier head %v", c.Classifier)
	}
	if c.Tokenizer != nil {
		s += fmt.Sprintf(" (tokenizer %s)", c.Tokenizer.Pre)
	}
	s += fmt.Sprintf(", %s weights", c.Type)
	if c.Experts > 0 {
		ff := c.ExpertFF
		if c.Arch == gguf.ArchLlama || c.Arch == "" {
			ff = c.FF
		}
		s += fmt.Sprintf(", %d experts (%d used) of ff %d", c.Experts, c.ExpertsUsed, ff)
		if c.SharedFF > 0 {
			s += fmt.Sprintf(" and a shared one of ff %d", c.SharedFF)
		}
	}
	return s + fmt.Sprintf("; KV %d bytes/token (F16 cache)", c.KVBytesPerToken())
}
