package cudallama

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Identity of the backend as reported by Info.
const (
	Name    = "cuda-llama"
	Version = "0.2.0"

	// CUDALibrary is the ggml CUDA backend the plugin loads when present, and
	// VersionStampFile the file beside it, written by make cuda, naming the
	// llama.cpp commit it was built from: ggml's structs cross the boundary,
	// so the library and the plugin must come from the same tree.
	CUDALibrary      = "libggml-cuda.so"
	VersionStampFile = "hydra-ggml.version"
)

// backendVersion is what INFO reports as the backend's version: the
// plugin's own and the llama.cpp commit linked in (its first 8 digits).
func backendVersion() string {
	return Version + "+llama.cpp-" + llamaCommit[:min(8, len(llamaCommit))]
}

// versionStamp is the content make cuda writes to VersionStampFile for a
// library built from the llama.cpp tree at commit.
func versionStamp(commit string) string { return "llama.cpp " + commit }

// ErrNotLinked is what every method of a Backend built without llama.cpp
// (no build tag "llama", or no cgo) returns.
var ErrNotLinked = errors.New("hydra-plugin-cuda-llama was built without -tags llama (or without cgo), so llama.cpp is not linked in: build it with `make build-llama`")

// errNoCUDALibrary means there is no libggml-cuda.so to load: run on CPU.
var errNoCUDALibrary = errors.New("no " + CUDALibrary)

// cudaLibrary finds libggml-cuda.so in dir (or beside the executable when dir
// is empty) and checks that its version stamp names the llama.cpp this binary
// was built from: a ggml backend library from other sources would share
// structs with a different layout. errNoCUDALibrary if absent. It checks one
// build; selectCUDALibrary chooses among several (gpuselect.go).
func cudaLibrary(dir string) (string, error) {
	dir = libDirOrExe(dir)
	lib := filepath.Join(dir, CUDALibrary)
	if _, err := os.Stat(lib); err != nil {
		return "", fmt.Errorf("%w in %s", errNoCUDALibrary, dir)
	}
	want := versionStamp(llamaCommit)
	stampPath := filepath.Join(dir, VersionStampFile)
	stamp, err := os.ReadFile(stampPath)
	if err != nil {
		return "", fmt.Errorf("%w: %s has no version stamp (%s: %w); rebuild it with make cuda, which stamps it with %q",
			iface.ErrBadRequest, lib, stampPath, err, want)
	}
	if got := strings.TrimSpace(string(stamp)); got != want {
		return "", fmt.Errorf("%w: %s was built from %q, this plugin from %q; rebuild one of them (make cuda / make build-llama) from the same llama.cpp tree",
			iface.ErrBadRequest, lib, got, want)
	}
	return lib, nil
}
