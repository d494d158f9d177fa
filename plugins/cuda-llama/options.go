// Package cudallama is the llama.cpp backend: GGUF models through llama.cpp
// (the tree pinned in mk/llama-pin.mk, fetched from the npm registry and
// built by its CMake into static libraries that cgo links), CUDA on GPU
// machines when libggml-cuda.so is present, CPU otherwise.
//
// The llama.cpp code is behind the build tag "llama" (make build-llama sets it
// and the include and library paths, see mk/llama.mk); without the tag the
// package builds a Backend whose Load fails saying so, so that plain
// `go build ./...` and `go vet ./...` need neither cgo nor the llama.cpp tree.
//
// One llama_context serves every slot: slot i is llama sequence i, in one KV
// cache all slots share (kv_unified, the default) or in a KV stream of its own
// (kv_unified=false); a state is one stream on the wire either way and
// restores into an engine of any slot count and mode. One extra sequence is
// scratch space for re-evaluating the last token after a restore. llama.cpp contexts are not
// safe for concurrent use: one scheduler (sched.go) owns every llama_decode
// and batches the slots' prompts and decodes into shared steps, and a mutex
// (ctxlock.go) serialises the context work outside it.
package cudallama

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
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

// Option keys understood by Load (--backend-opt key=value).
const (
	OptNCtx          = "n_ctx"           // KV cells shared by all slots (unified cache); each slot may use them all
	OptNBatch        = "n_batch"         // tokens per llama_decode call in a prefill
	OptNUBatch       = "n_ubatch"        // physical batch
	OptNThreads      = "n_threads"       // CPU threads for generation; default half the CPUs, at most 16
	OptNThreadsBatch = "n_threads_batch" // CPU threads for prompt processing
	OptNGPULayers    = "n_gpu_layers"    // layers on the GPU; -1 or all = all (when a GPU is present)
	OptFlashAttn     = "flash_attn"      // on (default), off, auto
	OptCacheTypeK    = "cache_type_k"    // KV cache element type: f16 (default), f32, bf16, q8_0, q4_0
	OptCacheTypeV    = "cache_type_v"
	OptLibDir        = "lib_dir" // where libggml-cuda.so is; default: beside the plugin binary
	OptAlias         = "alias"   // model alias; default: the file name without .gguf
	OptMmap          = "use_mmap"
	// OptRestoreLogits: a restored state without logits has its last token
	// evaluated again by the slot's first DECODE (lazy, the default, so
	// STATE_PUT answers once the bytes are in) or within STATE_PUT (eager,
	// for a caller that wants the reply to mean the slot decodes at once).
	OptRestoreLogits = "restore_logits"

	// RoPE scaling, as llama-server's --rope-scaling, --rope-scale and
	// --yarn-orig-ctx; each defaults to what the model's metadata says.
	OptRopeScaling = "rope_scaling"  // none, linear or yarn
	OptRopeScale   = "rope_scale"    // context scaling factor N > 0: RoPE frequencies scaled by 1/N
	OptYarnOrigCtx = "yarn_orig_ctx" // YaRN's original context size; 0 = the model's training context
)

// removedOptions are the experiment switches that were settled: each is
// refused with what the plugin now always does (docs/design/llama-restore.md
// has the measurements), so that a deployment still passing one learns it.
var removedOptions = map[string]string{
	"pin_ring":         "on a GPU the shared-memory ring is always pinned for DMA while a transfer uses it",
	"copy_threads":     "a restore not taken in place is copied out of the ring by one thread",
	"stream_restore":   "restores through the restore ring stream only K/V blocks of 64 MiB or more",
	"cuda_sync":        "CUDA waits for the GPU its default way",
	"restore_in_place": "restores on the shared-memory ring are always taken in place (rings up to 64 MiB)",
}

// Defaults and limits.
const (
	DefaultNCtx    = 4096
	DefaultNBatch  = 2048
	DefaultNUBatch = 512
	maxNCtx        = 1 << 24
	maxThreads     = 512
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
	eagerLogits             bool // restore_logits=eager
	kvOptions
	cacheOptions
	templateOptions
	placementOptions
	ropeOptions
	quantOptions
	combinedOptions
	embedOptions
	specOptions
	ckptOptions
}

// ropeOptions are the parsed RoPE options; the zero value is the model's
// own scaling.
type ropeOptions struct {
	ropeScaling   int     // llama_rope_scaling_type; ropeUnspecified: the model's
	ropeFreqScale float32 // rope_freq_scale = 1/rope_scale; 0: the model's
	yarnOrigCtx   int     // 0: the model's training context
}

// RoPE scaling types (enum llama_rope_scaling_type).
const (
	ropeUnspecified = -1
	ropeNone        = 0
	ropeLinear      = 1
	ropeYaRN        = 2
)

var cacheTypes = []string{"bf16", "f16", "f32", "q4_0", "q8_0"}

// optionParser sets an option's field from its trimmed value.
type optionParser func(o *options, key, v string) error

// optionParsers are every option's parser, one per key: those below and
// each *opts.go file's, merged once (a key defined twice panics at start).
var optionParsers = mergeParsers(baseParsers, kvParsers, cacheParsers, placementParsers, templateParsers, combinedParsers, embedParsers, specParsers, ckptParsers)

// optionPrefixParsers set the options whose keys start with a prefix
// (quant.KEY), one per prefix.
var optionPrefixParsers = mergeParsers(swapPrefixParsers)

// mergeParsers is the union of sets of parsers, which must not share a key.
func mergeParsers(sets ...map[string]optionParser) map[string]optionParser {
	out := map[string]optionParser{}
	for _, set := range sets {
		for k, p := range set {
			if _, dup := out[k]; dup {
				panic("cuda-llama: option " + k + " is defined twice")
			}
			out[k] = p
		}
	}
	return out
}

// baseParsers are the options of the model, its context and its devices.
var baseParsers = map[string]optionParser{
	OptNCtx:          intField(func(o *options) *int { return &o.nCtx }, 1, maxNCtx),
	OptNBatch:        intField(func(o *options) *int { return &o.nBatch }, 1, maxNCtx),
	OptNUBatch:       intField(func(o *options) *int { return &o.nUBatch }, 1, maxNCtx),
	OptNThreads:      intField(func(o *options) *int { return &o.nThreads }, 1, maxThreads),
	OptNThreadsBatch: intField(func(o *options) *int { return &o.nThreadsBatch }, 1, maxThreads),
	OptNGPULayers:    parseGPULayers,
	OptFlashAttn:     parseFlashAttn,
	OptCacheTypeK:    cacheTypeField(func(o *options) *string { return &o.cacheTypeK }),
	OptCacheTypeV:    cacheTypeField(func(o *options) *string { return &o.cacheTypeV }),
	OptLibDir:        nonEmptyField(func(o *options) *string { return &o.libDir }),
	OptAlias:         nonEmptyField(func(o *options) *string { return &o.alias }),
	OptMmap:          boolField(func(o *options) *bool { return &o.mmap }),
	OptRestoreLogits: parseRestoreLogits,
	OptRopeScaling:   parseRopeScaling,
	OptRopeScale:     parseRopeScale,
	OptYarnOrigCtx:   intField(func(o *options) *int { return &o.yarnOrigCtx }, 0, maxNCtx),
}

// defaultOptions are the options before any key is applied. Half the CPUs:
// ggml's threads spin at their barriers, and crowding the Go runtime out of
// cores slows everything.
func defaultOptions() options {
	return options{nCtx: DefaultNCtx, nBatch: DefaultNBatch, nUBatch: DefaultNUBatch,
		nThreads: max(1, min(runtime.NumCPU()/2, 16)), nThreadsBatch: -1, nGPULayers: -1,
		flashAttn: FlashOn, cacheTypeK: "f16", cacheTypeV: "f16", mmap: true,
		ropeOptions: ropeOptions{ropeScaling: ropeUnspecified}, embedOptions: defaultEmbedOptions(),
		specOptions: defaultSpecOptions(), ckptOptions: defaultCkptOptions()}
}

// parseOptions applies m's keys in sorted order (so the first error reported
// does not depend on map order) over the defaults.
func parseOptions(m map[string]string) (options, error) {
	o := defaultOptions()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := applyOption(&o, k, strings.TrimSpace(m[k])); err != nil {
			return options{}, err
		}
	}
	if o.nThreadsBatch < 0 {
		o.nThreadsBatch = o.nThreads
	}
	if o.flashAttn == FlashOff && isQuantized(o.cacheTypeV) {
		return options{}, fmt.Errorf("%w: a quantized V cache (%s=%s) needs flash attention", iface.ErrBadRequest, OptCacheTypeV, o.cacheTypeV)
	}
	if err := o.checkSpec(); err != nil {
		return options{}, err
	}
	return o, nil
}

// applyOption sets key's field; a removed or unknown key is an error.
func applyOption(o *options, key, v string) error {
	if now, ok := removedOptions[key]; ok {
		return fmt.Errorf("%w: option %q was removed: %s; drop it from the configuration", iface.ErrBadRequest, key, now)
	}
	parse, ok := optionParsers[key]
	for prefix, p := range optionPrefixParsers {
		if !ok && strings.HasPrefix(key, prefix) {
			parse, ok = p, true
		}
	}
	if !ok {
		known := append(slices.Sorted(maps.Keys(optionParsers)), slices.Sorted(maps.Keys(optionPrefixParsers))...)
		return fmt.Errorf("%w: unknown option %q (known: %s)", iface.ErrBadRequest, key, strings.Join(known, ", "))
	}
	return parse(o, key, v)
}

func intField(field func(*options) *int, lo, hi int) func(*options, string, string) error {
	return func(o *options, key, v string) (err error) {
		*field(o), err = iface.ParseIntOption(key, v, lo, hi)
		return err
	}
}

func boolField(field func(*options) *bool) func(*options, string, string) error {
	return func(o *options, key, v string) error {
		b, err := iface.ParseBoolOption(key, v)
		*field(o) = b
		return err
	}
}

func nonEmptyField(field func(*options) *string) func(*options, string, string) error {
	return func(o *options, key, v string) error {
		if v == "" {
			return fmt.Errorf("%w: option %s: must not be empty", iface.ErrBadRequest, key)
		}
		*field(o) = v
		return nil
	}
}

func cacheTypeField(field func(*options) *string) func(*options, string, string) error {
	return func(o *options, key, v string) error {
		t := strings.ToLower(v)
		if !slices.Contains(cacheTypes, t) {
			return fmt.Errorf("%w: option %s=%q: want one of %s", iface.ErrBadRequest, key, v, strings.Join(cacheTypes, ", "))
		}
		*field(o) = t
		return nil
	}
}

func parseFlashAttn(o *options, key, v string) error {
	switch strings.ToLower(v) {
	case "on", "true", "1", "enabled":
		o.flashAttn = FlashOn
	case "off", "false", "0", "disabled":
		o.flashAttn = FlashOff
	case "auto":
		o.flashAttn = FlashAuto
	default:
		return fmt.Errorf("%w: option %s=%q: want on, off or auto", iface.ErrBadRequest, key, v)
	}
	return nil
}

func parseRestoreLogits(o *options, key, v string) error {
	switch strings.ToLower(v) {
	case "lazy":
		o.eagerLogits = false
	case "eager":
		o.eagerLogits = true
	default:
		return fmt.Errorf("%w: option %s=%q: want lazy or eager", iface.ErrBadRequest, key, v)
	}
	return nil
}

// parseGPULayers reads a layer count, -1 or "all" (llama-server's word)
// meaning every layer.
func parseGPULayers(o *options, key, v string) error {
	if strings.EqualFold(v, "all") {
		o.nGPULayers = -1
		return nil
	}
	n, err := iface.ParseIntOption(key, v, -1, 1<<16)
	if err != nil {
		return fmt.Errorf("%w (or all)", err)
	}
	o.nGPULayers = n
	return nil
}

func parseRopeScaling(o *options, key, v string) error {
	switch strings.ToLower(v) {
	case "none":
		o.ropeScaling = ropeNone
	case "linear":
		o.ropeScaling = ropeLinear
	case "yarn":
		o.ropeScaling = ropeYaRN
	default:
		return fmt.Errorf("%w: option %s=%q: want none, linear or yarn", iface.ErrBadRequest, key, v)
	}
	return nil
}

// parseRopeScale reads llama-server's --rope-scale N, which expands the
// context N times: llama.cpp's rope_freq_scale is 1/N.
func parseRopeScale(o *options, key, v string) error {
	f, err := strconv.ParseFloat(v, 32)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return fmt.Errorf("%w: option %s=%q: want a positive number (the context scaling factor)", iface.ErrBadRequest, key, v)
	}
	o.ropeFreqScale = float32(1 / f)
	return nil
}

func isQuantized(t string) bool { return strings.HasPrefix(t, "q") }

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
