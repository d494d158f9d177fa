//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "hydra-llama-commit.h"
#include "ggml-backend.h"
#include "shim.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Commit is the commit of the llama.cpp tree this binary was built from, as
// the build read it from the tree (hydra-llama-commit.h), because a CUDA
// build from another tree would corrupt memory.
const Commit = C.HYDRA_LLAMA_COMMIT

var initOnce sync.Once

// Init initialises llama.cpp once per process and routes its logs (and
// ggml's) to Log's lines, because both are process-wide.
func Init() {
	initOnce.Do(func() {
		C.hydra_log_install()
		C.llama_backend_init()
	})
}

// LoadBackend registers a ggml backend library (libggml-cuda.so). Only this
// one library is loaded, because ggml_backend_load_all would also register a
// second CPU backend next to the one linked in.
func LoadBackend(path string) bool {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	return C.ggml_backend_load(cs) != nil
}

// Device is a ggml backend device (a GPU); a nil *Device stands for the CPU,
// because that is what the callers decide on.
type Device struct{ p C.ggml_backend_dev_t }

// FirstGPU is the first GPU device ggml knows, with its name and description,
// or nil, because the plugin runs on one GPU.
func FirstGPU() (*Device, string) {
	for i := C.size_t(0); i < C.ggml_backend_dev_count(); i++ {
		d := C.ggml_backend_dev_get(i)
		switch C.ggml_backend_dev_type(d) {
		case C.GGML_BACKEND_DEVICE_TYPE_GPU, C.GGML_BACKEND_DEVICE_TYPE_IGPU:
			return &Device{d}, C.GoString(C.ggml_backend_dev_name(d)) + " (" + C.GoString(C.ggml_backend_dev_description(d)) + ")"
		}
	}
	return nil, ""
}

// RegisterHostBuffer reports whether the device's backend offers
// ggml_backend_register_host_buffer (ggml-cuda does, through
// ggml_backend_reg_get_proc_address); false for the CPU. It pins existing
// host memory, but only with GGML_CUDA_REGISTER_HOST set and read-only for
// the device (it was made for mmapped weights), so it cannot pin the data
// plane's ring as a copy destination; that needs a writable cudaHostRegister
// (PinHost).
func (d *Device) RegisterHostBuffer() bool {
	if d == nil {
		return false
	}
	name := C.CString("ggml_backend_register_host_buffer")
	defer C.free(unsafe.Pointer(name))
	return C.ggml_backend_reg_get_proc_address(C.ggml_backend_dev_backend_reg(d.p), name) != nil
}

// dev is the device for C, NULL for the CPU.
func (d *Device) dev() C.ggml_backend_dev_t {
	if d == nil {
		return nil
	}
	return d.p
}
