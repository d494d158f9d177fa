// Package llamaopt is the llama plugin's load options: every key Load takes
// (--backend-opt key=value) with its parser, default and line of help, in
// one table. It is plain Go with no plugin code, so that llama-server mode
// (cmd/hydra-engine) maps its flags onto these keys and prints their help
// without linking llama.cpp.
package llamaopt

import (
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

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

// Options are the parsed load Options.
type Options struct {
	NCtx, NBatch, NUBatch   int
	NThreads, NThreadsBatch int
	NGPULayers              int // -1: all
	FlashAttn               int
	CacheTypeK, CacheTypeV  string
	LibDir                  string
	Alias                   string
	Mmap                    bool
	EagerLogits             bool // restore_logits=eager
	KVOptions
	CacheOptions
	TemplateOptions
	PlacementOptions
	RopeOptions
	QuantOptions
	CombinedOptions
	EmbedOptions
	SpecOptions
	CkptOptions
}

// RopeOptions are the parsed RoPE options; the zero value is the model's
// own scaling.
type RopeOptions struct {
	RopeScaling   int     // llama_rope_scaling_type; ropeUnspecified: the model's
	RopeFreqScale float32 // rope_freq_scale = 1/rope_scale; 0: the model's
	YarnOrigCtx   int     // 0: the model's training context
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
type optionParser func(o *Options, key, v string) error

// option is one key Load takes: its parser and its line of help, so that
// what is parsed and what is documented are one table.
type option struct {
	key, def, doc string
	parse         optionParser
}

// table is every option, in the order Help lists them: those below and
// each file's.
var table = slices.Concat(baseOptions, kvOptions, cacheOptions, placementOptions, templateOptions,
	combinedOptions, embedOptions, specOptions, ckptOptions, swapPrefixOptions)

// prefixes are the keys of table that start a family of keys (quant.KEY).
var prefixes = []string{OptQuantPrefix}

// optionParsers are table's parsers by key, prefixes included; a key
// defined twice panics at start.
var optionParsers = func() map[string]optionParser {
	out := map[string]optionParser{}
	for _, o := range table {
		if _, dup := out[o.key]; dup {
			panic("cuda-llama: option " + o.key + " is defined twice")
		}
		out[o.key] = o.parse
	}
	return out
}()

// Help is the options' help text: a key, its default and what it does, a
// line each, in the table's order.
func Help() string {
	var b strings.Builder
	for _, o := range table {
		key := o.key
		if slices.Contains(prefixes, key) {
			key += "KEY"
		}
		fmt.Fprintf(&b, "  %-26s %s (default: %s)\n", key, o.doc, o.def)
	}
	return b.String()
}

// baseOptions are the options of the model, its context and its devices.
var baseOptions = []option{
	{key: OptNCtx, def: "4096", doc: "KV cells of all slots together (with kv_unified, shared: each slot may use them all)",
		parse: intField(func(o *Options) *int { return &o.NCtx }, 1, maxNCtx)},
	{key: OptNBatch, def: "2048", doc: "prompt tokens per llama_decode call",
		parse: intField(func(o *Options) *int { return &o.NBatch }, 1, maxNCtx)},
	{key: OptNUBatch, def: "512", doc: "physical batch: tokens per ggml graph",
		parse: intField(func(o *Options) *int { return &o.NUBatch }, 1, maxNCtx)},
	{key: OptNThreads, def: "half the CPUs, at most 16", doc: "CPU threads for generation (ggml's threads spin: more than free cores slows everything)",
		parse: intField(func(o *Options) *int { return &o.NThreads }, 1, maxThreads)},
	{key: OptNThreadsBatch, def: "n_threads", doc: "CPU threads for prompts",
		parse: intField(func(o *Options) *int { return &o.NThreadsBatch }, 1, maxThreads)},
	{key: OptNGPULayers, def: "all", doc: "layers on the GPU: a number, -1 or all",
		parse: parseGPULayers},
	{key: OptFlashAttn, def: "on", doc: "flash attention: on, off or auto (off stores V transposed: state copies are much slower)",
		parse: parseFlashAttn},
	{key: OptCacheTypeK, def: "f16", doc: "K cache type: f16, f32, bf16, q8_0 or q4_0",
		parse: cacheTypeField(func(o *Options) *string { return &o.CacheTypeK })},
	{key: OptCacheTypeV, def: "f16", doc: "V cache type: f16, f32, bf16, q8_0 or q4_0 (quantized needs flash attention)",
		parse: cacheTypeField(func(o *Options) *string { return &o.CacheTypeV })},
	{key: OptLibDir, def: "beside the plugin", doc: "where libggml-cuda.so is",
		parse: nonEmptyField(func(o *Options) *string { return &o.LibDir })},
	{key: OptAlias, def: "the file name without .gguf", doc: "the model's name in the API",
		parse: nonEmptyField(func(o *Options) *string { return &o.Alias })},
	{key: OptMmap, def: "true", doc: "memory-map the model file",
		parse: boolField(func(o *Options) *bool { return &o.Mmap })},
	{key: OptRestoreLogits, def: "lazy", doc: "a restored state's last token is evaluated again by the slot's first DECODE (lazy) or within STATE_PUT (eager)",
		parse: parseRestoreLogits},
	{key: OptRopeScaling, def: "the model's", doc: "RoPE scaling: none, linear or yarn",
		parse: parseRopeScaling},
	{key: OptRopeScale, def: "the model's", doc: "context scaling factor N > 0: RoPE frequencies scaled by 1/N",
		parse: parseRopeScale},
	{key: OptYarnOrigCtx, def: "the model's", doc: "YaRN's original context; 0: the model's training context",
		parse: intField(func(o *Options) *int { return &o.YarnOrigCtx }, 0, maxNCtx)},
}

// Defaults are the options before any key is applied. Half the CPUs:
// ggml's threads spin at their barriers, and crowding the Go runtime out of
// cores slows everything.
func Defaults() Options {
	return Options{NCtx: DefaultNCtx, NBatch: DefaultNBatch, NUBatch: DefaultNUBatch,
		NThreads: max(1, min(runtime.NumCPU()/2, 16)), NThreadsBatch: -1, NGPULayers: -1,
		FlashAttn: FlashOn, CacheTypeK: "f16", CacheTypeV: "f16", Mmap: true,
		RopeOptions: RopeOptions{RopeScaling: ropeUnspecified}, EmbedOptions: defaultEmbedOptions(),
		SpecOptions: defaultSpecOptions(), CkptOptions: defaultCkptOptions()}
}

// Parse applies m's keys in sorted order (so the first error reported
// does not depend on map order) over the defaults.
func Parse(m map[string]string) (Options, error) {
	o := Defaults()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if err := applyOption(&o, k, strings.TrimSpace(m[k])); err != nil {
			return Options{}, err
		}
	}
	if o.NThreadsBatch < 0 {
		o.NThreadsBatch = o.NThreads
	}
	if o.FlashAttn == FlashOff && IsQuantized(o.CacheTypeV) {
		return Options{}, fmt.Errorf("%w: a quantized V cache (%s=%s) needs flash attention", iface.ErrBadRequest, OptCacheTypeV, o.CacheTypeV)
	}
	if err := o.checkSpec(); err != nil {
		return Options{}, err
	}
	return o, nil
}

// applyOption sets key's field; a removed or unknown key is an error.
func applyOption(o *Options, key, v string) error {
	if now, ok := removedOptions[key]; ok {
		return fmt.Errorf("%w: option %q was removed: %s; drop it from the configuration", iface.ErrBadRequest, key, now)
	}
	parse, ok := optionParsers[key]
	for _, prefix := range prefixes {
		if !ok && strings.HasPrefix(key, prefix) {
			parse, ok = optionParsers[prefix], true
		}
	}
	if !ok {
		known := slices.Sorted(maps.Keys(optionParsers))
		return fmt.Errorf("%w: unknown option %q (known: %s)", iface.ErrBadRequest, key, strings.Join(known, ", "))
	}
	return parse(o, key, v)
}

func intField(field func(*Options) *int, lo, hi int) func(*Options, string, string) error {
	return func(o *Options, key, v string) (err error) {
		*field(o), err = iface.ParseIntOption(key, v, lo, hi)
		return err
	}
}

func boolField(field func(*Options) *bool) func(*Options, string, string) error {
	return func(o *Options, key, v string) error {
		b, err := iface.ParseBoolOption(key, v)
		*field(o) = b
		return err
	}
}

func nonEmptyField(field func(*Options) *string) func(*Options, string, string) error {
	return func(o *Options, key, v string) error {
		if v == "" {
			return fmt.Errorf("%w: option %s: must not be empty", iface.ErrBadRequest, key)
		}
		*field(o) = v
		return nil
	}
}

func cacheTypeField(field func(*Options) *string) func(*Options, string, string) error {
	return func(o *Options, key, v string) error {
		t := strings.ToLower(v)
		if !slices.Contains(cacheTypes, t) {
			return fmt.Errorf("%w: option %s=%q: want one of %s", iface.ErrBadRequest, key, v, strings.Join(cacheTypes, ", "))
		}
		*field(o) = t
		return nil
	}
}

func parseFlashAttn(o *Options, key, v string) error {
	switch strings.ToLower(v) {
	case "on", "true", "1", "enabled":
		o.FlashAttn = FlashOn
	case "off", "false", "0", "disabled":
		o.FlashAttn = FlashOff
	case "auto":
		o.FlashAttn = FlashAuto
	default:
		return fmt.Errorf("%w: option %s=%q: want on, off or auto", iface.ErrBadRequest, key, v)
	}
	return nil
}

func parseRestoreLogits(o *Options, key, v string) error {
	switch strings.ToLower(v) {
	case "lazy":
		o.EagerLogits = false
	case "eager":
		o.EagerLogits = true
	default:
		return fmt.Errorf("%w: option %s=%q: want lazy or eager", iface.ErrBadRequest, key, v)
	}
	return nil
}

// parseGPULayers reads a layer count, -1 or "all" (llama-server's word)
// meaning every layer.
func parseGPULayers(o *Options, key, v string) error {
	if strings.EqualFold(v, "all") {
		o.NGPULayers = -1
		return nil
	}
	n, err := iface.ParseIntOption(key, v, -1, 1<<16)
	if err != nil {
		return fmt.Errorf("%w (or all)", err)
	}
	o.NGPULayers = n
	return nil
}

func parseRopeScaling(o *Options, key, v string) error {
	switch strings.ToLower(v) {
	case "none":
		o.RopeScaling = ropeNone
	case "linear":
		o.RopeScaling = ropeLinear
	case "yarn":
		o.RopeScaling = ropeYaRN
	default:
		return fmt.Errorf("%w: option %s=%q: want none, linear or yarn", iface.ErrBadRequest, key, v)
	}
	return nil
}

// parseRopeScale reads llama-server's --rope-scale N, which expands the
// context N times: llama.cpp's rope_freq_scale is 1/N.
func parseRopeScale(o *Options, key, v string) error {
	f, err := strconv.ParseFloat(v, 32)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return fmt.Errorf("%w: option %s=%q: want a positive number (the context scaling factor)", iface.ErrBadRequest, key, v)
	}
	o.RopeFreqScale = float32(1 / f)
	return nil
}

func IsQuantized(t string) bool { return strings.HasPrefix(t, "q") }
