//go:build llama && cgo

package cudallama

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
)

// tokenizeAPI answers a Tokenize with options (iface.TokenizeOptions):
// llama-server's /tokenize (text with its add_special and parse_special),
// /detokenize (token ids to their pieces' text) and /apply-template (a
// chat's rendered prompt, and its tokens as a prompt).
func (e *engine) tokenizeAPI(req iface.PrefillRequest) (iface.Prompt, error) {
	o := req.Tokenize
	req.Tokenize = nil
	var p iface.Prompt
	var err error
	switch {
	case len(req.Messages) > 0:
		if e.chat == nil {
			return p, fmt.Errorf("%w: the rendered prompt needs the Jinja template (the backend runs with jinja=false)", iface.ErrNotImplemented)
		}
		if p.Text, p.OpensThinking, err = e.chat.render(req.Messages, req.Tools, req.TemplateKwargs, contentGuard{}); err != nil { // the text as the template renders it: no guard markers
			return p, err
		}
		if p.Tokens, _, err = e.promptTokens(req); err != nil {
			return p, err
		}
	case len(req.Tokens) > 0:
		if err := req.CheckPrompt(e.model.nVocab); err != nil {
			return p, err
		}
		p.Tokens = req.Tokens
		var sb strings.Builder
		for _, t := range req.Tokens {
			sb.WriteString(e.model.specialPiece(t))
		}
		p.Text = sb.String()
	default:
		if p.Tokens, err = e.model.tokenizeWith(req.Text, o.AddSpecial, o.ParseSpecial); err != nil {
			return p, err
		}
	}
	if o.WithPieces {
		for _, t := range p.Tokens {
			p.Pieces = append(p.Pieces, e.model.specialPiece(t))
		}
	}
	return p, nil
}

// tokenizeWith tokenizes text as llama-server's /tokenize does
// (common_tokenize with its add_special and parse_special).
func (m *model) tokenizeWith(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	if len(text) > 1<<30 {
		return nil, fmt.Errorf("%w: text of %d bytes is too long", iface.ErrBadRequest, len(text))
	}
	toks := make([]int32, len(text)+8)
	if text == "" && !addSpecial {
		return []int32{}, nil
	}
	cs := C.CString(text)
	defer C.free(unsafe.Pointer(cs))
	for {
		n := C.llama_tokenize(m.vocab, cs, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&toks[0])),
			C.int32_t(len(toks)), C.bool(addSpecial), C.bool(parseSpecial))
		if n >= 0 {
			return toks[:n], nil
		}
		if n == C.INT32_MIN || int(-n) <= len(toks) {
			return nil, fmt.Errorf("%w: tokenizing the text failed", iface.ErrBadRequest)
		}
		toks = make([]int32, -n)
	}
}

// specialPiece is a token's text with control tokens written out, as
// llama-server's pieces and /detokenize write them (common_token_to_piece).
func (m *model) specialPiece(tok int32) string {
	var buf [128]C.char
	n := C.llama_token_to_piece(m.vocab, C.llama_token(tok), &buf[0], C.int32_t(len(buf)), 0, true)
	if n >= 0 {
		return C.GoStringN(&buf[0], n)
	}
	big := make([]byte, -n)
	n = C.llama_token_to_piece(m.vocab, C.llama_token(tok), (*C.char)(unsafe.Pointer(&big[0])), C.int32_t(len(big)), 0, true)
	if n < 0 {
		return ""
	}
	return string(big[:n])
}
