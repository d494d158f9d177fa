//go:build llama && cgo

package cudallama

import (
	"errors"
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
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

func newTokenizer(v llama.Vocab) (*tokenizer, error) {
	if v.NTokens() <= 0 {
		return nil, errors.New("the model's vocabulary is empty")
	}
	toks, longest := v.SpecialTokens()
	special := make([]prompt.Token, 0, len(toks))
	for _, t := range toks {
		special = append(special, prompt.Token{ID: t.ID, Text: t.Text, Control: t.Control, LStrip: t.LStrip, RStrip: t.RStrip})
	}
	t := &tokenizer{special: prompt.NewVocab(special)}
	t.maxTokenBytes = maxTokenBytes(v.Bytewise(), longest, special)
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

// llamaTokenize is llama_tokenize of text, a prompt's: none for no text.
func llamaTokenize(v llama.Vocab, text string, addSpecial, parseSpecial bool) ([]int32, error) {
	if text == "" {
		return nil, nil
	}
	toks, err := v.Tokenize(text, addSpecial, parseSpecial)
	if err != nil {
		return nil, fmt.Errorf("%w: tokenizing the prompt failed", iface.ErrBadRequest)
	}
	return toks, nil
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
