package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-model", "m.gguf", "-c", "1, 2,8", "-systems", "ours,ceiling", "-slots", "8"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.conc, []int{1, 2, 8}) || !o.has("ours") || o.has("ollama") || o.slots != 8 {
		t.Errorf("%+v", o)
	}
	if !strings.HasSuffix(o.plugin, "/bin/hydra-plugin-cuda-llama") || !strings.HasPrefix(o.model, "/") {
		t.Errorf("paths not made absolute: %q %q", o.plugin, o.model)
	}
	for _, bad := range [][]string{
		{},
		{"-model", "m", "-c", "1,1"},
		{"-model", "m", "-c", "0"},
		{"-model", "m", "-systems", "vllm"},
		{"-model", "m", "-api", "grpc"},
		{"-model", "m", "-ctx", "256"},
		{"-model", "m", "-n", "1"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The prompt-size lists take the sizes measured (32 K, 128 K tokens); the
// concurrency list stays within 255 streams.
func TestParseTokenLists(t *testing.T) {
	o, err := parseFlags([]string{"-model", "m", "-systems", "", "-checkpoint-tokens", "32768,131072", "-agent-tokens", "4096"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.ckptTokens, []int{32768, 131072}) || !slices.Equal(o.agentTokens, []int{4096}) {
		t.Errorf("checkpoint %v, agent %v", o.ckptTokens, o.agentTokens)
	}
	for _, bad := range [][]string{
		{"-model", "m", "-c", "256"},
		{"-model", "m", "-systems", "", "-agent-tokens", "32"},
		{"-model", "m", "-systems", "", "-checkpoint-tokens", "2000000"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestPromptTextIsDeterministicAndVaries(t *testing.T) {
	a, b := promptText(7, 50), promptText(7, 50)
	if a != b {
		t.Error("the same seed gave two texts")
	}
	c := promptText(8, 50)
	if strings.Fields(a)[0] == strings.Fields(c)[0] && a[:20] == c[:20] {
		t.Errorf("seeds 7 and 8 start alike: %q / %q", a[:20], c[:20])
	}
	if n := len(strings.Fields(a)); n != 50 {
		t.Errorf("%d words, want 50", n)
	}
}

func TestMachineTag(t *testing.T) {
	for _, tc := range []struct {
		gpus []string
		want string
	}{
		{nil, "cpu"},
		{[]string{"NVIDIA H200, 570.86.15, 143771 MiB"}, "h200"},
		{[]string{"NVIDIA GeForce RTX 4090, 550.1, 24564 MiB"}, "4090"},
		{[]string{"NVIDIA A100-SXM4-80GB, 535, 81920 MiB"}, "a100"},
	} {
		if got := (machine{GPUs: tc.gpus}).tag(); got != tc.want {
			t.Errorf("%v: tag %q, want %q", tc.gpus, got, tc.want)
		}
	}
}

func TestOllamaRunner(t *testing.T) {
	log := `msg="starting runner" cmd="/b/ollama runner --ollama-engine --port 1"
msg="starting runner" cmd="/b/ollama runner --model /m/blobs/sha256-x --port 2"`
	if got := ollamaRunner(log); !strings.HasPrefix(got, "llamarunner") {
		t.Errorf("got %q: the discovery runner (no --model) must not count", got)
	}
	if got := ollamaRunner(`msg="starting runner" cmd="/b/ollama runner --ollama-engine --model /m --port 2"`); !strings.HasPrefix(got, "ollamarunner") {
		t.Errorf("got %q", got)
	}
}
