//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "combined.h"
#include "ggml-backend.h"
*/
import "C"

import "unsafe"

// LayerSplit is where a model's layers are.
type LayerSplit struct {
	// Runs is the devices of the layers as runs of layers per device
	// ("0-23:CUDA0,24-47:CUDA1").
	Runs string
	// Mode is llama.cpp's split mode: 0 none, 1 layer, 2 row.
	Mode int
}

// LayerSplit is where the model's layers are, read from llama.cpp's model
// (combined.cpp), which has no public API for it.
func (m Model) LayerSplit() LayerSplit {
	var buf [1024]C.char
	mode := C.hydra_model_layer_split(m.p, &buf[0], C.size_t(len(buf)))
	return LayerSplit{Runs: C.GoString(&buf[0]), Mode: int(mode)}
}

// DeviceMemory is a ggml device's free and total memory (bytes), ok false
// when ggml has no device of that name.
func DeviceMemory(name string) (free, total int64, ok bool) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	dev := C.ggml_backend_dev_by_name(cs)
	if dev == nil {
		return 0, 0, false
	}
	var f, t C.size_t
	C.ggml_backend_dev_memory(dev, &f, &t)
	return int64(f), int64(t), true
}
