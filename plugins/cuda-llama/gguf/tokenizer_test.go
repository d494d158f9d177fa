package gguf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const fixture = "testdata/tokenizer"

// The fixture (a tiny Qwen-style tokenizer) becomes the metadata convert
// writes for it, key for key and in convert's order.
func TestLoadTokenizerFixture(t *testing.T) {
	tok, err := LoadTokenizer(fixture, "")
	if err != nil {
		t.Fatal(err)
	}
	wantTokens := []string{"h", "e", "l", "o", "Ġ", "w", "r", "d", "he", "ll", "hell", "hello", "Ġw", "!",
		"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", " tool", "[PAD19]", "<|tool_call|>"}
	wantTypes := []int32{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
		TokenControl, TokenControl, TokenControl, TokenUserDefined, TokenUserDefined, TokenUnused, TokenControl}
	if !slices.Equal(tok.Tokens, wantTokens) || !slices.Equal(tok.Types, wantTypes) || tok.Size() != 21 {
		t.Fatalf("tokens %q\ntypes %v", tok.Tokens, tok.Types)
	}
	if want := []string{"h e", "l l", "he ll", "hell o", "Ġ w"}; !slices.Equal(tok.Merges, want) {
		t.Errorf("merges %q", tok.Merges)
	}
	var keys []string
	for _, p := range tok.metadata(tok.Size()) {
		keys = append(keys, p.key)
	}
	wantKeys := []string{"tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
		"tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
		"tokenizer.ggml.add_bos_token", "tokenizer.chat_template"}
	if !slices.Equal(keys, wantKeys) {
		t.Errorf("keys %q\nwant %q", keys, wantKeys)
	}
	if tok.Pre != "qwen2" || tok.Special["eos"] != 16 || tok.Special["pad"] != 14 || len(tok.Special) != 2 ||
		!reflect.DeepEqual(tok.Add, map[string]bool{"bos": false}) || !strings.HasPrefix(tok.ChatTemplate, "{% for message") {
		t.Errorf("pre %q, special %v, add %v, template %.20q", tok.Pre, tok.Special, tok.Add, tok.ChatTemplate)
	}
	if tok, err := LoadTokenizer(fixture, "qwen35"); err != nil || tok.Pre != "qwen35" {
		t.Errorf("an explicit pre-tokenizer name: %v, %v", tok, err)
	}
}

// variant writes the fixture with some of its JSON changed into a new
// directory.
func variant(t *testing.T, mutTok, mutCfg func(map[string]any)) string {
	t.Helper()
	dir := t.TempDir()
	for name, mut := range map[string]func(map[string]any){"tokenizer.json": mutTok, "tokenizer_config.json": mutCfg} {
		b, err := os.ReadFile(filepath.Join(fixture, name))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if mut != nil {
			mut(m)
		}
		if b, err = json.Marshal(m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// splitPre is a byte-level pre-tokenizer with one split.
func splitPre(regex string) map[string]any {
	return map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": regex}, "behavior": "Isolated"},
		map[string]any{"type": "ByteLevel"},
	}}
}

// A Llama 3 tokenizer whose post-processor adds <|begin_of_text|> is
// llama-bpe with add_bos_token; without it convert's hash names it
// smaug-bpe. Old-style string merges pass as they are.
func TestTokenizerTemplateProcessing(t *testing.T) {
	llama3 := func(bos bool) func(m map[string]any) {
		return func(m map[string]any) {
			m["pre_tokenizer"] = splitPre(llama3Split)
			m["model"].(map[string]any)["merges"] = []any{"h e", "l l"}
			m["added_tokens"] = append(m["added_tokens"].([]any), map[string]any{"id": 21, "content": "<|begin_of_text|>", "special": true})
			if bos {
				m["post_processor"] = map[string]any{"type": "Sequence", "processors": []any{
					map[string]any{"type": "ByteLevel"},
					map[string]any{"type": "TemplateProcessing",
						"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}},
						"pair": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}},
							map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>"}}, map[string]any{"Sequence": map[string]any{"id": "B"}}}},
				}}
			}
		}
	}
	cfg := func(m map[string]any) {
		delete(m, "add_bos_token")
		m["bos_token"] = "<|begin_of_text|>"
		m["tokenizer_class"] = "PreTrainedTokenizerFast"
	}
	for _, bos := range []bool{true, false} {
		tok, err := LoadTokenizer(variant(t, llama3(bos), cfg), "")
		if err != nil {
			t.Fatal(err)
		}
		wantPre, wantAdd := "smaug-bpe", map[string]bool{}
		if bos {
			wantPre, wantAdd = "llama-bpe", map[string]bool{"bos": true, "sep": false}
		}
		if tok.Pre != wantPre || !reflect.DeepEqual(tok.Add, wantAdd) || tok.Special["bos"] != 21 || !slices.Equal(tok.Merges, []string{"h e", "l l"}) {
			t.Errorf("BOS template %v: pre %q, add %v, special %v, merges %q", bos, tok.Pre, tok.Add, tok.Special, tok.Merges)
		}
	}
	// A template ending in another token than the configured EOS makes it
	// the EOS and the configured one the EOT.
	eot := func(m map[string]any) {
		m["post_processor"] = map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"Sequence": map[string]any{"id": "A"}}, map[string]any{"SpecialToken": map[string]any{"id": "<|endoftext|>"}}}}
	}
	tok, err := LoadTokenizer(variant(t, eot, nil), "")
	if err != nil {
		t.Fatal(err)
	}
	if tok.Special["eos"] != 14 || tok.Special["eot"] != 16 || !tok.Add["eos"] {
		t.Errorf("EOS template: special %v, add %v", tok.Special, tok.Add)
	}
}

// A DeepSeek V3 tokenizer adds its BOS as LlamaTokenizerFast unless told
// not to, and its special tokens may be AddedToken objects.
func TestTokenizerLlamaFastBOS(t *testing.T) {
	ds := func(m map[string]any) {
		m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\p{N}{1,3}`}},
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "[一-龥\u3040-ゟ゠-ヿ]+"}},
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": strings.Split(deepseek3Split, "\x00")[2]}},
			map[string]any{"type": "ByteLevel"},
		}}
	}
	for add, want := range map[any]string{true: "deepseek-v3", nil: "deepseek-v3", false: "joyai-llm"} {
		cfg := func(m map[string]any) {
			m["tokenizer_class"] = "LlamaTokenizerFast"
			m["bos_token"] = map[string]any{"__type": "AddedToken", "content": "<|endoftext|>"}
			if delete(m, "add_bos_token"); add != nil {
				m["add_bos_token"] = add
			}
		}
		tok, err := LoadTokenizer(variant(t, ds, cfg), "")
		if err != nil || tok.Pre != want || tok.Special["bos"] != 14 {
			t.Errorf("add_bos_token %v: %+v, %v", add, tok, err)
		}
	}
}

func TestTokenizerRejects(t *testing.T) {
	for _, tc := range []struct {
		mut  func(map[string]any)
		want string
	}{
		{func(m map[string]any) { m["model"].(map[string]any)["type"] = "Unigram" }, "not a byte-level BPE"},
		{func(m map[string]any) { m["model"].(map[string]any)["byte_fallback"] = true }, "not a byte-level BPE"},
		{func(m map[string]any) { m["pre_tokenizer"] = splitPre(`\s+`) }, "no known family"},
		{func(m map[string]any) { delete(m["model"].(map[string]any), "merges") }, "no merges"},
	} {
		if _, err := LoadTokenizer(variant(t, tc.mut, nil), ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want %q", err, tc.want)
		}
	}
	if _, err := LoadTokenizer(t.TempDir(), ""); err == nil {
		t.Error("a directory without tokenizer.json loads")
	}
}

// Named templates: the default one is tokenizer.chat_template, the others
// get keys of their own and a list of names.
func TestTokenizerNamedTemplates(t *testing.T) {
	cfg := func(m map[string]any) {
		m["chat_template"] = []any{
			map[string]any{"name": "default", "template": "D"},
			map[string]any{"name": "tool-use", "template": "T"},
		}
	}
	tok, err := LoadTokenizer(variant(t, nil, cfg), "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{}
	for _, p := range tok.kv {
		got[p.key] = p.val
	}
	if got["tokenizer.chat_template"] != "D" || got["tokenizer.chat_template.tool_use"] != "T" ||
		!slices.Equal(got["tokenizer.chat_templates"].([]string), []string{"tool_use"}) {
		t.Errorf("template keys %v", got)
	}
}

// An added token comes back from a byte-level decoder mapped through its
// alphabet only when every character is in it.
func TestRoundTrip(t *testing.T) {
	for in, want := range map[string]string{
		"<think>": "<think>", "<｜tool▁sep｜>": "<｜tool▁sep｜>", "a b": "a b", "Ġhi": " hi", "é": "\uFFFD", "ÃĥÂ": "Ã\uFFFD", // bytes c3 83 c2
	} {
		if got := roundTrip(in, true, false); got != want {
			t.Errorf("roundTrip(%q) = %q, want %q", in, got, want)
		}
	}
	// A space is no character of the alphabet: the decoder passes the
	// token as it is, then the clean-up removes the space.
	if got := roundTrip("x .", true, true); got != "x." {
		t.Errorf("clean-up: %q", got)
	}
	if len(byteOfRune) != 256 || byteOfRune['Ġ'] != ' ' || byteOfRune['Ċ'] != '\n' || byteOfRune['!'] != '!' {
		t.Error("byte-level alphabet")
	}
}

// A model with a tokenizer has its vocabulary: one embedding row per token,
// the tokenizer's metadata, and rows past the tokenizer as unused tokens.
func TestWriteWithTokenizer(t *testing.T) {
	tok, err := LoadTokenizer(fixture, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []Config{Tiny(), TinyMoE(), TinyQwen35MoE(), TinyGemma3()} {
		c := base
		c.Tokenizer, c.Vocab = tok, 24
		f := writeParsed(t, c)
		tokens := f.kv["tokenizer.ggml.tokens"].([]any)
		types := f.kv["tokenizer.ggml.token_type"].([]any)
		if len(tokens) != 24 || tokens[23] != "[PAD23]" || types[23] != int32(TokenUnused) || tokens[16] != "<|im_end|>" {
			t.Errorf("%s: %d tokens, last %v", c.Arch, len(tokens), tokens[len(tokens)-1])
		}
		if d := f.tensor(t, "token_embd.weight").dims; d[1] != 24 || f.kv["tokenizer.ggml.model"] != "gpt2" || f.kv["tokenizer.ggml.pre"] != "qwen2" {
			t.Errorf("%s: embeddings %v, model %v", c.Arch, d, f.kv["tokenizer.ggml.model"])
		}
		if _, ok := f.kv["tokenizer.ggml.scores"]; ok {
			t.Errorf("%s: a gpt2 tokenizer has no scores", c.Arch)
		}
		c.Vocab = 20
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "the tokenizer has 21 tokens") {
			t.Errorf("%s: a vocabulary smaller than the tokenizer: %v", c.Arch, err)
		}
	}
	if fmt.Sprint(tok.metadata(tok.Size())[2].val) != fmt.Sprint(tok.Tokens) {
		t.Error("metadata at the tokenizer's size pads nothing")
	}
}
