//go:build llama && cgo

package cudallama

/*
#include <stdlib.h>
#include "sampling.h"
*/
import "C"

import (
	"errors"
	"slices"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
)

// sampler is one decode's sampler chain (sampling.cpp): the request's
// biases and penalties over llama.cpp's samplers, the draw from a uniform
// number of the seed and the position. Used by one goroutine at a time.
type sampler struct {
	c      *C.hydra_sampler
	m      *model // the alternatives' texts
	seed   uint64
	nTop   int
	topIDs []C.llama_token
	topLP  []C.float
}

// newSampler builds the chain for p; history is the sequence so far, whose
// last repeat_last_n tokens the penalties start from. seqCtx is what
// repeat_last_n -1 (the whole sequence) looks back over, and the most any
// window does (penaltyWindow).
func newSampler(m *model, p iface.SamplerParams, nTop, seqCtx int, history []int32) (*sampler, error) {
	cp := C.struct_hydra_sampler_params{
		temp: C.float(p.Temperature), top_k: C.int32_t(p.TopK), top_p: C.float(p.TopP), min_p: C.float(p.MinP),
		repeat_penalty: C.float(p.RepeatPenalty), presence_penalty: C.float(p.PresencePenalty),
		frequency_penalty: C.float(p.FrequencyPenalty),
	}
	lastN := penaltyWindow(p, seqCtx)
	cp.repeat_last_n = C.int32_t(lastN)
	if p.IgnoreEOS {
		cp.ignore_eos = 1
	}
	var bias *C.llama_logit_bias
	if n := len(p.LogitBias); n > 0 {
		bias = (*C.llama_logit_bias)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.llama_logit_bias{}))))
		defer C.free(unsafe.Pointer(bias))
		bs := unsafe.Slice(bias, n)
		ids := slices.Sorted(func(yield func(int32) bool) {
			for id := range p.LogitBias {
				if !yield(id) {
					return
				}
			}
		})
		for i, id := range ids {
			bs[i] = C.llama_logit_bias{token: C.llama_token(id), bias: C.float(p.LogitBias[id])}
		}
		cp.bias, cp.n_bias = bias, C.int32_t(n)
	}
	c := C.hydra_sampler_new(m.cvocab(), &cp)
	if c == nil {
		return nil, errors.New("out of memory for a sampler")
	}
	s := &sampler{c: c, m: m, seed: p.Seed, nTop: nTop}
	if nTop > 0 {
		s.topIDs, s.topLP = make([]C.llama_token, nTop), make([]C.float, nTop)
	}
	for _, t := range history[max(len(history)-lastN, 0):] {
		C.hydra_sampler_accept(c, C.llama_token(t))
	}
	return s, nil
}

func (s *sampler) free() { C.hydra_sampler_free(s.c) }

// Sample picks the token at position pos from logits (n_vocab floats, C or
// Go memory), with its log-probability and alternatives when asked, and
// adds it to the penalties' history.
func (s *sampler) Sample(logits []float32, pos int, wantLogprob bool) iface.Token {
	var lp C.float
	var lpp *C.float
	if wantLogprob {
		lpp = &lp
	}
	var nOut C.int32_t
	var ids *C.llama_token
	var lps *C.float
	if s.nTop > 0 {
		ids, lps = &s.topIDs[0], &s.topLP[0]
	}
	var lg *C.float // nil where llama.cpp had no logits for the row, as it answers
	if len(logits) > 0 {
		lg = goLogits(logits)
	}
	tok := C.hydra_sample(s.c, lg, C.double(uniform(s.seed, pos)), lpp, C.int32_t(s.nTop), ids, lps, &nOut)
	C.hydra_sampler_accept(s.c, tok)
	t := iface.Token{ID: int32(tok), Logprob: float32(lp)}
	for i := range int(nOut) {
		id := int32(s.topIDs[i])
		t.Top = append(t.Top, iface.TokenProb{ID: id, Text: s.m.Piece(id), Logprob: float32(s.topLP[i])})
	}
	return t
}

// goLogits passes a Go slice of logits to sample.
func goLogits(l []float32) *C.float { return (*C.float)(unsafe.Pointer(&l[0])) }
