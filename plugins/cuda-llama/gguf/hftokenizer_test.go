package gguf

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/internal/hfref"
)

// The real tokenizers of make tokenizers convert as convert_hf_to_gguf.py
// converts them: the pre-tokenizer name its hash of a test text picks for
// each (checked against llama.cpp 80fb11ac's table), and every added token
// as Hugging Face decodes it back. Skips until make tokenizers (and, for
// the round trip, make hf-ref) has run.
func TestRealTokenizers(t *testing.T) {
	for family, pre := range map[string]string{
		"qwen3": "qwen2", "llama3": "smaug-bpe", "gptoss": "gpt-4o", "deepseek_v3": "deepseek-v3",
	} {
		t.Run(family, func(t *testing.T) {
			dir := hfref.TokenizerDir(t, family)
			tok, err := LoadTokenizer(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			if tok.Pre != pre {
				t.Errorf("pre-tokenizer %q, want %q", tok.Pre, pre)
			}
			if _, ok := tok.Special["eos"]; !ok || tok.ChatTemplate == "" && family != "gptoss" {
				t.Errorf("special %v, template %d bytes", tok.Special, len(tok.ChatTemplate))
			}
			for _, a := range hfref.Added(t, dir) {
				want := a.RoundTrip
				if tok.Types[a.ID] == TokenUserDefined {
					want = strings.ReplaceAll(want, "▁", " ")
				}
				if tok.Tokens[a.ID] != want {
					t.Errorf("added token %d %q: %q, Hugging Face decodes %q", a.ID, a.Content, tok.Tokens[a.ID], a.RoundTrip)
				}
			}
		})
	}
}

// mixedTexts are what llama.cpp's tokenizer and Hugging Face's must agree
// on: code, CJK, emoji sequences, whitespace runs, numbers, contractions,
// accents, and (per family, appended) special tokens inline.
var mixedTexts = []string{
	"def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n",
	"我想在apple工作1314151天～ 日本語のテキスト、カタカナ。한국어 문장입니다",
	"🚀 (normal) 😶‍🌫️ (multiple) ✅ 🦙🦙 👨‍👩‍👧‍👦 flags 🇩🇪🇯🇵",
	"a  b   c\t\td\n\n\n  \n e    \r\n f   ",
	"I've 3.14159 and 1234567 items; they're 'RE' DON'T we'll",
	"naïve café Ünïcödé — “quotes” … ½ ﬁ",
	"   leading spaces and trailing\n",
	"if (x->y && z[0] != '\\0') { return -1; } // ok?!",
}

// specialTexts put each family's special tokens inline.
var specialTexts = map[string]string{
	"qwen3":       "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhm</think>\n\n<tool_call>{}</tool_call><|endoftext|>",
	"llama3":      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>",
	"gptoss":      "<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>analysis<|message|>x<|return|>",
	"deepseek_v3": "<｜begin▁of▁sentence｜>sys<｜User｜>hi<｜Assistant｜><think>\n</think>ok<｜end▁of▁sentence｜><｜tool▁calls▁begin｜>",
}

// With LLAMA_TOKENIZE naming llama.cpp's llama-tokenize, a model written
// with each real tokenizer tokenizes mixed text as Hugging Face does
// (special tokens parsed; BOS left out on both sides: tokenizers.js does not
// add the BOS a LlamaTokenizerFast adds, which the add_bos_token flag
// carries instead).
func TestLlamaCppTokenizesAsHF(t *testing.T) {
	bin := os.Getenv("LLAMA_TOKENIZE")
	if bin == "" {
		t.Skip("LLAMA_TOKENIZE (a llama-tokenize binary) is not set")
	}
	for family := range specialTexts {
		t.Run(family, func(t *testing.T) {
			dir := hfref.TokenizerDir(t, family)
			tok, err := LoadTokenizer(dir, "")
			if err != nil {
				t.Fatal(err)
			}
			c := Tiny()
			c.Layers, c.Embd, c.FF, c.Type, c.Tokenizer, c.Vocab = 1, 32, 32, WeightF16, tok, tok.Size()
			model := filepath.Join(t.TempDir(), family+".gguf")
			if err := WriteFile(model, c); err != nil {
				t.Fatal(err)
			}
			texts := append(slices.Clone(mixedTexts), specialTexts[family])
			want := hfref.Encode(t, dir, false, texts...)
			for i, text := range texts {
				if got := llamaTokenize(t, bin, model, text); !slices.Equal(got, want[i]) {
					t.Errorf("text %d %q:\nllama.cpp    %v\nHugging Face %v", i, text, got, want[i])
				}
			}
			if family != "qwen3" {
				return
			}
			// llama.cpp's one known difference here: it takes any token
			// spelled "</s>" for an end-of-generation control token
			// (llama-vocab.cpp's EOG list), and Qwen's vocabulary has an
			// ordinary "</s>" (128247), so it parses that text as the one
			// token where Hugging Face splits it.
			const text = "Say </s> now"
			hf := hfref.Encode(t, dir, false, text)[0]
			if got := llamaTokenize(t, bin, model, text); !slices.Equal(got, []int{45764, 220, 128247, 1431}) || !slices.Equal(hf, []int{45764, 690, 82, 29, 1431}) {
				t.Errorf("%q: llama.cpp %v, Hugging Face %v: the known difference changed", text, got, hf)
			}
		})
	}
}

// llamaTokenize is llama-tokenize's ids for text, without a BOS, with
// special tokens parsed (its default) and the text taken as it is.
func llamaTokenize(t *testing.T, bin, model, text string) []int {
	t.Helper()
	in := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-m", model, "-f", in, "--ids", "--no-bos", "--no-escape", "--log-disable").Output()
	if err != nil {
		t.Fatalf("llama-tokenize: %v", err)
	}
	var ids []int
	if err := json.Unmarshal(bytes.TrimSpace(out), &ids); err != nil {
		t.Fatalf("llama-tokenize printed %q: %v", out, err)
	}
	return ids
}
