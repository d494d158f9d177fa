//go:build llama && cgo

package cudallama

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "gpuselect.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// CUDADriverLibrary is the CUDA driver the plugin asks for the GPUs.
const CUDADriverLibrary = "libcuda.so.1"

// errNoGPU means the CUDA driver is missing or sees no GPU: run on CPU.
var errNoGPU = errors.New("no CUDA GPU")

// queryGPUs asks the CUDA driver library lib for its CUDA release and the
// compute capability of every visible GPU (CUDA_VISIBLE_DEVICES applies);
// errNoGPU when the library cannot be loaded, the driver fails to start or
// there is no device, so a machine without a driver runs on CPU.
func queryGPUs(lib string) (gpuInfo, error) {
	cs := C.CString(lib)
	defer C.free(unsafe.Pointer(cs))
	var info C.hydra_cuda_info
	if rc := C.hydra_cuda_query(cs, &info); rc != 0 {
		return gpuInfo{}, fmt.Errorf("%w: %s", errNoGPU, C.GoString(&info.err[0]))
	}
	if info.count == 0 {
		return gpuInfo{}, fmt.Errorf("%w: the CUDA driver lists no device", errNoGPU)
	}
	g := gpuInfo{driver: cudaVersion{int(info.driver) / 1000, int(info.driver) % 1000 / 10}}
	for i := range int(info.count) {
		g.devices = append(g.devices, computeCap{int(info.major[i]), int(info.minor[i])})
		g.names = append(g.names, C.GoString(&info.name[i][0]))
	}
	return g, nil
}
