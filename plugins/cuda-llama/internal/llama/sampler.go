//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "sampling.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// SamplerParams are a sampler chain's parameters (sampling.cpp).
type SamplerParams struct {
	Temp             float32 // <= 0: greedy
	TopK             int32
	TopP, MinP       float32
	RepeatPenalty    float32
	RepeatLastN      int32 // > 0 when a penalty applies
	PresencePenalty  float32
	FrequencyPenalty float32
	IgnoreEOS        bool        // -inf on every end-of-generation token
	Bias             []LogitBias // applied in this order
}

// LogitBias adds Bias to Token's logit.
type LogitBias struct {
	Token int32
	Bias  float32
}

// Sampler is a slot's sampler chain over llama.cpp's samplers, with the
// grammar and reasoning budget it is given; used by one goroutine at a time.
type Sampler struct{ p *C.hydra_sampler }

// NewSampler builds the chain for p over the vocabulary v: logit biases (and
// -inf on end-of-generation tokens with IgnoreEOS), the penalties, then,
// unless greedy, top-k, top-p, min-p and the temperature.
func NewSampler(v Vocab, p SamplerParams) (*Sampler, error) {
	cp := C.struct_hydra_sampler_params{
		temp: C.float(p.Temp), top_k: C.int32_t(p.TopK), top_p: C.float(p.TopP), min_p: C.float(p.MinP),
		repeat_penalty: C.float(p.RepeatPenalty), repeat_last_n: C.int32_t(p.RepeatLastN),
		presence_penalty: C.float(p.PresencePenalty), frequency_penalty: C.float(p.FrequencyPenalty),
	}
	if p.IgnoreEOS {
		cp.ignore_eos = 1
	}
	if n := len(p.Bias); n > 0 {
		// C memory: the params struct passed to C may point to no Go memory.
		bias := (*C.llama_logit_bias)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.llama_logit_bias{}))))
		defer C.free(unsafe.Pointer(bias))
		bs := unsafe.Slice(bias, n)
		for i, b := range p.Bias {
			bs[i] = C.llama_logit_bias{token: C.llama_token(b.Token), bias: C.float(b.Bias)}
		}
		cp.bias, cp.n_bias = bias, C.int32_t(n)
	}
	s := C.hydra_sampler_new(v.p, &cp)
	if s == nil {
		return nil, errors.New("out of memory for a sampler")
	}
	return &Sampler{p: s}, nil
}

// Free releases the chain, its grammar and its reasoning budget.
func (s *Sampler) Free() { C.hydra_sampler_free(s.p) }

// Accept adds tok to the penalties' history (and the grammar's, and the
// reasoning budget's), as every sampled or replayed token must be.
func (s *Sampler) Accept(tok int32) { C.hydra_sampler_accept(s.p, C.llama_token(tok)) }

// Sample picks a token from logits (the vocabulary's size of them, read in
// place, so a row of llama.cpp's output costs no copy; nil where llama.cpp
// had none for the row): the arg-max of the chain's candidates when greedy,
// else a draw from their softmax with the uniform u in [0, 1). With
// wantLogprob, logprob is the token's log-probability under the raw logits;
// the nTop most likely tokens (raw logits, most likely first, at most
// min(len(topIDs), len(topLP))) go to topIDs and topLP with theirs. It does
// not Accept the token.
func (s *Sampler) Sample(logits []float32, u float64, wantLogprob bool, topIDs []int32, topLP []float32) (tok int32, logprob float32, nTop int) {
	var lp C.float
	var lpp *C.float
	if wantLogprob {
		lpp = &lp
	}
	var ids *C.llama_token
	var lps *C.float
	n := min(len(topIDs), len(topLP))
	if n > 0 {
		ids, lps = (*C.llama_token)(unsafe.Pointer(&topIDs[0])), (*C.float)(unsafe.Pointer(&topLP[0]))
	}
	var lg *C.float // nil where llama.cpp had no logits for the row, as it answers
	if len(logits) > 0 {
		lg = (*C.float)(unsafe.Pointer(&logits[0]))
	}
	var nOut C.int32_t
	t := C.hydra_sample(s.p, lg, C.double(u), lpp, C.int32_t(n), ids, lps, &nOut)
	return int32(t), float32(lp), int(nOut)
}

// SetGrammar gives s the grammar sampler g, which s owns from now on: it
// masks the candidates first, and advances on each token accepted.
func (s *Sampler) SetGrammar(g *Grammar) {
	C.hydra_sampler_set_grammar(s.p, g.p)
	g.p = nil
}

// SetReasoningBudget gives s the reasoning budget rb, which s owns from now
// on, as common_sampler holds it: rb masks the candidates first, before the
// grammar, and sees only the tokens accepted after it was set. With
// gateGrammar (the grammar is lazy) the grammar neither masks nor advances
// while rb counts or forces, and takes the end sequence that closed the
// reasoning.
func (s *Sampler) SetReasoningBudget(rb *ReasoningBudget, gateGrammar bool) {
	gate := C.int(0)
	if gateGrammar {
		gate = 1
	}
	C.hydra_sampler_set_reasoning_budget(s.p, rb.p, gate)
	rb.p = nil
}
