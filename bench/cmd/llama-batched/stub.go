//go:build !llama || !cgo

package main

import (
	"errors"
	"io"
)

// errNoLlama: without the llama build tag (and cgo) there is no llama.cpp
// to run; the command still builds, so that `go vet ./...` and the tests of
// the measurement need neither.
var errNoLlama = errors.New("built without llama.cpp: build with -tags llama and mk/llama.mk's CGO_* environment (make bench-decode does)")

func openBackend(config, io.Writer) (backend, error) { return nil, errNoLlama }

func tokenizeOnly(config, []string) ([][]int32, error) { return nil, errNoLlama }
