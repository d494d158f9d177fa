//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "llama.h"

// hydra_vocab_scan writes the ids of the tokens llama.cpp's tokenizer
// partitions text at (control, user-defined and unknown ones: its
// cache_special_tokens) to ids, which has room for every token, and returns
// how many; *longest is the longest piece of any token, special tokens'
// text included, in bytes.
static int32_t hydra_vocab_scan(const struct llama_vocab * v, llama_token * ids, int32_t * longest) {
	const int32_t n = llama_vocab_n_tokens(v);
	int32_t k = 0, mx = 0;
	char buf[256];
	for (llama_token t = 0; t < n; t++) {
		if (llama_vocab_get_attr(v, t) & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_USER_DEFINED | LLAMA_TOKEN_ATTR_UNKNOWN)) {
			ids[k++] = t;
		}
		int32_t l = llama_token_to_piece(v, t, buf, sizeof buf, 0, true);
		if (l < 0) {
			l = -l; // the room it needs: its length
		}
		if (l > mx) {
			mx = l;
		}
	}
	*longest = mx;
	return k;
}

// hydra_pieces writes the pieces of n tokens one after another into buf of
// cap bytes and returns their length, or minus the length buf needs.
static int64_t hydra_pieces(const struct llama_vocab * v, const llama_token * toks, int32_t n, char * buf, int64_t cap, bool special) {
	int64_t at = 0;
	char tmp[256];
	for (int32_t i = 0; i < n; i++) {
		int32_t l = llama_token_to_piece(v, toks[i], tmp, sizeof tmp, 0, special);
		if (l < 0) {
			return INT64_MIN; // a piece longer than any token's: not a vocabulary this reads
		}
		if (at + l <= cap) {
			memcpy(buf + at, tmp, l);
		}
		at += l;
	}
	return at <= cap ? at : -at;
}
*/
import "C"

import (
	"errors"
	"math"
	"strings"
	"unsafe"
)

// Vocab is a model's vocabulary, valid while the model is.
type Vocab struct{ p *C.struct_llama_vocab }

// NTokens is the vocabulary's size.
func (v Vocab) NTokens() int { return int(C.llama_vocab_n_tokens(v.p)) }

// Bytewise reports whether the vocabulary is BPE or SentencePiece, whose
// tokens' pieces concatenate to the text.
func (v Vocab) Bytewise() bool {
	typ := C.llama_vocab_type(v.p)
	return typ == C.LLAMA_VOCAB_TYPE_BPE || typ == C.LLAMA_VOCAB_TYPE_SPM
}

// Token is a token llama.cpp's tokenizer partitions text at.
type Token struct {
	ID             int32
	Text           string
	Control        bool // control or unknown: its text is not content
	LStrip, RStrip bool // it eats the spaces on its left, its right
}

// SpecialTokens are the tokens llama.cpp's tokenizer partitions text at
// (control, user-defined and unknown ones: its cache_special_tokens), and
// longest is the longest piece of any token, special tokens' text included,
// in bytes.
func (v Vocab) SpecialTokens() (special []Token, longest int) {
	n := v.NTokens()
	if n <= 0 {
		return nil, 0
	}
	ids := make([]C.llama_token, n)
	var clongest C.int32_t
	k := int(C.hydra_vocab_scan(v.p, &ids[0], &clongest))
	special = make([]Token, 0, k)
	for _, id := range ids[:k] {
		attr := C.llama_vocab_get_attr(v.p, id)
		special = append(special, Token{
			ID:      int32(id),
			Text:    C.GoString(C.llama_vocab_get_text(v.p, id)),
			Control: attr&(C.LLAMA_TOKEN_ATTR_CONTROL|C.LLAMA_TOKEN_ATTR_UNKNOWN) != 0,
			LStrip:  attr&C.LLAMA_TOKEN_ATTR_LSTRIP != 0,
			RStrip:  attr&C.LLAMA_TOKEN_ATTR_RSTRIP != 0,
		})
	}
	return special, int(clongest)
}

// ErrTokenize is llama_tokenize's failure (a text it cannot tokenize).
var ErrTokenize = errors.New("llama_tokenize failed")

// Tokenize is llama_tokenize of text: addSpecial adds BOS (and EOS) as the
// vocabulary says, parseSpecial reads special tokens' text as the tokens.
func (v Vocab) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	// llama.cpp only reads the bytes during the call: a Go string without
	// pointers may be passed as it is, and an empty one as any valid pointer.
	var empty byte
	cs := (*C.char)(unsafe.Pointer(&empty))
	if text != "" {
		cs = (*C.char)(unsafe.Pointer(unsafe.StringData(text)))
	}
	toks := make([]int32, len(text)+8)
	for {
		n := C.llama_tokenize(v.p, cs, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&toks[0])),
			C.int32_t(len(toks)), C.bool(addSpecial), C.bool(parseSpecial))
		if n >= 0 {
			return toks[:n], nil
		}
		if n == C.INT32_MIN || int(-n) <= len(toks) {
			return nil, ErrTokenize
		}
		toks = make([]int32, -n)
	}
}

// Piece is a token's text; with special false control tokens have none. Byte
// tokens give single bytes, possibly part of a UTF-8 sequence, as llama.cpp
// returns them.
func (v Vocab) Piece(tok int32, special bool) string {
	var buf [128]C.char
	n := C.llama_token_to_piece(v.p, C.llama_token(tok), &buf[0], C.int32_t(len(buf)), 0, C.bool(special))
	if n >= 0 {
		return C.GoStringN(&buf[0], n)
	}
	big := make([]byte, -n)
	n = C.llama_token_to_piece(v.p, C.llama_token(tok), (*C.char)(unsafe.Pointer(&big[0])), C.int32_t(len(big)), 0, C.bool(special))
	if n < 0 {
		return ""
	}
	return string(big[:n])
}

// Text is the pieces of toks written one after another, as Piece writes
// each, in one call into llama.cpp: a call a token made a long prompt's
// text cost more than its evaluation.
func (v Vocab) Text(toks []int32, special bool) string {
	if len(toks) == 0 {
		return ""
	}
	buf := make([]byte, 8*len(toks))
	for {
		n := int64(C.hydra_pieces(v.p, (*C.llama_token)(unsafe.Pointer(&toks[0])), C.int32_t(len(toks)),
			(*C.char)(unsafe.Pointer(&buf[0])), C.int64_t(len(buf)), C.bool(special)))
		switch {
		case n == math.MinInt64: // a piece over 256 bytes: each one on its own
			var sb strings.Builder
			for _, t := range toks {
				sb.WriteString(v.Piece(t, special))
			}
			return sb.String()
		case n >= 0:
			return string(buf[:n])
		}
		buf = make([]byte, -n)
	}
}

// IsEOG reports whether tok ends generation (EOS, EOT, ...).
func (v Vocab) IsEOG(tok int32) bool { return bool(C.llama_vocab_is_eog(v.p, C.llama_token(tok))) }

// BOS is the beginning-of-sequence token, -1 if none.
func (v Vocab) BOS() int32 { return int32(C.llama_vocab_bos(v.p)) }

// EOS is the end-of-sequence token, -1 if none.
func (v Vocab) EOS() int32 { return int32(C.llama_vocab_eos(v.p)) }

// AddsBOS reports whether tokenizing with add_special adds BOS at the start.
func (v Vocab) AddsBOS() bool { return bool(C.llama_vocab_get_add_bos(v.p)) }

// Markers are the vocabulary's special token ids (-1: none) and what
// tokenizing with add_special adds.
type Markers struct {
	BOS, EOS, SEP                                  int32
	FIMPre, FIMSuf, FIMMid, FIMPad, FIMRep, FIMSep int32
	AddBOS, AddEOS, AddSEP                         bool
}

// Markers are the vocabulary's special token ids.
func (v Vocab) Markers() Markers {
	p := v.p
	return Markers{
		BOS: v.BOS(), EOS: v.EOS(), SEP: int32(C.llama_vocab_sep(p)),
		FIMPre: int32(C.llama_vocab_fim_pre(p)), FIMSuf: int32(C.llama_vocab_fim_suf(p)), FIMMid: int32(C.llama_vocab_fim_mid(p)),
		FIMPad: int32(C.llama_vocab_fim_pad(p)), FIMRep: int32(C.llama_vocab_fim_rep(p)), FIMSep: int32(C.llama_vocab_fim_sep(p)),
		AddBOS: v.AddsBOS(), AddEOS: bool(C.llama_vocab_get_add_eos(p)), AddSEP: bool(C.llama_vocab_get_add_sep(p)),
	}
}
