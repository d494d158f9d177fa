//go:build llama && cgo

package cudallama

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>

// The CUDA driver API of the libcuda.so.1 the CUDA runtime already loaded,
// found at run time like pin.go's runtime calls, so the plugin links no CUDA.
// Each returns CUresult, 0 on success.
typedef int (*hydra_dev_count_fn)(int *);
typedef int (*hydra_dev_get_fn)(int *, int);
typedef int (*hydra_ctx_state_fn)(int, unsigned int *, int *);
typedef int (*hydra_ctx_flags_fn)(int, unsigned int);

// hydra_cuda_sched sets the scheduling bits (CU_CTX_SCHED_MASK, 0x07) of
// every device's primary context to sched, keeping its other flags. Since
// CUDA 11 the flags of an active primary context may change too. Returns
// the number of devices set, or -1 when the driver API is not loaded, -2
// when a call fails, -3 when the flags read back are not the ones set
// (*failed_at: the device).
static int hydra_cuda_sched(unsigned int sched, int *failed_at) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) return -1;
	hydra_dev_count_fn count = (hydra_dev_count_fn)dlsym(h, "cuDeviceGetCount");
	hydra_dev_get_fn get = (hydra_dev_get_fn)dlsym(h, "cuDeviceGet");
	hydra_ctx_state_fn state = (hydra_ctx_state_fn)dlsym(h, "cuDevicePrimaryCtxGetState");
	hydra_ctx_flags_fn set = (hydra_ctx_flags_fn)dlsym(h, "cuDevicePrimaryCtxSetFlags_v2");
	if (!count || !get || !state || !set) return -1;
	int n = 0;
	if (count(&n) != 0) { *failed_at = -1; return -2; }
	for (int i = 0; i < n; i++) {
		int dev;
		unsigned int flags;
		int active;
		*failed_at = i;
		if (get(&dev, i) != 0 || state(dev, &flags, &active) != 0) return -2;
		if (set(dev, (flags & ~0x07u) | sched) != 0) return -2;
		if (state(dev, &flags, &active) != 0) return -2;
		if ((flags & 0x07u) != sched) return -3; // the driver kept others
	}
	return n;
}
*/
import "C"

import "fmt"

// CUDA's scheduling flags (CU_CTX_SCHED_*) by cuda_sync option value.
var cudaSyncFlags = map[string]C.uint{"auto": 0, "spin": 1, "yield": 2, "block": 4}

// setCUDASync makes CUDA wait for the GPU the way mode says (option
// cuda_sync) in every device's primary context. Call it once the CUDA
// backend is loaded.
func setCUDASync(mode string) error {
	var at C.int
	switch n := C.hydra_cuda_sched(cudaSyncFlags[mode], &at); n {
	case -1:
		return fmt.Errorf("%s=%s: the CUDA driver API (libcuda.so.1) is not loaded", OptCUDASync, mode)
	case -2:
		return fmt.Errorf("%s=%s: setting device %d's primary context flags failed", OptCUDASync, mode, int(at))
	case -3:
		return fmt.Errorf("%s=%s: device %d's primary context kept other scheduling flags", OptCUDASync, mode, int(at))
	}
	return nil
}
