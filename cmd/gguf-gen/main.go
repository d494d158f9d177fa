// Command gguf-gen writes a deterministic random-weight GGUF model with a
// minimal vocabulary and a ChatML template, for tests and benchmarks of the
// llama.cpp backend that need no download:
//
//	gguf-gen -o tiny.gguf                              # the tests' tiny model
//	gguf-gen -o big.gguf -layers 32 -embd 1024 -heads 8 -kv-heads 8 -ff 1024 -f16
//	gguf-gen -o moe.gguf -arch qwen3moe -type q8_0     # the tests' tiny MoE model, Q8_0
//	gguf-gen -o moe4.gguf -arch qwen3moe -type q4_0    # the same model at Q4_0
//
// The second is the GPU benchmark's model: 128 KiB of F16 KV state per token.
// One seed and one set of shapes give the same weights at every -type.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

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

// parseFlags reads the command line into a model configuration and the
// output path; what no flag gives is gguf.Tiny's, or with -arch qwen3moe
// gguf.TinyMoE's.
func parseFlags(args []string, stderr io.Writer) (gguf.Config, string, error) {
	c := gguf.Tiny()
	fs := flag.NewFlagSet("gguf-gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output file (required)")
	fs.StringVar(&c.Name, "name", c.Name, "general.name")
	fs.StringVar(&c.Arch, "arch", gguf.ArchLlama, "architecture: llama or qwen3moe")
	fs.IntVar(&c.Layers, "layers", c.Layers, "transformer blocks")
	fs.IntVar(&c.Embd, "embd", c.Embd, "embedding width")
	fs.IntVar(&c.Heads, "heads", c.Heads, "attention heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads (GQA)")
	fs.IntVar(&c.FF, "ff", c.FF, "feed-forward width (llama: also each expert's)")
	fs.IntVar(&c.Experts, "experts", 0, "experts per block (qwen3moe default 4; llama: 0 = dense)")
	fs.IntVar(&c.ExpertsUsed, "experts-used", 0, "experts each token is routed to (qwen3moe default 2)")
	fs.IntVar(&c.ExpertFF, "expert-ff", 0, "each expert's width, qwen3moe only (default 32)")
	fs.IntVar(&c.Vocab, "vocab", c.Vocab, fmt.Sprintf("vocabulary size (>= %d)", gguf.MinVocab))
	fs.IntVar(&c.Ctx, "ctx", c.Ctx, "training context length")
	wt := fs.String("type", "f32", "type of the big matrices: f32, f16, q8_0 or q4_0 (norms and routers stay f32)")
	f16 := fs.Bool("f16", false, "the same as -type f16")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "weight seed")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: gguf-gen -o FILE [flags]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, "", err
	}
	if *out == "" || fs.NArg() > 0 {
		fs.Usage()
		return c, "", errors.New("-o FILE is required, and nothing after the flags")
	}
	set := given(fs)
	var err error
	if c.Type, err = weightType(*wt, *f16, set["type"]); err != nil {
		return c, "", err
	}
	if c.Arch == gguf.ArchQwen3MoE {
		fillMoE(&c, set)
	}
	return c, *out, c.Validate()
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

// fillMoE gives a qwen3moe model gguf.TinyMoE's values where the command
// line gave none: its name, layers, heads and experts.
func fillMoE(c *gguf.Config, given map[string]bool) {
	moe := gguf.TinyMoE()
	for name, field := range map[string]struct{ dst, src *int }{
		"layers": {&c.Layers, &moe.Layers}, "heads": {&c.Heads, &moe.Heads}, "kv-heads": {&c.KVHeads, &moe.KVHeads},
		"experts":      {&c.Experts, &moe.Experts},
		"experts-used": {&c.ExpertsUsed, &moe.ExpertsUsed}, "expert-ff": {&c.ExpertFF, &moe.ExpertFF},
	} {
		if !given[name] {
			*field.dst = *field.src
		}
	}
	if !given["experts-used"] {
		c.ExpertsUsed = min(c.ExpertsUsed, c.Experts) // -experts 1 alone routes to the one
	}
	if !given["name"] {
		c.Name = moe.Name
	}
}

// summary is the line gguf-gen prints for the model it wrote.
func summary(out string, c gguf.Config) string {
	s := fmt.Sprintf("%s: %s, %d layers, embd %d, %d/%d heads, ff %d, vocab %d, %s weights",
		out, c.Arch, c.Layers, c.Embd, c.Heads, c.KVHeads, c.FF, c.Vocab, c.Type)
	if c.Experts > 0 {
		ff := c.ExpertFF
		if c.Arch != gguf.ArchQwen3MoE {
			ff = c.FF
		}
		s += fmt.Sprintf(", %d experts (%d used) of ff %d", c.Experts, c.ExpertsUsed, ff)
	}
	return s + fmt.Sprintf("; KV %d bytes/token (F16 cache)", c.KVBytesPerToken())
}
