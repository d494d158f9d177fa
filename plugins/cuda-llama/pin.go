//go:build llama && cgo

package cudallama

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>

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

import "unsafe"

// pinRegion pins region (the shared-memory ring, an mmap, not Go memory)
// for DMA and returns the function that unpins it, or nil when it could not
// be pinned (no CUDA runtime loaded, or the driver refused): then copies go
// through the driver's bounce buffer.
func pinRegion(region []byte) func() {
	if len(region) == 0 {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(region))
	if C.hydra_pin(p, C.size_t(len(region))) == 0 {
		return nil
	}
	return func() { C.hydra_unpin(p) }
}
