// Package cudallama is the llama.cpp backend: GGUF models through llama.cpp
// (the tree pinned in mk/llama-pin.mk, fetched from the npm registry and
// built by its CMake into static libraries that cgo links), CUDA on GPU
// machines when libggml-cuda.so is present, CPU otherwise.
//
// The llama.cpp code is behind the build tag "llama" (make build-llama sets it
// and the include and library paths, see mk/llama.mk); without the tag the
// package builds a Backend whose Load fails saying so, so that plain
// `go build ./...` and `go vet ./...` need neither cgo nor the llama.cpp tree.
//
// One llama_context serves every slot: slot i is llama sequence i, in one KV
// cache all slots share (kv_unified, the default) or in a KV stream of its own
// (kv_unified=false); a state is one stream on the wire either way and
// restores into an engine of any slot count and mode. One extra sequence is
// scratch space for re-evaluating the last token after a restore. llama.cpp contexts are not
// safe for concurrent use: one scheduler (sched.go) owns every llama_decode
// and batches the slots' prompts and decodes into shared steps, and a mutex
// (internal/sched's Lock) serialises the context work outside it.
package cudallama
