//go:build llama && cgo

package cudallama

// What the adapter's remaining cgo files (sampler chains, common/chat, the
// drafter, swaps and combined mode, embeddings) share until they move into
// internal/llama: the C++ standard of their .cpp files (cgo directives are
// package-wide) and the model as C types. Delete it with the last of them.

/*
#cgo CXXFLAGS: -std=c++17
#include "llama.h"
*/
import "C"

// cmodel is the model for the adapter's cgo (draft contexts, swaps,
// combined mode, embeddings, common/chat) until that moves into the binding.
func (m *model) cmodel() *C.struct_llama_model { return (*C.struct_llama_model)(m.m.Ptr()) }

// cvocab is the vocabulary for the adapter's cgo (sampler chains, grammars).
func (m *model) cvocab() *C.struct_llama_vocab { return (*C.struct_llama_vocab)(m.vocab.Ptr()) }
