package httpapi

import (
	"context"

	"github.com/hydra-engine/hydra-engine/iface"
)

// textTokens tokenizes texts through one backend: the tokenin.Tokenizer of
// /embeddings, /rerank and /infill.
type textTokens struct {
	ctx context.Context
	b   iface.Backend
}

// Tokenize is common_tokenize of s: BOS/EOS added as the vocabulary adds
// them with addSpecial, special tokens' text read as them with
// parseSpecial. An empty text without addSpecial has no tokens, whatever
// the backend.
func (t textTokens) Tokenize(s string, addSpecial, parseSpecial bool) ([]int32, error) {
	if s == "" && !addSpecial {
		return nil, nil
	}
	p, err := t.b.Tokenize(t.ctx, iface.PrefillRequest{Text: s, Tokenize: &iface.TokenizeOptions{AddSpecial: addSpecial, ParseSpecial: parseSpecial}})
	return p.Tokens, err
}
