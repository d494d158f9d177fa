package gguf

import (
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
