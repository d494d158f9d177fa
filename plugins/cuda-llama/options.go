// Package cudallama is the llama.cpp backend: GGUF models through llama.cpp
// (from the github.com/ollama/ollama module, pinned in go.mod, compiled by
// cgo), CUDA on GPU machines when libggml-cuda.so is present, CPU otherwise.
//
// The llama.cpp code is behind the build tag "llama" (make build-llama sets it
// and the include paths, see mk/llama.mk); without the tag the package builds
// a Backend whose Load fails saying so, so that plain `go build ./...` and
// `go vet ./...` need neither cgo nor the llama.cpp sources.
//
// One llama_context serves every slot: slot i is llama sequence i in a unified
// KV cache (kv_unified, so a state is one stream and restores into an engine
// with any slot count), and one extra sequence is scratch space for
// re-evaluating the last token after a restore. llama.cpp contexts are not
// safe for concurrent use, so a mutex serialises context work; the host runs
// different slots concurrently and they take turns, token by token in
// decodes.
package cudallama

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Identity of the backend as reported by Info.
const (
	Name    = "cuda-llama"
	Version = "0.1.0"

	// LlamaModule is the Go module whose llama.cpp and ggml sources are
	// compiled in; PinnedLlamaVersion is its version in go.mod (a test keeps
	// the two in step). The internal interfaces used for state streaming
	// change between llama.cpp versions, and libggml-cuda.so must be built
	// from the same source.
	LlamaModule        = "github.com/ollama/ollama"
	PinnedLlamaVersion = "v0.17.4"

	// CUDALibrary is the ggml CUDA backend the plugin loads when present, and
	// VersionStampFile the file beside it, written by make cuda, naming the
	// module version it was built from.
	CUDALibrary      = "libggml-cuda.so"
	VersionStampFile = "hydra-ggml.version"
)

// Option keys understood by Load (--backend-opt key=value).
const (
	OptNCtx           = "n_ctx"           // KV cells shared by all slots (unified cache); each slot may use them all
	OptNBatch         = "n_batch"         // tokens per llama_decode call in a prefill
	OptNUBatch        = "n_ubatch"        // physical batch
	OptNThreads       = "n_threads"       // CPU threads for generation; default half the CPUs, at most 16
	OptNThreadsBatch  = "n_threads_batch" // CPU threads for prompt processing
	OptNGPULayers     = "n_gpu_layers"    // layers on the GPU; -1 = all (when a GPU is present)
	OptFlashAttn      = "flash_attn"      // on (default), off, auto
	OptCacheTypeK     = "cache_type_k"    // KV cache element type: f16 (default), f32, bf16, q8_0, q4_0
	OptCacheTypeV     = "cache_type_v"
	OptLibDir         = "lib_dir" // where libggml-cuda.so is; default: beside the plugin binary
	OptAlias          = "alias"   // model alias; default: the file name without .gguf
	OptMmap           = "use_mmap"
	OptPinRing        = "pin_ring"         // on a GPU, pin the data plane's ring for DMA (default true)
	OptCopyThreads    = "copy_threads"     // goroutines copying a restore out of the data plane's ring (default 1)
	OptStreamRestore  = "stream_restore"   // auto (default), true, false: upload blocks restored through the restore ring piece by piece as they arrive (see shim.cpp)
	OptCUDASync       = "cuda_sync"        // how a thread waits for the GPU: auto (CUDA's default), spin, yield, block
	OptRestoreInPlace = "restore_in_place" // take restores from the shm ring's buffers where they are (default true)
	// OptRestoreLogits: when a restored state carries no logits, compute them
	// by the first DECODE that needs them (lazy, the default, as the reference
	// engine's "just restored" flag does) or within STATE_PUT (eager).
	OptRestoreLogits = "restore_logits"
)

var knownOptions = []string{OptAlias, OptCacheTypeK, OptCacheTypeV, OptFlashAttn, OptLibDir, OptNBatch, OptNCtx,
	OptNGPULayers, OptNThreads, OptNThreadsBatch, OptNUBatch, OptMmap, OptPinRing, OptCopyThreads, OptStreamRestore, OptCUDASync, OptRestoreInPlace, OptRestoreLogits}

// Defaults and limits.
const (
	DefaultNCtx    = 4096
	DefaultNBatch  = 2048
	DefaultNUBatch = 512
	// DefaultCopyThreads: one memmove. On the H200 box four goroutines copy
	// out of the ring at ~21 GB/s against ~6.5 for one, and make a restore
	// alone 40% faster, but an end-to-end STATE_PUT is bound by the host's
	// socket read there and gains nothing (docs/benchmarks/README.md).
	DefaultCopyThreads = 1
	maxNCtx            = 1 << 24
	maxThreads         = 512
	// MaxSlots: llama.cpp allows 256 sequences, one is our scratch sequence.
	MaxSlots      = 255
	DefaultNSlots = 4
)

// Flash attention modes (llama_flash_attn_type).
const (
	FlashAuto = -1
	FlashOff  = 0
	FlashOn   = 1
)

func flashName(mode int) string {
	switch mode {
	case FlashOn:
		return "on"
	case FlashOff:
		return "off"
	}
	return "auto"
}

// options are the parsed load options.
type options struct {
	nCtx, nBatch, nUBatch   int
	nThreads, nThreadsBatch int
	nGPULayers              int // -1: all
	flashAttn               int
	cacheTypeK, cacheTypeV  string
	libDir                  string
	alias                   string
	mmap                    bool
	pinRing                 bool
	copyThreads             int
	streamRestore           string // "auto", "on" or "off"
	cudaSync                string // "auto", "spin", "yield" or "block"
	restoreInPlace          bool
	eagerLogits             bool // restore_logits=eager
}

var cacheTypes = []string{"bf16", "f16", "f32", "q4_0", "q8_0"}

func parseOptions(m map[string]string) (options, error) {
	// Half the CPUs: ggml's threads spin at their barriers, and crowding the
	// Go runtime (sockets, the data plane) out of cores slows everything; with
	// the model on a GPU they have little to do anyway.
	threads := max(1, min(runtime.NumCPU()/2, 16))
	o := options{nCtx: DefaultNCtx, nBatch: DefaultNBatch, nUBatch: DefaultNUBatch, nThreads: threads,
		nThreadsBatch: -1, nGPULayers: -1, flashAttn: FlashOn, cacheTypeK: "f16", cacheTypeV: "f16", mmap: true, pinRing: true,
		copyThreads: DefaultCopyThreads, streamRestore: "auto", cudaSync: "auto", restoreInPlace: true}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the first error reported does not depend on map order
	for _, k := range keys {
		v := strings.TrimSpace(m[k])
		var err error
		switch k {
		case OptNCtx:
			o.nCtx, err = parseInt(k, v, 1, maxNCtx)
		case OptNBatch:
			o.nBatch, err = parseInt(k, v, 1, maxNCtx)
		case OptNUBatch:
			o.nUBatch, err = parseInt(k, v, 1, maxNCtx)
		case OptNThreads:
			o.nThreads, err = parseInt(k, v, 1, maxThreads)
		case OptNThreadsBatch:
			o.nThreadsBatch, err = parseInt(k, v, 1, maxThreads)
		case OptNGPULayers:
			o.nGPULayers, err = parseInt(k, v, -1, 1<<16)
		case OptCopyThreads:
			o.copyThreads, err = parseInt(k, v, 1, 64)
		case OptFlashAttn:
			switch strings.ToLower(v) {
			case "on", "true", "1", "enabled":
				o.flashAttn = FlashOn
			case "off", "false", "0", "disabled":
				o.flashAttn = FlashOff
			case "auto":
				o.flashAttn = FlashAuto
			default:
				err = fmt.Errorf("%w: option %s=%q: want on, off or auto", iface.ErrBadRequest, k, v)
			}
		case OptCacheTypeK, OptCacheTypeV:
			t := strings.ToLower(v)
			if !slices.Contains(cacheTypes, t) {
				err = fmt.Errorf("%w: option %s=%q: want one of %s", iface.ErrBadRequest, k, v, strings.Join(cacheTypes, ", "))
			} else if k == OptCacheTypeK {
				o.cacheTypeK = t
			} else {
				o.cacheTypeV = t
			}
		case OptLibDir:
			if v == "" {
				err = fmt.Errorf("%w: option %s: must not be empty", iface.ErrBadRequest, k)
			}
			o.libDir = v
		case OptAlias:
			if v == "" {
				err = fmt.Errorf("%w: option %s: must not be empty", iface.ErrBadRequest, k)
			}
			o.alias = v
		case OptStreamRestore:
			if strings.EqualFold(v, "auto") {
				o.streamRestore = "auto"
				break
			}
			on, perr := strconv.ParseBool(v)
			switch {
			case perr != nil:
				err = fmt.Errorf("%w: option %s=%q: want auto, true or false", iface.ErrBadRequest, k, v)
			case on:
				o.streamRestore = "on"
			default:
				o.streamRestore = "off"
			}
		case OptCUDASync:
			switch m := strings.ToLower(v); m {
			case "auto", "spin", "yield", "block":
				o.cudaSync = m
			default:
				err = fmt.Errorf("%w: option %s=%q: want auto, spin, yield or block", iface.ErrBadRequest, k, v)
			}
		case OptRestoreLogits:
			switch strings.ToLower(v) {
			case "lazy":
				o.eagerLogits = false
			case "eager":
				o.eagerLogits = true
			default:
				err = fmt.Errorf("%w: option %s=%q: want lazy or eager", iface.ErrBadRequest, k, v)
			}
		case OptMmap, OptPinRing, OptRestoreInPlace:
			var b bool
			b, err = strconv.ParseBool(v)
			switch k {
			case OptMmap:
				o.mmap = b
			case OptPinRing:
				o.pinRing = b
			default:
				o.restoreInPlace = b
			}
			if err != nil {
				err = fmt.Errorf("%w: option %s=%q: not a boolean", iface.ErrBadRequest, k, v)
			}
		default:
			err = fmt.Errorf("%w: unknown option %q (known: %s)", iface.ErrBadRequest, k, strings.Join(knownOptions, ", "))
		}
		if err != nil {
			return options{}, err
		}
	}
	if o.nThreadsBatch < 0 {
		o.nThreadsBatch = o.nThreads
	}
	if o.flashAttn == FlashOff && isQuantized(o.cacheTypeV) {
		return options{}, fmt.Errorf("%w: a quantized V cache (%s=%s) needs flash attention", iface.ErrBadRequest, OptCacheTypeV, o.cacheTypeV)
	}
	return o, nil
}

func isQuantized(t string) bool { return strings.HasPrefix(t, "q") }

func parseInt(key, v string, lo, hi int) (int, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: option %s=%q: not an integer", iface.ErrBadRequest, key, v)
	}
	if n < int64(lo) || n > int64(hi) {
		return 0, fmt.Errorf("%w: option %s=%d: out of range [%d, %d]", iface.ErrBadRequest, key, n, lo, hi)
	}
	return int(n), nil
}

// checkModelFile resolves the model path and checks it is a readable regular
// file, so that a typo fails with a clear error rather than llama.cpp's.
func checkModelFile(model string) (string, error) {
	if model == "" {
		return "", fmt.Errorf("%w: the cuda-llama backend needs a model: --model PATH to a GGUF file", iface.ErrBadRequest)
	}
	abs, err := filepath.Abs(model)
	if err != nil {
		return "", fmt.Errorf("%w: model %q: %w", iface.ErrBadRequest, model, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%w: model: %w", iface.ErrBadRequest, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%w: model %s is not a regular file", iface.ErrBadRequest, abs)
	}
	return abs, nil
}

// llamaVersion is the version of LlamaModule linked into this binary: from
// the build info when the binary has it, else the pinned constant.
func llamaVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == LlamaModule {
				if d.Replace != nil {
					return d.Replace.Version
				}
				return d.Version
			}
		}
	}
	return PinnedLlamaVersion
}

// versionStamp is the content make cuda writes to VersionStampFile.
func versionStamp(version string) string { return LlamaModule + " " + version }

// ErrNotLinked is what every method of a Backend built without llama.cpp
// (no build tag "llama", or no cgo) returns.
var ErrNotLinked = errors.New("hydra-plugin-cuda-llama was built without -tags llama (or without cgo), so llama.cpp is not linked in: build it with `make build-llama`")

// errNoCUDALibrary means there is no libggml-cuda.so to load: run on CPU.
var errNoCUDALibrary = errors.New("no " + CUDALibrary)

// cudaLibrary finds libggml-cuda.so in dir (or beside the executable when dir
// is empty) and checks that its version stamp names the llama.cpp this binary
// was built from: a ggml backend library from other sources would share
// structs with a different layout. errNoCUDALibrary if absent.
func cudaLibrary(dir string) (string, error) {
	if dir == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", errNoCUDALibrary
		}
		dir = filepath.Dir(exe)
	}
	lib := filepath.Join(dir, CUDALibrary)
	if _, err := os.Stat(lib); err != nil {
		return "", fmt.Errorf("%w in %s", errNoCUDALibrary, dir)
	}
	want := versionStamp(llamaVersion())
	stampPath := filepath.Join(dir, VersionStampFile)
	stamp, err := os.ReadFile(stampPath)
	if err != nil {
		return "", fmt.Errorf("%w: %s has no version stamp (%s: %w); rebuild it with make cuda, which stamps it with %q",
			iface.ErrBadRequest, lib, stampPath, err, want)
	}
	if got := strings.TrimSpace(string(stamp)); got != want {
		return "", fmt.Errorf("%w: %s was built from %q, this plugin from %q; rebuild one of them (make cuda / make build-llama) from the same module version",
			iface.ErrBadRequest, lib, got, want)
	}
	return lib, nil
}
