//go:build llama && cgo

package cudallama

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

func TestQueryGPUsWithoutDriver(t *testing.T) {
	// A machine without the driver runs on CPU: an error, never a crash.
	_, err := queryGPUs("libhydra-no-such-cuda-driver.so.1")
	if !errors.Is(err, errNoGPU) || !strings.Contains(err.Error(), "libhydra-no-such-cuda-driver.so.1") {
		t.Fatalf("no driver: %v", err)
	}
	// A library that is not the driver.
	if _, err := queryGPUs("libm.so.6"); !errors.Is(err, errNoGPU) || !strings.Contains(err.Error(), "lacks the CUDA driver API") {
		t.Fatalf("libm as the driver: %v", err)
	}
}

// TestQueryGPUs asks this machine's driver: GPUs and capabilities on a GPU
// box, the reason for none elsewhere (HYDRA_TEST_REQUIRE_GPU=1: GPUs must be found).
func TestQueryGPUs(t *testing.T) {
	g, err := queryGPUs(CUDADriverLibrary)
	switch {
	case err != nil && os.Getenv("HYDRA_TEST_REQUIRE_GPU") == "1":
		t.Fatalf("HYDRA_TEST_REQUIRE_GPU=1: %v", err)
	case err != nil:
		if !errors.Is(err, errNoGPU) {
			t.Fatalf("%v is not errNoGPU", err)
		}
		t.Logf("no GPU: %v", err)
	default:
		t.Logf("%s", g.describe())
	}
}

// TestCUDABuildOnDevice proves the choice on a real GPU: with the builds
// beside the test binary (or in HYDRA_TEST_CUDA_LIB_DIR), the plugin must
// choose HYDRA_TEST_CUDA_WANT (e.g. cuda/sm90 on the H200), load it and run
// the tiny model on the GPU (bench/scripts/gpu-cuda-variants.sh).
func TestCUDABuildOnDevice(t *testing.T) {
	want := os.Getenv("HYDRA_TEST_CUDA_WANT")
	if want == "" {
		t.Skip("HYDRA_TEST_CUDA_WANT names the build this GPU should get")
	}
	dir := libDirOrExe(os.Getenv("HYDRA_TEST_CUDA_LIB_DIR"))
	g, err := queryGPUs(CUDADriverLibrary)
	if err != nil {
		t.Fatal(err)
	}
	lib, note, problems, err := selectCUDALibrary(dir, func() (gpuInfo, error) { return g, nil })
	if err != nil || len(problems) > 0 {
		t.Fatalf("%v (problems: %v)", err, problems)
	}
	t.Logf("chose %s: %s", lib, note)
	if lib != filepath.Join(dir, want, CUDALibrary) {
		t.Fatalf("chose %s, want %s", lib, filepath.Join(dir, want, CUDALibrary))
	}
	b := load(t, tiny(t), 1, map[string]string{llamaopt.OptLibDir: dir})
	prefill(t, b, 0, story)
	e := b.eng.Load()
	if e.device == "" || gpuLoad.lib != lib {
		t.Fatalf("device %q, library loaded %q: want the GPU through %s", e.device, gpuLoad.lib, lib)
	}
	t.Logf("device %s", e.device)
}

// TestLoadWithBuildsWithoutGPU: CUDA builds present on a machine whose
// driver finds no GPU (or that has none): Load runs on CPU, and never loads a
// library (the fake one here would not load).
func TestLoadWithBuildsWithoutGPU(t *testing.T) {
	if _, err := queryGPUs(CUDADriverLibrary); err == nil {
		t.Skip("this machine has a GPU")
	}
	dir := t.TempDir()
	writeBuild(t, filepath.Join(dir, CUDABuildsDir, "sm90"), versionStamp(llamaCommit), "cuda 13.0\narchs 90\n")
	b := load(t, tiny(t), 1, map[string]string{llamaopt.OptLibDir: dir})
	if e := b.eng.Load(); e.device != "" {
		t.Fatalf("device %q without a GPU", e.device)
	}
}
