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
// quantisation swaps and combined mode (Swap, Model.LayerSplit), the draft
// context (Draft) and embeddings are here; the context, the batch, the
// sampler chains, state streaming and common/chat are still the adapter's
// cgo, which reaches the model through Model.Ptr and Vocab.Ptr.
package llama
