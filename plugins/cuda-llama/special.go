//go:build llama && cgo

package cudallama

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// specialTokens is BackendInfo.Special: the vocabulary's special tokens as
// llama.cpp names them (LLAMA_TOKEN_NULL, -1, is iface.NoToken) and what
// llama_tokenize's add_special adds, which the front end builds infill and
// rerank prompts of as llama-server does.
func (m *model) specialTokens() *iface.SpecialTokens {
	v := m.vocab
	return &iface.SpecialTokens{
		BOS: int32(C.llama_vocab_bos(v)), EOS: int32(C.llama_vocab_eos(v)), SEP: int32(C.llama_vocab_sep(v)),
		FIMPre: int32(C.llama_vocab_fim_pre(v)), FIMSuf: int32(C.llama_vocab_fim_suf(v)), FIMMid: int32(C.llama_vocab_fim_mid(v)),
		FIMPad: int32(C.llama_vocab_fim_pad(v)), FIMRep: int32(C.llama_vocab_fim_rep(v)), FIMSep: int32(C.llama_vocab_fim_sep(v)),
		AddBOS: bool(C.llama_vocab_get_add_bos(v)), AddEOS: bool(C.llama_vocab_get_add_eos(v)), AddSEP: bool(C.llama_vocab_get_add_sep(v)),
	}
}

// rerankTemplate is the model's chat template named "rerank"
// (tokenizer.chat_template.rerank), "" where it has none.
func (m *model) rerankTemplate() string {
	name := C.CString("rerank")
	defer C.free(unsafe.Pointer(name))
	if t := C.llama_model_chat_template(m.m, name); t != nil {
		return C.GoString(t)
	}
	return ""
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
