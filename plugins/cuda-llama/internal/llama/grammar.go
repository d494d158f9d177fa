//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "chatcommon.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// JSONSchemaGrammar is the GBNF of a JSON schema (JSON text), as
// llama-server's json_schema field (common/json-schema-to-grammar); an error
// for an invalid schema.
func JSONSchemaGrammar(schema string) (string, error) {
	cs := C.CString(schema)
	defer C.free(unsafe.Pointer(cs))
	var cerr *C.char
	out := C.hydra_json_schema_grammar(cs, &cerr)
	if out == nil {
		return "", errors.New(commonString(cerr))
	}
	return commonString(out), nil
}

// CheckGrammar parses a GBNF grammar: nil when it is valid, else the
// parser's error.
func CheckGrammar(grammar string) error {
	cg := C.CString(grammar)
	defer C.free(unsafe.Pointer(cg))
	if why := C.hydra_grammar_check(cg); why != nil {
		return errors.New(commonString(why))
	}
	return nil
}

// Grammar is a grammar sampler, for a Sampler to take over (SetGrammar).
type Grammar struct{ p *C.struct_llama_sampler }

// NewGrammar builds the grammar sampler for spec, a JSON object
// {"grammar","lazy","triggers":[{"type","value","token"}],"prefill"}, as
// common_sampler_init builds one: a lazy grammar waits for a trigger;
// prefill is text already in the prompt that the grammar starts after.
func NewGrammar(v Vocab, spec []byte) (*Grammar, error) {
	s, err := newCommonSampler(v, spec, func(v *C.struct_llama_vocab, spec *C.char, cerr **C.char) *C.struct_llama_sampler {
		return C.hydra_grammar_new(v, spec, cerr)
	})
	if err != nil {
		return nil, err
	}
	return &Grammar{p: s}, nil
}

// Free releases a grammar that no Sampler took.
func (g *Grammar) Free() { freeCommonSampler(&g.p) }

// ReasoningBudget is llama.cpp's reasoning-budget sampler
// (common/reasoning-budget), for a Sampler to take over
// (SetReasoningBudget).
type ReasoningBudget struct{ p *C.struct_llama_sampler }

// NewReasoningBudget builds the reasoning budget for spec, a JSON object
// {"start","ends":[…],"message","budget","prefill"}, as common_sampler_init
// builds it from llama-server's reasoning_budget_* fields: the message and
// the first end tag forced when the budget runs out, a negative budget
// unbounded, and the generation prompt (prefill) accepted first, so that a
// prompt which opens the reasoning starts the count.
func NewReasoningBudget(v Vocab, spec []byte) (*ReasoningBudget, error) {
	s, err := newCommonSampler(v, spec, func(v *C.struct_llama_vocab, spec *C.char, cerr **C.char) *C.struct_llama_sampler {
		return C.hydra_reasoning_budget_new(v, spec, cerr)
	})
	if err != nil {
		return nil, err
	}
	return &ReasoningBudget{p: s}, nil
}

// Free releases a reasoning budget that no Sampler took.
func (rb *ReasoningBudget) Free() { freeCommonSampler(&rb.p) }

// newCommonSampler builds a llama.cpp sampler from spec's JSON with build.
func newCommonSampler(v Vocab, spec []byte, build func(*C.struct_llama_vocab, *C.char, **C.char) *C.struct_llama_sampler) (*C.struct_llama_sampler, error) {
	cs := C.CString(string(spec))
	defer C.free(unsafe.Pointer(cs))
	var cerr *C.char
	s := build(v.p, cs, &cerr)
	if s == nil {
		return nil, errors.New(commonString(cerr))
	}
	return s, nil
}

// freeCommonSampler frees *p, a llama.cpp sampler no Sampler took, once.
func freeCommonSampler(p **C.struct_llama_sampler) {
	if *p != nil {
		C.llama_sampler_free(*p)
		*p = nil
	}
}
