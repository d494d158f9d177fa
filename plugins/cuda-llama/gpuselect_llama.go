//go:build llama && cgo

package cudallama

import (
	"errors"
	"fmt"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
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
	d, err := llama.QueryCUDA(lib)
	if err != nil {
		return gpuInfo{}, fmt.Errorf("%w: %v", errNoGPU, err)
	}
	if len(d.Devices) == 0 {
		return gpuInfo{}, fmt.Errorf("%w: the CUDA driver lists no device", errNoGPU)
	}
	g := gpuInfo{driver: cudaVersion{d.Version / 1000, d.Version % 1000 / 10}}
	for _, dev := range d.Devices {
		g.devices = append(g.devices, computeCap{dev.Major, dev.Minor})
		g.names = append(g.names, dev.Name)
	}
	return g, nil
}
