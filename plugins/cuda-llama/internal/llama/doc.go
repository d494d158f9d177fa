// Package llama is the plugin's binding to llama.cpp and the CUDA driver: the
// only package with cgo and the C/C++ files, so that its callers see Go
// values (int32 tokens, strings, errors) and no C type.
//
// Its Go files build only with the tag "llama" and cgo (see mk/llama.mk);
// without them the package is this file alone, so plain `go build ./...`
// needs neither cgo nor the llama.cpp tree.
//
// The binding grows from the adapter (issue 52 item 1): the GPUs, host
// pinning, the model's load with its placement overrides, the vocabulary,
// llama.cpp's init and log, the context with its batch and state streaming,
// the sampler chains (with grammars and the reasoning budget) and common/chat
// are here; the draft context, swaps, combined mode and embeddings are still
// the adapter's cgo, which reaches the model through Model.Ptr and the
// context through Context.Ptr and BatchPtr.
package llama
