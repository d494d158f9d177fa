//go:build llama && cgo

package cudallama

// What the adapter's remaining cgo files (the drafter, swaps and combined mode, embeddings) share until they move into
// internal/llama: the C++ standard of their .cpp files (cgo directives are
// package-wide) and the model as C types. Delete it with the last of them.

/*
#cgo CXXFLAGS: -std=c++17
#include "llama.h"
*/
import "C"

// cmodel is the model for the adapter's cgo (draft contexts, swaps,
// combined mode, embeddings) until that moves into the binding.
func (m *model) cmodel() *C.struct_llama_model { return (*C.struct_llama_model)(m.m.Ptr()) }
