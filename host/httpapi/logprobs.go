package httpapi

import (
	"math"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Log-probabilities in OpenAI's two shapes: chat's choices[].logprobs
// {"content":[{token, logprob, bytes, top_logprobs}]}, and the text API's
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"}. A streamed
// chunk carries those of the tokens generated since the last chunk, so text
// held back (stop strings, split UTF-8) never delays its tokens' entries past
// the next chunk.

// chatLogprob is one position of chat's logprobs.content.
type chatLogprob struct {
	chatAlternative
	TopLogprobs []chatAlternative `json:"top_logprobs"`
}

// textLogprobs is the text API's logprobs object.
type textLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// chatAlternative is a top_logprobs entry: a token without alternatives of
// its own, as OpenAI sends it.
type chatAlternative struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// tokenProbs collects the entries of a completion that asked for them.
type tokenProbs struct {
	chat    bool
	pending []iface.Token
	offset  int // text offset of the next token (text API)
}

func (p *tokenProbs) add(t iface.Token) {
	if p != nil {
		p.pending = append(p.pending, t)
	}
}

// take returns the pending entries in the completion's shape (nil when
// none were asked for) and forgets them.
func (p *tokenProbs) take() any {
	if p == nil {
		return nil
	}
	toks := p.pending
	p.pending = nil
	if p.chat {
		content := make([]chatLogprob, len(toks))
		for i, t := range toks {
			content[i] = chatLogprob{chatAlternative: chatEntry(t.Text, t.Logprob), TopLogprobs: make([]chatAlternative, len(t.Top))}
			for j, c := range t.Top {
				content[i].TopLogprobs[j] = chatEntry(c.Text, c.Logprob)
			}
		}
		return map[string][]chatLogprob{"content": content}
	}
	out := textLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	for _, t := range toks {
		out.Tokens = append(out.Tokens, t.Text)
		out.TokenLogprobs = append(out.TokenLogprobs, t.Logprob)
		top := map[string]float32{}
		for _, c := range t.Top {
			if _, dup := top[c.Text]; !dup { // two tokens may share a piece; the likelier is first
				top[c.Text] = c.Logprob
			}
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, p.offset)
		p.offset += len(t.Text)
	}
	return out
}

func chatEntry(text string, lp float32) chatAlternative {
	return chatAlternative{Token: text, Logprob: lp, Bytes: textBytes(text)}
}

// textBytes is a piece's bytes, as the logprobs' bytes list them.
func textBytes(text string) []int {
	b := make([]int, len(text))
	for i := 0; i < len(text); i++ {
		b[i] = int(text[i])
	}
	return b
}

// nativeProb is a position of llama-server's completion_probabilities: the
// token, its id and bytes, and its alternatives likewise.
type nativeProb struct {
	nativeAlternative
	TopLogprobs []nativeAlternative `json:"top_logprobs"`
}

type nativeAlternative struct {
	ID      int32   `json:"id"`
	Token   string  `json:"token"`
	Bytes   []int   `json:"bytes"`
	Logprob float32 `json:"logprob"`
}

// nativeProbs are toks' entries in llama-server's shape.
func nativeProbs(toks []iface.Token) []nativeProb {
	out := make([]nativeProb, len(toks))
	for i, t := range toks {
		out[i] = nativeProb{nativeAlternative: nativeEntry(t.ID, t.Text, t.Logprob), TopLogprobs: make([]nativeAlternative, len(t.Top))}
		for j, c := range t.Top {
			out[i].TopLogprobs[j] = nativeEntry(c.ID, c.Text, c.Logprob)
		}
	}
	return out
}

// nativeEntry is a token as llama-server writes it: its piece cut before a
// UTF-8 sequence the piece ends inside of (the bytes keep it all), and a
// log-probability of -Inf as the lowest float32, which JSON can carry.
func nativeEntry(id int32, text string, lp float32) nativeAlternative {
	if math.IsInf(float64(lp), -1) {
		lp = -math.MaxFloat32
	}
	return nativeAlternative{ID: id, Token: text[:utf8Whole(text)], Bytes: textBytes(text), Logprob: lp}
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
