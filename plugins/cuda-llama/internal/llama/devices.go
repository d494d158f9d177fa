//go:build llama && cgo

package llama

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include "gpuselect.h"

// The CUDA runtime that libggml-cuda.so already loaded, found at run time so
// the plugin itself links no CUDA. cudaHostRegister(ptr, size, flags) and
// cudaHostUnregister(ptr) return cudaError_t, 0 on success.
typedef int (*hydra_host_register_fn)(void *, size_t, unsigned int);
typedef int (*hydra_host_unregister_fn)(void *);
static hydra_host_register_fn hydra_reg;
static hydra_host_unregister_fn hydra_unreg;

static int hydra_cudart(void) {
	static const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
	if (hydra_reg && hydra_unreg) return 1;
	for (int i = 0; names[i]; i++) {
		void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
		if (!h) continue;
		hydra_reg = (hydra_host_register_fn)dlsym(h, "cudaHostRegister");
		hydra_unreg = (hydra_host_unregister_fn)dlsym(h, "cudaHostUnregister");
		if (hydra_reg && hydra_unreg) return 1;
	}
	return 0;
}

// cudaHostRegisterPortable (1): pinned for every device and context, and
// writable, so device-to-host copies can land in it.
static int hydra_pin(void *p, size_t n) { return hydra_cudart() && hydra_reg(p, n, 1) == 0; }
static void hydra_unpin(void *p) { if (hydra_unreg) hydra_unreg(p); }
*/
import "C"

import (
	"errors"
	"unsafe"
)

// CUDADriver is what the CUDA driver says before any CUDA library is loaded.
type CUDADriver struct {
	Version int          // cuDriverGetVersion: 13000 is CUDA 13.0
	Devices []CUDADevice // the visible GPUs (CUDA_VISIBLE_DEVICES applies)
}

// CUDADevice is one GPU: its compute capability and name.
type CUDADevice struct {
	Major, Minor int
	Name         string
}

// QueryCUDA asks the CUDA driver library lib (libcuda.so.1) for its release
// and its GPUs, through dlopen so that a machine without the driver gets an
// error rather than a failed start; no devices is not an error.
func QueryCUDA(lib string) (CUDADriver, error) {
	cs := C.CString(lib)
	defer C.free(unsafe.Pointer(cs))
	var info C.hydra_cuda_info
	if rc := C.hydra_cuda_query(cs, &info); rc != 0 {
		return CUDADriver{}, errors.New(C.GoString(&info.err[0]))
	}
	d := CUDADriver{Version: int(info.driver)}
	for i := range int(info.count) {
		d.Devices = append(d.Devices, CUDADevice{int(info.major[i]), int(info.minor[i]), C.GoString(&info.name[i][0])})
	}
	return d, nil
}

// PinHost pins region (shared memory or an mmap, not Go memory) for DMA and
// returns the function that unpins it, or nil when it could not be pinned
// (no CUDA runtime loaded, or the driver refused): then copies go through the
// driver's bounce buffer.
func PinHost(region []byte) func() {
	if len(region) == 0 {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(region))
	if C.hydra_pin(p, C.size_t(len(region))) == 0 {
		return nil
	}
	return func() { C.hydra_unpin(p) }
}
