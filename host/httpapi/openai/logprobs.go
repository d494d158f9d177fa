package openai

import "github.com/hydra-engine/hydra-engine/iface"

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
