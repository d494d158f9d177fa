//go:build llama && cgo

package cudallama

import (
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// specialTokens is BackendInfo.Special: the vocabulary's special tokens as
// llama.cpp names them (LLAMA_TOKEN_NULL, -1, is iface.NoToken) and what
// llama_tokenize's add_special adds, which the front end builds infill and
// rerank prompts of as llama-server does.
func (m *model) specialTokens() *iface.SpecialTokens {
	t := iface.SpecialTokens(m.vocab.Markers())
	return &t
}

// rerankTemplate is the model's chat template named "rerank"
// (tokenizer.chat_template.rerank), "" where it has none.
func (m *model) rerankTemplate() string {
	t, _ := m.m.ChatTemplate("rerank")
	return t
}

// describeVocab fills in what the front end builds prompts of token ids
// from: the special tokens, the rerank template, and n_batch as llama-server
// takes it for infill: the option given (not llama.cpp's cap at n_ctx),
// with embeddings capped at n_ubatch, as llama-server caps it then.
func (e *engine) describeVocab(opts llamaopt.Options) {
	e.info.Special = e.model.specialTokens()
	e.info.RerankTemplate = e.model.rerankTemplate()
	e.info.NBatch = opts.NBatch
	if opts.Embeddings {
		e.info.NBatch = min(opts.NBatch, opts.NUBatch)
	}
}
