//go:build llama && cgo

package cudallama

import (
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
)

// tokenizeAPI answers a Tokenize with options (iface.TokenizeOptions):
// llama-server's /tokenize (text with its add_special and parse_special),
// /detokenize (token ids to their pieces' text) and /apply-template (a
// chat's rendered prompt, its text alone: tokenizing a long conversation
// costs several times its rendering, and llama-server's does not either).
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
		if err := req.CheckPrompt(e.model.nVocab); err != nil {
			return p, err
		}
		if p.Text, p.OpensThinking, err = e.chat.render(req.Messages, req.Tools, req.TemplateKwargs, contentGuard{}); err != nil { // the text as the template renders it: no guard markers
			return p, err
		}
	case len(req.Tokens) > 0:
		if err := req.CheckPrompt(e.model.nVocab); err != nil {
			return p, err
		}
		p.Tokens = req.Tokens
		p.Text = e.model.vocab.Text(req.Tokens, true)
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
	if text == "" && !addSpecial {
		return []int32{}, nil
	}
	toks, err := m.vocab.Tokenize(text, addSpecial, parseSpecial)
	if err != nil {
		return nil, fmt.Errorf("%w: tokenizing the text failed", iface.ErrBadRequest)
	}
	return toks, nil
}

// specialPiece is a token's text with control tokens written out, as
// llama-server's pieces and /detokenize write them (common_token_to_piece).
func (m *model) specialPiece(tok int32) string { return m.vocab.Piece(tok, true) }
