package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

func TestParseFlags(t *testing.T) {
	moeQ8 := gguf.TinyMoE()
	moeQ8.Type = gguf.WeightQ8_0
	moe8 := gguf.TinyMoE()
	moe8.Experts, moe8.Layers = 8, 2
	f16 := gguf.Tiny()
	f16.Type = gguf.WeightF16
	one := gguf.TinyMoE()
	one.Experts, one.ExpertsUsed = 1, 1
	q35 := gguf.TinyQwen35MoE()
	q35.Layers, q35.FullAttnInterval, q35.SSMHeads = 8, 2, 8
	g3 := gguf.TinyGemma3()
	g3.Window, g3.Type = 16, gguf.WeightQ4_0
	for _, tc := range []struct {
		args []string
		want gguf.Config
	}{
		{[]string{"-o", "x"}, gguf.Tiny()},
		{[]string{"-o", "x", "-arch", "qwen3moe", "-type", "Q8_0"}, moeQ8},
		{[]string{"-o", "x", "-arch", "qwen3moe", "-experts", "8", "-layers", "2"}, moe8},
		{[]string{"-o", "x", "-arch", "qwen3moe", "-experts", "1"}, one},
		{[]string{"-o", "x", "-f16"}, f16},
		{[]string{"-o", "x", "-f16", "-type", "f16"}, f16},
		{[]string{"-o", "x", "-arch", "qwen35moe"}, gguf.TinyQwen35MoE()},
		{[]string{"-o", "x", "-arch", "qwen35moe", "-layers", "8", "-full-attn-interval", "2", "-ssm-heads", "8"}, q35},
		{[]string{"-o", "x", "-arch", "gemma3", "-window", "16", "-type", "q4_0"}, g3},
	} {
		c, out, err := parseFlags(tc.args, io.Discard)
		if err != nil || out != "x" || !reflect.DeepEqual(c, tc.want) {
			t.Errorf("%q:\n got %+v, %q, %v\nwant %+v", tc.args, c, out, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "x", "-f16", "-type", "q4_0"}, "-f16 and -type q4_0 contradict"},
		{[]string{"-o", "x", "-type", "q2_k"}, `weight type "q2_k"`},
		{[]string{"-o", "x", "-arch", "qwen3moe", "-experts-used", "9"}, "experts used 9"},
		{[]string{"-o", "x", "-arch", "gpt2"}, `architecture "gpt2"`},
		{[]string{"-o", "x", "-experts", "4"}, "experts used 0"},
		{[]string{"-o", "x", "-arch", "qwen3moe", "-expert-ff", "40", "-type", "q8_0"}, "do not divide into q8_0 blocks"},
		{[]string{"x"}, "-o FILE is required"},
		{[]string{"-o", "x", "-arch", "qwen35moe", "-ssm-heads", "3"}, "not a multiple of ssm groups"},
		{[]string{"-o", "x", "-window", "8"}, "are for qwen35moe and gemma3"},
		{[]string{"-o", "x", "-tokenizer-pre", "qwen2"}, "-tokenizer-pre needs -tokenizer"},
		{[]string{"-o", "x", "-tokenizer", fixture, "-vocab", "20"}, "the tokenizer has 21 tokens"},
		{[]string{"-o", "x", "-tokenizer", "testdata-missing"}, "no such file"},
	} {
		if _, _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
	if _, _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// The file written is the package's model, byte for byte.
func TestWritesTheModel(t *testing.T) {
	out := filepath.Join(t.TempDir(), "moe.gguf")
	c, _, err := parseFlags([]string{"-o", out, "-arch", "qwen3moe", "-type", "q4_0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := gguf.WriteFile(out, c); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := gguf.TinyMoE()
	want.Type = gguf.WeightQ4_0
	var b bytes.Buffer
	if err := gguf.Write(&b, want); err != nil || !bytes.Equal(got, b.Bytes()) {
		t.Fatalf("the file is not TinyMoE at q4_0 (%v)", err)
	}
	if s := summary(out, c); !strings.Contains(s, "qwen3moe, 4 layers") || !strings.Contains(s, "q4_0 weights, 4 experts (2 used) of ff 32") {
		t.Errorf("summary %q", s)
	}
}

// The gguf package's tiny Hugging Face tokenizer.
var fixture = filepath.Join("..", "..", "plugins", "cuda-llama", "gguf", "testdata", "tokenizer")

// With -tokenizer the vocabulary is the tokenizer's, unless -vocab pads it.
func TestTokenizerFlag(t *testing.T) {
	c, _, err := parseFlags([]string{"-o", "x", "-arch", "qwen35moe", "-tokenizer", fixture}, io.Discard)
	if err != nil || c.Tokenizer == nil || c.Vocab != 21 || c.Tokenizer.Pre != "qwen2" || c.Layers != 4 {
		t.Fatalf("%+v, %v", c, err)
	}
	if s := summary("x", c); !strings.Contains(s, "vocab 21 (tokenizer qwen2)") || !strings.Contains(s, "full attention every 4") {
		t.Errorf("summary %q", s)
	}
	c, _, err = parseFlags([]string{"-o", "x", "-tokenizer", fixture, "-tokenizer-pre", "qwen35", "-vocab", "32"}, io.Discard)
	if err != nil || c.Vocab != 32 || c.Tokenizer.Pre != "qwen35" {
		t.Fatalf("%+v, %v", c, err)
	}
}
