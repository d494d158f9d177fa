//go:build llama && cgo

package llama

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include "llama.h"
#include "placement.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// Model is a loaded llama_model.
type Model struct{ p *C.struct_llama_model }

// Override places the weights whose names match Pattern (a regular
// expression, searched as llama.cpp searches) in Device's memory.
type Override struct{ Pattern, Device string }

// ModelParams are a load's parameters.
type ModelParams struct {
	GPULayers int
	// Mmap maps the file instead of reading it into memory.
	Mmap bool
	// NoAlloc reads the metadata and places the weights without allocating
	// them (a donor's check); it needs Mmap off.
	NoAlloc bool
	// MTP loads the multi-token-prediction block too.
	MTP       bool
	Overrides []Override
}

// OverrideError is an Override llama.cpp cannot use: a pattern its regular
// expressions cannot compile or a device ggml does not have.
type OverrideError struct{ Msg string }

func (e *OverrideError) Error() string { return e.Msg }

// ErrLoad is a load llama.cpp refused; its log says why.
var ErrLoad = errors.New("llama.cpp could not load the model")

// LoadModel loads the model file, each weight whole (no lazy reads of large
// tensors into host memory), because where llama.cpp places a weight is
// where swaps and combined mode find it.
func LoadModel(path string, p ModelParams) (Model, error) {
	list, free, err := overrideList(p.Overrides)
	if err != nil {
		return Model{}, err
	}
	defer free() // llama.cpp reads the list only while the model loads
	mp := C.llama_model_default_params()
	mp.load_mode = C.LLAMA_LOAD_MODE_NONE
	if p.Mmap {
		mp.load_mode = C.LLAMA_LOAD_MODE_MMAP
	}
	mp.lazy_mode = C.LLAMA_LAZY_MODE_OFF
	mp.n_gpu_layers = C.int32_t(p.GPULayers)
	mp.no_alloc = C.bool(p.NoAlloc)
	mp.load_mtp = C.bool(p.MTP)
	mp.tensor_buft_overrides = list
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	m := C.llama_model_load_from_file(cs, mp)
	if m == nil {
		return Model{}, ErrLoad
	}
	return Model{m}, nil
}

// overrideList is llama.cpp's tensor_buft_overrides for rules in C memory,
// with its {NULL, NULL} end, and the function that frees it and the strings
// it points to; nil for no rules.
func overrideList(rules []Override) (*C.struct_llama_model_tensor_buft_override, func(), error) {
	if len(rules) == 0 {
		return nil, func() {}, nil
	}
	var strs []*C.char
	cstr := func(s string) *C.char { c := C.CString(s); strs = append(strs, c); return c }
	patterns, devices := make([]*C.char, len(rules)), make([]*C.char, len(rules))
	for i, r := range rules {
		patterns[i], devices[i] = cstr(r.Pattern), cstr(r.Device)
	}
	list := (*C.struct_llama_model_tensor_buft_override)(C.malloc(C.size_t(len(rules)+1) * C.size_t(unsafe.Sizeof(C.struct_llama_model_tensor_buft_override{}))))
	free := func() {
		C.free(unsafe.Pointer(list))
		for _, s := range strs {
			C.free(unsafe.Pointer(s))
		}
	}
	var msg [512]C.char
	if C.hydra_placement_resolve(&patterns[0], &devices[0], C.size_t(len(rules)), list, &msg[0], C.size_t(len(msg))) < 0 {
		free()
		return nil, nil, &OverrideError{C.GoString(&msg[0])}
	}
	return list, free, nil
}

// Free releases the model; no context may use it.
func (m Model) Free() { C.llama_model_free(m.p) }

// GGUFBlockCount is a GGUF file's layer count from its metadata, -1 if it
// has none; it reads the metadata alone, in milliseconds.
func GGUFBlockCount(path string) int64 {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	return int64(C.hydra_gguf_block_count(cs))
}

// Tensor is where a loaded model's weight is: the buffer holding it and its
// memory ("CPU" for host memory, else the device's name).
type Tensor struct{ Name, Buffer, Memory string }

// Tensors lists the model's weights and where they are.
func (m Model) Tensors() []Tensor {
	out := make([]Tensor, int(C.hydra_model_tensor_count(m.p)))
	for i := range out {
		var name, buffer, memory *C.char
		C.hydra_model_tensor(m.p, C.size_t(i), &name, &buffer, &memory)
		out[i] = Tensor{C.GoString(name), C.GoString(buffer), C.GoString(memory)}
	}
	return out
}

// MatchRules is, for each of Tensors, the index of the first pattern that
// matches its name as llama.cpp matches them, or -1.
func (m Model) MatchRules(patterns []string) []int {
	n := int(C.hydra_model_tensor_count(m.p))
	out := make([]int, n)
	if len(patterns) == 0 || n == 0 {
		for i := range out {
			out[i] = -1
		}
		return out
	}
	cp := make([]*C.char, len(patterns))
	for i, p := range patterns {
		cp[i] = C.CString(p)
		defer C.free(unsafe.Pointer(cp[i]))
	}
	rule := make([]C.int, n)
	C.hydra_placement_assign(m.p, &cp[0], C.size_t(len(cp)), &rule[0])
	for i, r := range rule {
		out[i] = int(r)
	}
	return out
}

// Recurrent reports whether the model's memory is a recurrent state.
func (m Model) Recurrent() bool { return bool(C.llama_model_is_recurrent(m.p)) }

// Hybrid reports whether the model's memory is attention and a recurrent
// state.
func (m Model) Hybrid() bool { return bool(C.llama_model_is_hybrid(m.p)) }

// NSWA is the attention window of a sliding-window model (0: none).
func (m Model) NSWA() int { return int(C.llama_model_n_swa(m.p)) }

// Desc is llama.cpp's one-line description of the model.
func (m Model) Desc() string {
	var buf [256]C.char
	C.llama_model_desc(m.p, &buf[0], C.size_t(len(buf)))
	return C.GoString(&buf[0])
}

// NLayer is the model's layers.
func (m Model) NLayer() int { return int(C.llama_model_n_layer(m.p)) }

// NLayerNextN is the layers of its multi-token-prediction block.
func (m Model) NLayerNextN() int { return int(C.llama_model_n_layer_nextn(m.p)) }

// NEmbd is the embedding size.
func (m Model) NEmbd() int { return int(C.llama_model_n_embd(m.p)) }

// NEmbdOut is the size of the embeddings it outputs.
func (m Model) NEmbdOut() int { return int(C.llama_model_n_embd_out(m.p)) }

// NClsOut is the outputs of a classifier head.
func (m Model) NClsOut() int { return int(C.llama_model_n_cls_out(m.p)) }

// NHead is the attention heads.
func (m Model) NHead() int { return int(C.llama_model_n_head(m.p)) }

// MetaString is a GGUF metadata value as text ("" if the model has none).
func (m Model) MetaString(key string) string {
	k := C.CString(key)
	defer C.free(unsafe.Pointer(k))
	var buf [256]C.char
	if n := C.llama_model_meta_val_str(m.p, k, &buf[0], C.size_t(len(buf))); n < 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

// Vocab is the model's vocabulary.
func (m Model) Vocab() Vocab { return Vocab{C.llama_model_get_vocab(m.p)} }

// ChatTemplate is the model's chat template of that name ("" for its
// default), and whether it has one.
func (m Model) ChatTemplate(name string) (string, bool) {
	var cname *C.char
	if name != "" {
		cname = C.CString(name)
		defer C.free(unsafe.Pointer(cname))
	}
	t := C.llama_model_chat_template(m.p, cname)
	if t == nil {
		return "", false
	}
	return C.GoString(t), true
}

// ChatMessage is one message of a chat.
type ChatMessage struct{ Role, Content string }

// ApplyTemplate renders msgs with the chat template tmpl (one llama.cpp's
// built-in engine recognises, or its name), ending with the assistant's
// turn; false where llama.cpp does not know the template.
func ApplyTemplate(tmpl string, msgs []ChatMessage) (string, bool) {
	ct := C.CString(tmpl)
	defer C.free(unsafe.Pointer(ct))
	n := len(msgs)
	chat := unsafe.Slice((*C.struct_llama_chat_message)(C.malloc(C.size_t(max(n, 1))*C.size_t(unsafe.Sizeof(C.struct_llama_chat_message{})))), n)
	defer C.free(unsafe.Pointer(unsafe.SliceData(chat)))
	total := 0
	for i, msg := range msgs {
		chat[i].role = C.CString(msg.Role)
		chat[i].content = C.CString(msg.Content)
		total += len(msg.Role) + len(msg.Content)
	}
	defer func() {
		for i := range chat {
			C.free(unsafe.Pointer(chat[i].role))
			C.free(unsafe.Pointer(chat[i].content))
		}
	}()
	for size := 2*total + 256; ; {
		buf := C.malloc(C.size_t(size))
		r := C.llama_chat_apply_template(ct, unsafe.SliceData(chat), C.size_t(n), true, (*C.char)(buf), C.int32_t(size))
		if r < 0 {
			C.free(buf)
			return "", false
		}
		if int(r) <= size {
			s := C.GoStringN((*C.char)(buf), r)
			C.free(buf)
			return s, true
		}
		C.free(buf)
		size = int(r)
	}
}
