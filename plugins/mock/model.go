package mock

import (
	"fmt"
	"math"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// The vocabulary: one token per byte value, plus EOS.
const (
	EOS    = 256
	NVocab = 257
)

// Constants of the mock "model". Changing any of them changes every sequence
// and every state, so they are part of the format (see stateVersion).
const (
	golden   = 0x9E3779B97F4A7C15 // 2^64/φ: Weyl increment
	hashSeed = 0x6D6F636B2D736571 // running hash of the empty sequence ("mock-seq")
	kvSalt   = 0x6D6F636B2D6B7631 // separates KV seeds from token choice ("mock-kv1")
	eosEvery = 509                // the hash maps to EOS once in ~509 tokens
	nCands   = 4                  // candidates a sampler with temperature picks from
)

// alphabet is what generated tokens are drawn from: letters roughly weighted
// by English frequency, spaces and a little punctuation, so decoded text
// looks like text.
const alphabet = "eeeeeeeeeeeetttttttttaaaaaaaooooooiiiiiinnnnnnsssssshhhhhrrrrrdddllllcccuuummwwffggyyppbbvkjxqz" +
	"                    ,,..!?'"

// mix64 is the splitmix64 finaliser: a cheap, well-distributed 64-bit mix.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// step extends the running hash of a sequence by one token: O(1) per token,
// so the next token depends on the whole sequence without rescanning it.
func step(h uint64, tok int32) uint64 {
	return mix64(h ^ (uint64(uint32(tok))+1)*golden)
}

// seqHash is the running hash of a whole sequence.
func seqHash(tokens []int32) uint64 {
	h := uint64(hashSeed)
	for _, t := range tokens {
		h = step(h, t)
	}
	return h
}

// greedy is the most likely token after a sequence whose running hash is h.
func greedy(h uint64) int32 {
	if h%eosEvery == 0 {
		return EOS
	}
	return int32(alphabet[(h>>20)%uint64(len(alphabet))])
}

// candidate k (0 = greedy) after hash h, in decreasing likelihood.
func candidate(h uint64, k int) int32 {
	if k == 0 {
		return greedy(h)
	}
	return int32(alphabet[(mix64(h+uint64(k)*golden)>>20)%uint64(len(alphabet))])
}

// logprob of candidate k after hash h, in (−5, 0].
func logprob(h uint64, k int) float32 {
	u := float64(mix64(h^kvSalt)>>11) / (1 << 53) // [0, 1)
	return float32(-3.5*u - 0.25*float64(k))
}

// logits after hash h: NVocab values with the candidates on top, in order, so
// that the arg-max is the greedy token.
func logits(h uint64) []float32 {
	l := make([]float32, NVocab)
	for v := range l {
		u := float64(mix64(h+uint64(v+1)*golden)>>11) / (1 << 53)
		l[v] = float32(-3 - 7*u) // [−10, −3)
	}
	for k := nCands - 1; k >= 0; k-- {
		l[candidate(h, k)] = float32(-0.5 * float64(k))
	}
	return l
}

// sample picks the next token after hash h: greedy at temperature 0,
// otherwise one of the top candidates chosen by a PRNG seeded from the seed
// and the sequence, so a given (seed, sequence) always continues alike.
// Candidates the request rules out (EOS with ignore_eos, a token biased to
// -100 or below) give way to the next one. It returns the candidate's rank.
func sample(h uint64, p iface.SamplerParams) (int32, int) {
	n := nCands
	if p.TopK > 0 && int(p.TopK) < n {
		n = int(p.TopK)
	}
	k := 0
	if p.Temperature > 0 && !math.IsNaN(float64(p.Temperature)) && n > 1 {
		k = int(mix64(h^mix64(p.Seed+golden)) % uint64(n))
	}
	for ; k < nCands+len(alphabet); k++ {
		if tok := candidate(h, k); !ruledOut(tok, p) {
			return tok, k
		}
	}
	return int32(' '), k // every candidate banned: the mock's filler
}

// ruledOut reports whether the request forbids tok.
func ruledOut(tok int32, p iface.SamplerParams) bool {
	if tok == EOS && p.IgnoreEOS {
		return true
	}
	b, ok := p.LogitBias[tok]
	return ok && b <= -100
}

// alternatives are the n most likely candidates after hash h with their
// log-probabilities, most likely first.
func alternatives(h uint64, n int) []iface.TokenProb {
	top := make([]iface.TokenProb, 0, n)
	for k := range min(n, nCands) {
		tok := candidate(h, k)
		top = append(top, iface.TokenProb{ID: tok, Text: piece(tok), Logprob: logprob(h, k)})
	}
	return top
}

// Tokenize returns the tokens of s: one per byte, the id being its value.
func Tokenize(s string) []int32 {
	t := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		t[i] = int32(s[i])
	}
	return t
}

// piece is the text of a token; EOS has none. Bytes ≥ 0x80 are single bytes
// of a UTF-8 sequence, returned raw as llama.cpp does for byte tokens.
func piece(tok int32) string {
	if tok < 0 || tok >= EOS {
		return ""
	}
	return string([]byte{byte(tok)})
}

// RenderChat applies the mock's chat template: "<|role|>\ncontent\n" per
// message, then "<|assistant|>\n" to prompt the reply.
func RenderChat(msgs []iface.Message) string {
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString("<|")
		sb.WriteString(m.Role)
		sb.WriteString("|>\n")
		sb.WriteString(m.Content)
		sb.WriteByte('\n')
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String()
}

// promptTokens validates a prefill request's prompt and returns its tokens.
func promptTokens(req iface.PrefillRequest, nCtx int) ([]int32, error) {
	if err := req.CheckPrompt(NVocab); err != nil {
		return nil, err
	}
	toks := req.Tokens
	switch {
	case req.Text != "":
		toks = Tokenize(req.Text)
	case len(req.Messages) > 0:
		toks = Tokenize(RenderChat(req.Messages))
	}
	if len(toks) > nCtx {
		return nil, fmt.Errorf("%w: prompt has %d tokens, n_ctx is %d", iface.ErrBadRequest, len(toks), nCtx)
	}
	return toks, nil
}
