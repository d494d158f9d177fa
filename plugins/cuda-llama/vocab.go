//go:build llama && cgo

package cudallama

/*
#include <stdlib.h>
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
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/prompt"
)

// tokenizer is what tokenizing a prompt needs of a model's vocabulary,
// computed once at load.
type tokenizer struct {
	special *prompt.Vocab
	// prefix and suffix are what llama_tokenize's add_special puts around a
	// text (BOS; EOS where the vocabulary adds it).
	prefix, suffix []int32
	// maxTokenBytes is BackendInfo.MaxTokenBytes (0: not known).
	maxTokenBytes int
}

func newTokenizer(v *C.struct_llama_vocab) (*tokenizer, error) {
	n := int(C.llama_vocab_n_tokens(v))
	if n <= 0 {
		return nil, errors.New("the model's vocabulary is empty")
	}
	ids := make([]C.llama_token, n)
	var longest C.int32_t
	k := int(C.hydra_vocab_scan(v, &ids[0], &longest))
	special := make([]prompt.Token, 0, k)
	for _, id := range ids[:k] {
		attr := C.llama_vocab_get_attr(v, id)
		special = append(special, prompt.Token{
			ID:      int32(id),
			Text:    C.GoString(C.llama_vocab_get_text(v, id)),
			Control: attr&(C.LLAMA_TOKEN_ATTR_CONTROL|C.LLAMA_TOKEN_ATTR_UNKNOWN) != 0,
			LStrip:  attr&C.LLAMA_TOKEN_ATTR_LSTRIP != 0,
			RStrip:  attr&C.LLAMA_TOKEN_ATTR_RSTRIP != 0,
		})
	}
	t := &tokenizer{special: prompt.NewVocab(special)}
	typ := C.llama_vocab_type(v)
	t.maxTokenBytes = maxTokenBytes(typ == C.LLAMA_VOCAB_TYPE_BPE || typ == C.LLAMA_VOCAB_TYPE_SPM, int(longest), special)
	// What add_special adds, from llama.cpp itself: a probe text's ids with
	// and without it.
	const probe = "a"
	with, err := llamaTokenize(v, probe, true, false)
	if err != nil {
		return nil, err
	}
	without, err := llamaTokenize(v, probe, false, false)
	if err != nil {
		return nil, err
	}
	var ok bool
	if t.prefix, t.suffix, ok = prompt.Around(with, without); !ok {
		return nil, fmt.Errorf("the tokenizer gives %q %v, and %v with its special tokens added: not the same ids with tokens around them", probe, without, with)
	}
	return t, nil
}

// llamaTokenize is llama_tokenize of text.
func llamaTokenize(v *C.struct_llama_vocab, text string, addSpecial, parseSpecial bool) ([]int32, error) {
	if text == "" {
		return nil, nil
	}
	// llama.cpp only reads the bytes during the call: a Go string without
	// pointers may be passed as it is.
	cs := (*C.char)(unsafe.Pointer(unsafe.StringData(text)))
	toks := make([]int32, len(text)+4)
	for {
		n := C.llama_tokenize(v, cs, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&toks[0])),
			C.int32_t(len(toks)), C.bool(addSpecial), C.bool(parseSpecial))
		if n >= 0 {
			return toks[:n], nil
		}
		if n == C.INT32_MIN || int(-n) <= len(toks) {
			return nil, fmt.Errorf("%w: tokenizing the prompt failed", iface.ErrBadRequest)
		}
		toks = make([]int32, -n)
	}
}

// tokenizePrompt gives text the ids llama_tokenize with add_special and
// parse_special gives it, except that the control tokens Protect marked with
// mk stay text. The special tokens are split off in Go (prompt.Split, linear
// in the text, where llama.cpp's partition is quadratic in their number) and
// the text between them tokenized with none parsed; more than limit special
// tokens (limit > 0) is refused before any text is tokenized.
func (m *model) tokenizePrompt(text string, mk prompt.Marker, limit int) ([]int32, error) {
	if len(text) > 1<<30 {
		return nil, fmt.Errorf("%w: prompt of %d bytes is too long", iface.ErrBadRequest, len(text))
	}
	pieces, err := m.tok.special.Split(text, true, mk, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %w in the prompt, and a slot holds %d tokens", iface.ErrBadRequest, err, limit)
	}
	// Text that needs more tokens than the slot holds is refused without
	// tokenizing it: no token stands for more than maxTokenBytes bytes.
	if n := len(m.tok.prefix) + len(m.tok.suffix) + prompt.MinTokens(pieces, m.tok.maxTokenBytes); limit > 0 && n > limit {
		return nil, fmt.Errorf("%w: the prompt needs %d tokens at least (no token stands for more than %d bytes), and a slot holds %d",
			iface.ErrBadRequest, n, m.tok.maxTokenBytes, limit)
	}
	return prompt.Encode(pieces, m.tok.prefix, m.tok.suffix, func(s string) ([]int32, error) {
		return llamaTokenize(m.vocab, s, false, false)
	})
}
