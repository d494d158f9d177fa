// Command gguf-gen writes a deterministic random-weight llama-architecture
// GGUF model with a minimal vocabulary and a ChatML template, for tests and
// benchmarks of the llama.cpp backend that need no download:
//
//	gguf-gen -o tiny.gguf                              # the tests' tiny model
//	gguf-gen -o big.gguf -layers 32 -embd 1024 -heads 8 -kv-heads 8 -ff 1024 -f16
//
// The second is the GPU benchmark's model: 128 KiB of F16 KV state per token.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

func main() {
	c := gguf.Tiny()
	out := flag.String("o", "", "output file (required)")
	flag.StringVar(&c.Name, "name", c.Name, "general.name")
	flag.IntVar(&c.Layers, "layers", c.Layers, "transformer blocks")
	flag.IntVar(&c.Embd, "embd", c.Embd, "embedding width")
	flag.IntVar(&c.Heads, "heads", c.Heads, "attention heads")
	flag.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "KV heads (GQA)")
	flag.IntVar(&c.FF, "ff", c.FF, "feed-forward width")
	flag.IntVar(&c.Vocab, "vocab", c.Vocab, fmt.Sprintf("vocabulary size (>= %d)", gguf.MinVocab))
	flag.IntVar(&c.Ctx, "ctx", c.Ctx, "training context length")
	flag.BoolVar(&c.F16, "f16", c.F16, "F16 weights (default F32)")
	flag.Uint64Var(&c.Seed, "seed", c.Seed, "weight seed")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: gguf-gen -o FILE [flags]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := gguf.WriteFile(*out, c); err != nil {
		fmt.Fprintln(os.Stderr, "gguf-gen:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %d layers, embd %d, %d/%d heads, ff %d, vocab %d; KV %d bytes/token (F16 cache)\n",
		*out, c.Layers, c.Embd, c.Heads, c.KVHeads, c.FF, c.Vocab, c.KVBytesPerToken())
}
