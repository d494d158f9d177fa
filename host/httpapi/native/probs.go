package native

import (
	"math"

	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's completion_probabilities: each position's token, its id
// and bytes, and its alternatives likewise.

// prob is a position of completion_probabilities.
type prob struct {
	alternative
	TopLogprobs []alternative `json:"top_logprobs"`
}

type alternative struct {
	ID      int32   `json:"id"`
	Token   string  `json:"token"`
	Bytes   []int   `json:"bytes"`
	Logprob float32 `json:"logprob"`
}

// probs are toks' entries.
func probs(toks []iface.Token) []prob {
	out := make([]prob, len(toks))
	for i, t := range toks {
		out[i] = prob{alternative: entry(t.ID, t.Text, t.Logprob), TopLogprobs: make([]alternative, len(t.Top))}
		for j, c := range t.Top {
			out[i].TopLogprobs[j] = entry(c.ID, c.Text, c.Logprob)
		}
	}
	return out
}

// entry is a token as llama-server writes it: its piece cut before a
// UTF-8 sequence the piece ends inside of (the bytes keep it all), and a
// log-probability of -Inf as the lowest float32, which JSON can carry.
func entry(id int32, text string, lp float32) alternative {
	if math.IsInf(float64(lp), -1) {
		lp = -math.MaxFloat32
	}
	return alternative{ID: id, Token: text[:utf8Whole(text)], Bytes: textBytes(text), Logprob: lp}
}

// utf8Whole is the length of s without a UTF-8 sequence cut off at its end,
// as llama-server's validate_utf8 measures it.
func utf8Whole(s string) int {
	for i := 1; i <= 4 && i <= len(s); i++ {
		c := s[len(s)-i]
		switch {
		case c&0xE0 == 0xC0 && i < 2, c&0xF0 == 0xE0 && i < 3, c&0xF8 == 0xF0 && i < 4:
			return len(s) - i
		}
	}
	return len(s)
}

// textBytes is a piece's bytes, as the logprobs' bytes list them.
func textBytes(text string) []int {
	b := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		b[i] = int(text[i])
	}
	return b
}
