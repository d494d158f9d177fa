// Package llama is the plugin's binding to llama.cpp and the CUDA driver: the
// only package with cgo and the C/C++ files, so that its callers see Go
// values (int32 tokens, strings, errors) and no C type.
//
// Its Go files build only with the tag "llama" and cgo (see mk/llama.mk);
// without them the package is this file alone, so plain `go build ./...`
// needs neither cgo nor the llama.cpp tree.
//
// It holds the GPUs, host pinning, the model's load with its placement
// overrides, the vocabulary, llama.cpp's init and log, the context with its batch and state streaming,
// the sampler chains (with grammars and the reasoning budget), common/chat,
// quantisation swaps and combined mode, the draft context and embeddings are
// here (issue 52 item 1); the adapter keeps the policy, the messages and the
// logs.
package llama
