package main

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
)

// backendSpec is the plugin the engines run: the mock by default (its state
// size set by kv_bytes_per_token), or any plugin with a model, prefilled with
// raw token ids (the llama.cpp plugin on a GPU box).
type backendSpec struct {
	plugin  string   // path, or "" for BIN/hydra-plugin-mock
	model   string   // --model
	opts    []string // --backend-opt key=value
	kvBytes int      // mock only
	tokens  int      // > 0: prefill this many raw token ids instead of the mock's chat prompt
}

func (s backendSpec) mock() bool { return s.plugin == "" }

func (s backendSpec) path(bin string) string {
	if s.mock() {
		return filepath.Join(bin, "hydra-plugin-mock")
	}
	return s.plugin
}

// args are the engine flags that configure the backend (its path is
// --backend, which enginetest gives).
func (s backendSpec) args() []string {
	var a []string
	if s.mock() {
		a = append(a, "--backend-opt", fmt.Sprintf("kv_bytes_per_token=%d", s.kvBytes))
	}
	if s.model != "" {
		a = append(a, "--model", s.model)
	}
	for _, kv := range s.opts {
		a = append(a, "--backend-opt", kv)
	}
	return a
}

// describe names the state in the report.
func (s backendSpec) describe() string {
	if s.mock() {
		return fmt.Sprintf("a mock state, kv_bytes_per_token=%d", s.kvBytes)
	}
	return fmt.Sprintf("a %s state of %d prefilled tokens, model %s, options %s",
		filepath.Base(s.plugin), s.tokens, filepath.Base(s.model), strings.Join(s.opts, " "))
}

// tokenPrompt is a PREFILL payload of n raw u32 token ids, all below 256 so
// any vocabulary holds them, varied so no cache trick can shorten the work.
func tokenPrompt(n int) []byte {
	b := make([]byte, 0, 4*n)
	for i := range n {
		b = binary.LittleEndian.AppendUint32(b, uint32(3+(i*31)%250))
	}
	return b
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }
