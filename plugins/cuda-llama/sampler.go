//go:build llama && cgo

package cudallama

import (
	"slices"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
)

// sampler is one decode's sampler chain (llama.Sampler): the request's
// biases and penalties over llama.cpp's samplers, the draw from a uniform
// number of the seed and the position. Used by one goroutine at a time.
type sampler struct {
	c      *llama.Sampler
	m      *model // the alternatives' texts
	seed   uint64
	nTop   int
	topIDs []int32
	topLP  []float32
}

// newSampler builds the chain for p; history is the sequence so far, whose
// last repeat_last_n tokens the penalties start from. seqCtx is what
// repeat_last_n -1 (the whole sequence) looks back over, and the most any
// window does (penaltyWindow).
func newSampler(m *model, p iface.SamplerParams, nTop, seqCtx int, history []int32) (*sampler, error) {
	lastN := penaltyWindow(p, seqCtx)
	lp := llama.SamplerParams{
		Temp: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP,
		RepeatPenalty: p.RepeatPenalty, RepeatLastN: int32(lastN), PresencePenalty: p.PresencePenalty,
		FrequencyPenalty: p.FrequencyPenalty, IgnoreEOS: p.IgnoreEOS,
	}
	for _, id := range slices.Sorted(func(yield func(int32) bool) {
		for id := range p.LogitBias {
			if !yield(id) {
				return
			}
		}
	}) {
		lp.Bias = append(lp.Bias, llama.LogitBias{Token: id, Bias: p.LogitBias[id]})
	}
	c, err := llama.NewSampler(m.vocab, lp)
	if err != nil {
		return nil, err
	}
	s := &sampler{c: c, m: m, seed: p.Seed, nTop: nTop}
	if nTop > 0 {
		s.topIDs, s.topLP = make([]int32, nTop), make([]float32, nTop)
	}
	for _, t := range history[max(len(history)-lastN, 0):] {
		c.Accept(t)
	}
	return s, nil
}

func (s *sampler) free() { s.c.Free() }

// Sample picks the token at position pos from logits (n_vocab floats, C or
// Go memory), with its log-probability and alternatives when asked, and
// adds it to the penalties' history.
func (s *sampler) Sample(logits []float32, pos int, wantLogprob bool) iface.Token {
	tok, lp, nOut := s.c.Sample(logits, uniform(s.seed, pos), wantLogprob, s.topIDs, s.topLP)
	s.c.Accept(tok)
	t := iface.Token{ID: tok, Logprob: lp}
	for i := range nOut {
		id := s.topIDs[i]
		t.Top = append(t.Top, iface.TokenProb{ID: id, Text: s.m.Piece(id), Logprob: s.topLP[i]})
	}
	return t
}
