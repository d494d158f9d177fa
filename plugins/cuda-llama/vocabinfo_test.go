package cudallama

import (
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/prompt"
)

func TestMaxTokenBytes(t *testing.T) {
	plain := []prompt.Token{{ID: 1, Text: "<|im_end|>", Control: true}, {ID: 2, Text: "<think>"}}
	for _, c := range []struct {
		name     string
		bytewise bool
		longest  int
		special  []prompt.Token
		want     int
	}{
		{"BPE", true, 42, plain, 42},
		{"no specials", true, 7, nil, 7},
		{"normalizing tokenizer", false, 42, plain, 0},
		{"no pieces", true, 0, plain, 0},
		{"lstrip token", true, 42, append(plain, prompt.Token{ID: 3, Text: "<mask>", LStrip: true}), 0},
		{"rstrip token", true, 42, append(plain, prompt.Token{ID: 3, Text: "<|end|>", Control: true, RStrip: true}), 0},
	} {
		if got := maxTokenBytes(c.bytewise, c.longest, c.special); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
