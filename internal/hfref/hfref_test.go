package hfref

import (
	"path/filepath"
	"slices"
	"testing"
)

// The gguf package's tiny tokenizer fixture, through Hugging Face's code.
var fixture = filepath.Join("..", "..", "plugins", "cuda-llama", "gguf", "testdata", "tokenizer")

func TestEncode(t *testing.T) {
	got := Encode(t, fixture, true, "hello world!", "<|im_start|>hello<think>", "")
	want := [][]int{{11, 12, 3, 6, 2, 7, 13}, {15, 11, 17}, {}}
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("text %d: ids %v, want %v", i, got[i], want[i])
		}
	}
}

func TestRender(t *testing.T) {
	got := Render(t, fixture, Chat{
		Messages:            []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}},
		AddGenerationPrompt: true,
	})
	const want = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("rendered %q, want %q", got, want)
	}
}

func TestAdded(t *testing.T) {
	got := Added(t, fixture)
	if len(got) != 6 || got[3] != (AddedToken{ID: 17, Content: "<think>", RoundTrip: "<think>"}) {
		t.Errorf("added tokens %+v", got)
	}
}
