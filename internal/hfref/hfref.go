// Package hfref gives tests Hugging Face's own answers for a tokenizer: the
// ids its tokenizer gives a text and the prompt its chat template renders,
// from tests/hf/hf.mjs, which runs Hugging Face's JavaScript tokenizer
// (@huggingface/tokenizers, as transformers.js uses it) and template engine
// (@huggingface/jinja) under node. Tests of our tokenization and templates
// compare with these.
//
// A test that needs the tool skips, saying what to install, when node or
// tests/hf's dependencies (make hf-ref) are missing; any other failure of
// the tool fails the test.
package hfref

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Chat is a chat-template request: the conversation, the tools offered,
// whether to open the assistant's turn, and extra template variables
// (enable_thinking, reasoning_effort, …), as apply_chat_template takes them.
type Chat struct {
	Messages            []map[string]any `json:"messages"`
	Tools               []map[string]any `json:"tools,omitempty"`
	Documents           []map[string]any `json:"documents,omitempty"`
	AddGenerationPrompt bool             `json:"add_generation_prompt"`
	Kwargs              map[string]any   `json:"kwargs,omitempty"`
}

// AddedToken is an added token of tokenizer.json and what the tokenizer
// decodes it back to when it encodes it alone.
type AddedToken struct {
	ID        int    `json:"id"`
	Content   string `json:"content"`
	Special   bool   `json:"special"`
	RoundTrip string `json:"roundtrip"`
}

// Encode is the ids Hugging Face's tokenizer in dir gives each text, with
// special tokens in the text parsed as such (as Hugging Face always does)
// and, with addSpecial, the tokens its post-processor adds (Hugging Face's
// default). tokenizers.js adds only what tokenizer.json's post-processor
// says: a LlamaTokenizerFast's add_bos_token (DeepSeek V3's), which Python
// transformers and llama.cpp honour, adds no BOS here.
func Encode(t testing.TB, dir string, addSpecial bool, texts ...string) [][]int {
	t.Helper()
	var out struct {
		IDs [][]int `json:"ids"`
	}
	run(t, "encode", dir, map[string]any{"texts": texts, "add_special_tokens": addSpecial}, &out)
	if len(out.IDs) != len(texts) {
		t.Fatalf("hfref: %d answers for %d texts", len(out.IDs), len(texts))
	}
	return out.IDs
}

// Render is the prompt the chat template of the tokenizer in dir renders
// for chat, with the tokenizer's special tokens (bos_token, eos_token, …)
// defined as transformers.js defines them.
func Render(t testing.TB, dir string, chat Chat) string {
	t.Helper()
	var out struct {
		Text string `json:"text"`
	}
	run(t, "render", dir, chat, &out)
	return out.Text
}

// Added lists the added tokens of the tokenizer in dir with what each
// decodes back to.
func Added(t testing.TB, dir string) []AddedToken {
	t.Helper()
	var out struct {
		Tokens []AddedToken `json:"tokens"`
	}
	run(t, "added", dir, nil, &out)
	return out.Tokens
}

// TokenizerDir is bin/tokenizers/FAMILY, the tokenizer make tokenizers
// fetches (qwen3, llama3, gptoss, deepseek_v3); the test skips while it is
// not there.
func TokenizerDir(t testing.TB, family string) string {
	t.Helper()
	dir := filepath.Join(Root(t), "bin", "tokenizers", family)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("hfref: no %s tokenizer in %s: make tokenizers", family, dir)
	}
	return dir
}

// Root is the module's root: the nearest folder above the working
// directory (a test's package folder) with a go.mod.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("hfref: no go.mod above the working directory")
		}
		dir = up
	}
}

// tool is the node binary and tests/hf/hf.mjs, or a skip naming what is
// missing.
func tool(t testing.TB) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("hfref: node is not installed (the Hugging Face reference runs under node)")
	}
	hf := filepath.Join(Root(t), "tests", "hf")
	for _, dep := range []string{"@huggingface/tokenizers", "@huggingface/jinja"} {
		if _, err := os.Stat(filepath.Join(hf, "node_modules", dep, "package.json")); err != nil {
			t.Skipf("hfref: %s is not installed in %s: make hf-ref", dep, hf)
		}
	}
	return node, filepath.Join(hf, "hf.mjs")
}

// run sends req to hf.mjs CMD DIR and decodes its answer into out.
func run(t testing.TB, cmd, dir string, req, out any) {
	t.Helper()
	node, script := tool(t)
	in, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(node, script, cmd, abs)
	c.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	b, err := c.Output()
	if err != nil {
		t.Fatalf("hfref: %s %s: %v: %s", cmd, dir, err, stderr.Bytes())
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("hfref: %s %s: answer %q: %v", cmd, dir, b, err)
	}
}
