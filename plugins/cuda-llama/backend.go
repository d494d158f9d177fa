//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/promptcache"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// Linked reports whether llama.cpp is compiled in (build tag "llama", cgo).
const Linked = true

// Stop reasons of Decode.
const (
	StopEOS          = sched.StopEOS
	StopLength       = sched.StopLength
	StopNTokensLimit = sched.StopNTokensLimit
)

// Backend is the llama.cpp backend. The zero value is not usable; call New.
type Backend struct {
	log hclog.Logger

	loadMu sync.Mutex
	eng    atomic.Pointer[engine] // nil until Load succeeds
}

var _ iface.Backend = (*Backend)(nil)

// New returns an unloaded backend logging to logger (nil: discard).
func New(logger hclog.Logger) *Backend {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Backend{log: logger}
}

// engine is a loaded model and its context.
//
// The llama_context and model are never freed: one engine per plugin
// process, whose exit reclaims them, and llama_free of a context on the CUDA
// backend has crashed in the scheduler's destructor, which resets backends
// the context already destroyed (free the scheduler first, should a context
// ever need freeing).
type engine struct {
	info    iface.BackendInfo
	model   *model
	scratch int // the sequence id re-evaluations borrow: nSlots
	// park is the sequence id a sequence leaving its slot for the prompt
	// cache keeps its cells under while it is saved (nSlots + 1; -1: none,
	// saves go in line); parked is that save, under mu, and saving the
	// same until its bytes are written, for waiters without the lock.
	park   int
	parked *parkedSave
	saving atomic.Pointer[parkedSave]
	layout stateLayout // state size as a function of cells
	device string      // the GPU in use, "" on CPU
	// The smallest K/V run a restore uploads piece by piece (shim.cpp),
	// taken in place and through the restore ring; 0 where no block of this
	// model and n_ctx reaches the threshold.
	streamInPlaceMin, streamRingMin int64
	// eagerLogits: a restore without logits re-evaluates its last token
	// before STATE_PUT answers, not in the first decode (restore_logits).
	eagerLogits bool
	log         hclog.Logger

	// cells are the slots and the KV cells they share. The scratch sequence
	// borrows a free cell for a moment and re-evaluates in place when there
	// is none (reevaluate). A full slot shifts its context when
	// contextShift is set, else its decode stops.
	cells        kv.Cells
	contextShift bool
	vTrans       bool // the KV cache stores V transposed (a state's layout names it)
	// nSWA is the attention window a sliding-window cache keeps (0: every
	// position is kept): a prompt reuses a prefix only where its window is.
	nSWA int
	// swaFull: the window cache keeps every position (swa_full), so it is cut
	// anywhere and takes no checkpoints, as llama-server decides.
	swaFull    bool
	cacheReuse int // the least chunk a prefill moves into place (cache_reuse); 0: prefix only

	chat *chatTemplate // the Jinja chat template; nil: llama.cpp's matcher (jinja=false)
	// chatParseSpecial parses the control tokens of a chat's content
	// (chat_parse_special, llama-server's way) instead of keeping them text.
	chatParseSpecial bool
	// chatc is the template in llama.cpp's common library, which builds
	// tool-call grammars and parses replies (chatcommon.go); nil where it
	// cannot read it or jinja=false.
	chatc *chatCommon

	// mu is the context lock: every use of ctx holds it. The scheduler holds
	// it for one step at a time; state transfers hold it while llama.cpp
	// works and let go while they wait on the data plane, counting
	// themselves in transfers meanwhile (a context shift waits for none).
	mu        sched.Lock
	ctx       *lctx
	sched     *sched.Scheduler
	transfers atomic.Int32
	// One save and one restore at a time: saves share the shim's staging
	// buffers and stream, restores the restore ring and the shim's counts;
	// a save and a restore share nothing and run side by side.
	saveMu, loadMu sync.Mutex

	ringMu sync.Mutex // held by the restore using ring
	ring   *mirror    // the restore ring (prefetch_linux.go), kept across restores up to keepRing bytes

	swap *swapper // the weights' other copies: quantisations, combined mode (swap.go); nil without

	pcache *promptcache.Cache // HTTP completions' sequences in host memory (promptcache.go); nil without
	embed  *embedder          // the embedding context (embed.go); nil without embeddings=true
	spec   *speculator        // the draft model or n-gram drafting (spec.go); nil without
	// ckpts are the slots' context checkpoints (checkpoints.go); nil where
	// the memory can always be cut or checkpoints are off. Changed under mu.
	ckpts  *ckpt.Store
	tasks  atomic.Uint64    // numbers the prompts, for the checkpoints' spacing rule
	delims []ckpt.Delimiter // the chat template's message delimiters, as tokens; nil: none known
}

// streamedRingBlock is the largest read a streamed restore takes from its
// restore ring: streamPiece, with room to spare.
const streamedRingBlock = 2 << 20

// The smallest K/V block a restore streams: in place every block of 1 MiB or
// more, as its pieces are the data plane's own buffers and nothing is copied;
// through the restore ring only blocks a kept ring would not hold, as holding
// a block is faster than an upload per piece (docs/design/llama-restore.md).
// Tests lower both.
var (
	inPlaceStreamMin int64 = 1 << 20
	ringStreamMin    int64 = keepRing
)

// keepRing is the largest restore ring kept for the next restore. Mapping
// and pinning one costs milliseconds; a larger ring (a state of long
// sequences on a large model) would hold its pinned memory for good.
const keepRing = 64 << 20

// newRing maps a restore ring, pinned for DMA on a GPU (both mappings of
// the mirror). Pinning can fail (a driver limit); the uploads then go
// through the driver's bounce buffer, slower, and the restore log says
// ring_pinned=false.
func (e *engine) newRing(size, tail int) (*mirror, error) {
	m, err := newMirror(size, tail)
	if err != nil {
		return nil, err
	}
	if e.device != "" {
		m.unpin = llama.PinHost(m.mem)
	}
	return m, nil
}

// Load loads the model (on the GPU when libggml-cuda.so is present and sees
// one), creates the context and measures the state layout.
func (b *Backend) Load(ctx context.Context, req iface.LoadRequest) (iface.BackendInfo, error) {
	b.loadMu.Lock()
	defer b.loadMu.Unlock()
	if b.eng.Load() != nil {
		return iface.BackendInfo{}, fmt.Errorf("%w: the cuda-llama backend is already loaded", iface.ErrBadRequest)
	}
	opts, nSlots, path, err := checkLoadRequest(req)
	if err != nil {
		return iface.BackendInfo{}, err
	}
	start := time.Now()
	b.initLlama()
	// Hash the model while llama.cpp loads it: both read the whole file.
	hashCtx, cancelHash := context.WithCancel(ctx)
	defer cancelHash()
	identity := hashModel(hashCtx, path, opts.Alias)

	gpuDev, gpuName := b.loadGPU(opts)
	nGPU := b.gpuLayers(opts.NGPULayers, gpuDev != nil)
	if note := fitMoELayers(path, &opts.PlacementOptions); note != "" {
		b.log.Info(note)
	}
	mdl, err := loadSupportedModel(path, opts, nGPU)
	if err == nil && opts.KVSplit && mdl.composite() != "" {
		b.log.Warn("kv_unified=false is not supported for this model's state yet: its slots share one pool of n_ctx cells",
			"model", mdl.composite())
		opts.KVSplit = false
	}
	if err != nil {
		return iface.BackendInfo{}, err
	}
	cp := contextParamsFor(opts, nSlots)
	if len(opts.SpecTypes) > 0 && mdl.recurrentState() {
		// A rejected draft is cut from the recurrent state as from the
		// attention cache, from snapshots llama.cpp keeps of the step's
		// tokens, instead of saving the state before every drafting step
		// and evaluating the kept tokens again (as llama-server does for
		// draft-mtp).
		cp.nRsSeq = opts.SpecBounds.NMax
	}
	lc, err := newContext(mdl, cp, gpuDev)
	if err != nil {
		mdl.free()
		return iface.BackendInfo{}, err
	}
	e := newEngine(mdl, lc, nSlots, gpuName, opts, b.log)
	if e.swap, err = newSwapper(hashCtx, mdl, lc, path, opts, nGPU, b.log); err != nil {
		return iface.BackendInfo{}, err
	}
	if len(opts.SpecTypes) > 0 {
		rollback := mdl.recurrentState() && lc.NRsSeq() == 0 // a memory without snapshots to cut drafts from
		if e.spec, err = newSpeculator(lc, opts, e.cells.Slots, b.gpuLayers(opts.DraftNGPU, gpuDev != nil), rollback, b.log); err != nil {
			return iface.BackendInfo{}, err
		}
		b.log.Info("speculative decoding", "spec_type", strings.Join(opts.SpecTypes, ","), "draft_model", opts.DraftModel,
			"draft_max", opts.SpecBounds.NMax, "draft_min", opts.SpecBounds.NMin, "draft_p_min", opts.DraftPMin,
			"draft_batch_max", opts.SpecBounds.BatchMax, "draft_rule", opts.DraftRule())
		if mdl.recurrentState() {
			b.log.Info("speculative decoding on a model with a recurrent state: llama.cpp keeps draft_max snapshots of each "+
				"slot's state to cut rejected drafts from", "memory", mdl.composite(), "n_rs_seq", cp.nRsSeq)
		}
	}
	if opts.Embeddings {
		if e.embed, err = newEmbedder(mdl, opts, e.cells.SlotCtx, lc.HasMemory(),
			func(p contextParams) (*lctx, error) { return newContext(mdl, p, gpuDev) }, b.log); err != nil {
			return iface.BackendInfo{}, err
		}
	}
	if !opts.BuiltinTemplate {
		if e.chat, err = newChatTemplate(mdl.jinja, mdl.specialText(mdl.bos), mdl.specialText(mdl.eos()), mdl.addsBOS(), opts.TemplateOptions); err != nil {
			return iface.BackendInfo{}, err
		}
		if e.chatc, err = newChatCommon(mdl, opts.TemplateFile); err != nil {
			b.log.Warn("llama.cpp's chat library cannot read the chat template: no tool calls or parsed replies", "error", err)
		}
	}
	if e.layout, err = e.measureLayout(); err != nil {
		return iface.BackendInfo{}, fmt.Errorf("%w: %s: the cuda-llama backend cannot stream this model's state: %w", iface.ErrBadRequest, path, err)
	}
	for _, s := range e.cells.Slots {
		s.SetStateSize(e.layout.size(0))
	}
	if e.layout.window() {
		e.nSWA, e.swaFull = mdl.nSWA(), opts.SWAFull
	} else if opts.SWAFull {
		b.log.Warn("swa_full has no effect: the model has no sliding-window cache")
	}
	e.pcache = e.newPromptCache(opts.CacheRAM)
	e.ckpts = e.newCheckpoints(opts.CkptOptions, e.ctx.NUBatch())
	e.delims = e.messageDelimiters()
	e.sched = newScheduler(e)
	go e.sched.Run()
	id, err := identity()
	if err != nil {
		return iface.BackendInfo{}, err
	}
	e.info = iface.BackendInfo{
		Name:      Name,
		Version:   backendVersion(),
		Model:     id,
		NSlots:    nSlots,
		NVocab:    mdl.nVocab,
		NCtx:      e.cells.NCtx,
		NCtxSlot:  e.cells.SlotCtx,
		KVUnified: e.cells.Unified,
		StateLayout: e.layout.describe(layoutModel{Arch: mdl.metaString("general.architecture"), Layers: mdl.nLayer(), Embd: mdl.nEmbd(),
			TypeK: opts.CacheTypeK, TypeV: opts.CacheTypeV, VTrans: e.vTrans, Vocab: mdl.nVocab}),
		// A Decode's prompt is prefilled by its own job (promptDecode).
		PromptDecode:  true,
		MaxTokenBytes: mdl.tok.maxTokenBytes,
	}
	if err := e.describeSwaps(); err != nil {
		return iface.BackendInfo{}, err
	}
	e.info.Capabilities = append(e.info.Capabilities, iface.CapOutput, iface.CapReasoningBudget)
	e.describeVocab(opts)
	e.describeEmbeddings(opts, b.log)
	e.info.BOSToken, e.info.EOSToken = mdl.specialText(mdl.bos), mdl.specialText(mdl.eos())
	if e.chatc != nil {
		e.info.ChatTemplate = e.chatc.source()
	}
	b.eng.Store(e)
	b.logLoaded(e, opts, nGPU, registerHostBufferAvailable(gpuDev), time.Since(start))
	return e.info, nil
}

// checkLoadRequest parses the options and checks the slot count and the
// model file before anything is loaded.
func checkLoadRequest(req iface.LoadRequest) (opts llamaopt.Options, nSlots int, path string, err error) {
	if opts, err = llamaopt.Parse(req.Options); err != nil {
		return llamaopt.Options{}, 0, "", err
	}
	switch nSlots = req.NSlots; {
	case nSlots == 0:
		nSlots = llamaopt.DefaultNSlots
	case nSlots < 0 || nSlots > llamaopt.MaxSlots:
		return llamaopt.Options{}, 0, "", fmt.Errorf("%w: n_slots %d out of range [1, %d]", iface.ErrBadRequest, nSlots, llamaopt.MaxSlots)
	}
	if path, err = checkModelFile(req.Model); err != nil {
		return llamaopt.Options{}, 0, "", err
	}
	return opts, nSlots, path, nil
}

// checkModelFile resolves the model path and checks it is a readable regular
// file, so that a typo fails with a clear error rather than llama.cpp's.
func checkModelFile(model string) (string, error) {
	if model == "" {
		return "", fmt.Errorf("%w: the cuda-llama backend needs a model: --model PATH to a GGUF file", iface.ErrBadRequest)
	}
	abs, err := regularFile(model)
	if err != nil {
		return "", fmt.Errorf("%w: model: %w", iface.ErrBadRequest, err)
	}
	return abs, nil
}

// regularFile resolves path and checks that it names a regular file.
func regularFile(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%q: %w", path, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", abs)
	}
	return abs, nil
}

// initLlama routes llama.cpp's log to this backend's and initialises it.
func (b *Backend) initLlama() {
	llama.SetLog(b.relog)
	initLlama()
}

// hashModel starts hashing the model file; the function returned waits for
// its identity.
func hashModel(ctx context.Context, path, alias string) func() (iface.ModelIdentity, error) {
	type hashed struct {
		id  iface.ModelIdentity
		err error
	}
	done := make(chan hashed, 1)
	go func() {
		id, err := iface.FileIdentity(ctx, path, alias)
		done <- hashed{id, err}
	}()
	return func() (iface.ModelIdentity, error) {
		h := <-done
		return h.id, h.err
	}
}

// gpuLayers is the n_gpu_layers llama.cpp gets: none without a GPU, every
// layer for -1.
func (b *Backend) gpuLayers(n int, gpu bool) int {
	switch {
	case !gpu && n > 0:
		b.log.Warn("n_gpu_layers ignored: no GPU backend", "n_gpu_layers", n)
		return 0
	case !gpu:
		return 0
	case n < 0:
		return math.MaxInt32
	}
	return n
}

// loadSupportedModel loads the model and refuses one whose KV state the
// plugin cannot stream or whose heads a quantized cache cannot hold.
func loadSupportedModel(path string, opts llamaopt.Options, nGPU int) (*model, error) {
	clearLlamaError()
	mdl, err := loadModel(path, modelParams{nGPULayers: nGPU, mmap: opts.Mmap, placement: opts.PlacementOptions, mtp: opts.MTP()})
	if err != nil {
		return nil, err
	}
	if opts.MTP() && mdl.m.NLayerNextN() < 1 {
		mdl.free()
		return nil, fmt.Errorf("%w: %s=%s: model %s carries no multi-token-prediction block (no nextn_predict_layers)",
			iface.ErrBadRequest, llamaopt.OptSpecType, llamaopt.SpecMTP, path)
	}
	// ggml quantizes cache rows in blocks of 32 values and asserts (aborts
	// the process) if a head does not divide into them.
	for _, ct := range []string{opts.CacheTypeK, opts.CacheTypeV} {
		if hd := mdl.headDim(); llamaopt.IsQuantized(ct) && hd%32 != 0 {
			mdl.free()
			return nil, fmt.Errorf("%w: a %s KV cache needs a head size that is a multiple of 32; this model's is %d",
				iface.ErrBadRequest, ct, hd)
		}
	}
	return mdl, nil
}

// slotShare is the cells a slot holds with a KV stream per sequence
// (kv_unified=false): n_ctx / nSlots, at least one.
func slotShare(opts llamaopt.Options, nSlots int) int { return max(opts.NCtx/nSlots, 1) }

// contextParamsFor is the context for nSlots slots and the scratch sequence.
// Split (kv_unified=false), every sequence has a KV stream of its own, the
// scratch one too: n_ctx grows by one slot's share (llama.cpp rounds a stream
// up to 256 cells).
func contextParamsFor(opts llamaopt.Options, nSlots int) contextParams {
	nSeq := nSlots + 1
	if parks(opts, nSlots) {
		nSeq++
	}
	p := contextParams{
		nCtx: opts.NCtx, nBatch: opts.NBatch, nUBatch: opts.NUBatch, nSeqMax: nSeq, perSeqKV: opts.KVSplit,
		nThreads: opts.NThreads, nThreadsBatch: opts.NThreadsBatch, flashAttn: opts.FlashAttn,
		typeK: opts.CacheTypeK, typeV: opts.CacheTypeV, swaFull: opts.SWAFull, RopeOptions: opts.RopeOptions,
	}
	if p.perSeqKV {
		p.nCtx = slotShare(opts, nSlots) * (nSlots + 1)
	}
	return p
}

// parks says whether the context has a park sequence (nSlots + 1), where a
// sequence leaving its slot for the prompt cache keeps its cells while it is
// saved, so that the slot's next prompt does not wait for the save: with the
// prompt cache, in one shared pool of cells (a sequence's own KV stream
// cannot be shared), without cache_reuse (which shifts the cells a slot
// keeps, the park's too), and within llama.cpp's sequences (MaxSlots and
// the scratch one).
func parks(opts llamaopt.Options, nSlots int) bool {
	return opts.CacheRAM != 0 && !opts.KVSplit && opts.CacheReuse == 0 && nSlots < llamaopt.MaxSlots
}

// newEngine is the engine of a loaded model and context, its slots empty.
func newEngine(mdl *model, lc *lctx, nSlots int, device string, opts llamaopt.Options, log hclog.Logger) *engine {
	e := &engine{model: mdl, ctx: lc, scratch: nSlots, park: -1, device: device, eagerLogits: opts.EagerLogits, log: log,
		cells:        kv.Cells{NCtx: lc.NCtx(), Unified: !opts.KVSplit, Slots: make([]*kv.Slot, nSlots)},
		contextShift: opts.ContextShift, cacheReuse: opts.CacheReuse,
		chatParseSpecial: opts.ChatParseSpecial}
	e.cells.SlotCtx = e.cells.NCtx
	if !e.cells.Unified { // the slots' streams; the scratch stream is not theirs
		e.cells.SlotCtx = min(slotShare(opts, nSlots), lc.NCtxSeq())
		e.cells.NCtx = e.cells.SlotCtx * nSlots
	}
	for i := range e.cells.Slots {
		e.cells.Slots[i] = kv.NewSlot(emptyState)
	}
	if parks(opts, nSlots) {
		e.park = nSlots + 1
		e.cells.Reclaim = e.reclaimParked
	}
	return e
}

func flashName(mode int) string {
	switch mode {
	case llamaopt.FlashOn:
		return "on"
	case llamaopt.FlashOff:
		return "off"
	}
	return "auto"
}

func (b *Backend) logLoaded(e *engine, opts llamaopt.Options, nGPU int, registerHost bool, took time.Duration) {
	device := "CPU"
	if e.device != "" {
		device = e.device
	}
	m := e.model
	b.log.Info("cuda-llama backend loaded", "model", m.desc(), "model_alias", e.info.Model.Alias, "model_hash", e.info.Model.Hash,
		"model_path", e.info.Model.Path, "device", device, "n_gpu_layers", nGPU, "n_layer", m.nLayer(), "n_slots", len(e.cells.Slots),
		"n_ctx", e.cells.NCtx, "n_vocab", m.nVocab, "flash_attn", flashName(opts.FlashAttn), "cache_type_k", opts.CacheTypeK,
		"cache_type_v", opts.CacheTypeV, "memory", e.layout.Memory, "state_parts", len(e.layout.Parts), "kv_bytes_per_token", e.layout.perToken(),
		"ctx_checkpoints", e.checkpointsText(opts.CkptOptions),
		"register_host_buffer", registerHost, "load_time", took.Round(time.Millisecond).String())
}

// gpuLoad remembers the one ggml_backend_load of a process: registering the
// library twice would list every GPU twice.
var gpuLoad struct {
	sync.Mutex
	done bool
	lib  string
	dev  *llama.Device
	name string
}

// loadGPU loads the ggml CUDA backend library if there is one; nil means CPU,
// and the log says why.
func (b *Backend) loadGPU(o llamaopt.Options) (*llama.Device, string) {
	gpuLoad.Lock()
	defer gpuLoad.Unlock()
	if gpuLoad.done {
		if gpuLoad.dev != nil && o.LibDir != "" && filepath.Dir(gpuLoad.lib) != filepath.Clean(o.LibDir) {
			b.log.Warn("the CUDA backend is already loaded from another directory", "loaded", gpuLoad.lib, llamaopt.OptLibDir, o.LibDir)
		}
		return gpuLoad.dev, gpuLoad.name
	}
	dev, name, lib := b.loadGPUOnce(o)
	gpuLoad.done, gpuLoad.dev, gpuLoad.name, gpuLoad.lib = lib != "", dev, name, lib
	return dev, name
}

// loadGPUOnce asks the CUDA driver for the GPUs, loads the CUDA build that
// fits them (gpuselect.go) and returns the first GPU device; nil means CPU,
// and the log says why.
func (b *Backend) loadGPUOnce(o llamaopt.Options) (_ *llama.Device, _ string, loaded string) {
	lib, note, problems, err := selectCUDALibrary(o.LibDir, func() (gpuInfo, error) { return queryGPUs(CUDADriverLibrary) })
	for _, p := range problems {
		// A library from another llama.cpp would corrupt memory, not fail
		// cleanly: refuse it loudly.
		b.log.Error("not loading a CUDA build: " + p.Error())
	}
	switch {
	case errors.Is(err, errNoCUDALibrary):
		b.log.Info("running on CPU: "+err.Error(), "hint", "make cuda builds it; --backend-opt lib_dir=DIR points at it")
		return nil, "", ""
	case errors.Is(err, errNoGPU):
		b.log.Warn("running on CPU: "+err.Error(), "lib_dir", libDirOrExe(o.LibDir))
		return nil, "", ""
	case err != nil:
		b.log.Error("running on CPU: " + err.Error())
		return nil, "", ""
	}
	b.log.Info("CUDA build chosen", "library", lib, "why", note)
	if !loadBackendLibrary(lib) {
		b.log.Warn("ggml could not load the CUDA backend, running on CPU (libggml-base.so.0 beside it or on LD_LIBRARY_PATH? CUDA runtime and driver present? see ggml's log above)",
			"library", lib)
		return nil, "", ""
	}
	dev, name := gpuDevice()
	if dev == nil {
		b.log.Warn("the CUDA backend sees no GPU, running on CPU", "library", lib)
		return nil, "", lib
	}
	b.log.Info("CUDA backend loaded", "library", lib, "device", name)
	return dev, name, lib
}

// relog re-logs a llama.cpp/ggml log line. Their INFO is chatty (model
// metadata, tensor lists), so it becomes Debug.
func (b *Backend) relog(level int, msg string) {
	switch level {
	case llama.LogError:
		b.log.Error("llama.cpp: " + msg)
	case llama.LogWarn:
		b.log.Warn("llama.cpp: " + msg)
	case llama.LogInfo:
		b.log.Debug("llama.cpp: " + msg)
	default:
		b.log.Trace("llama.cpp: " + msg)
	}
}

// measureLayout finds the state's parts and their sizes as functions of
// their cells by evaluating one and two tokens in the scratch sequence (which
// also warms the compute graphs up).
func (e *engine) measureLayout() (stateLayout, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.ctx
	defer c.SeqRm(e.scratch)
	var parts [3][]measuredPart
	var oneToken []byte
	for i := range parts {
		if i > 0 {
			if err := c.decode(e.scratch, []int32{0}, i-1, false); err != nil {
				return stateLayout{}, fmt.Errorf("warming up: %w", err)
			}
		}
		var err error
		if parts[i], err = c.stateParts(e.scratch); err != nil {
			return stateLayout{}, err
		}
		if i == 1 {
			if oneToken, err = c.stateData(e.scratch); err != nil {
				return stateLayout{}, err
			}
		}
	}
	l, err := measureParts(c.MemoryName(), parts[0], parts[1], parts[2])
	if err != nil {
		return l, fmt.Errorf("llama.cpp's %s state: %w", c.MemoryName(), err)
	}
	if e.vTrans, err = vTransOf(l, oneToken); err != nil {
		return l, err
	}
	e.setStreaming(l.MaxRow)
	return l, nil
}

// setStreaming sets the streaming thresholds that a block of this model (at
// most row × n_ctx bytes) can reach; 0 for one no block reaches, so that the
// restore logs say whether streaming was possible at all.
func (e *engine) setStreaming(row int64) {
	maxBlock := row * int64(e.cells.NCtx)
	reachable := func(threshold int64) int64 {
		if threshold > maxBlock {
			return 0
		}
		return threshold
	}
	e.streamInPlaceMin, e.streamRingMin = reachable(inPlaceStreamMin), reachable(ringStreamMin)
}

// Info returns what Load returned, with the weights' quantisation and
// placement as they are now.
func (b *Backend) Info(ctx context.Context) (iface.BackendInfo, error) {
	e, err := b.engine()
	if err != nil {
		return iface.BackendInfo{}, err
	}
	info := e.infoNow()
	e.awaitSave() // its counts include a save under way
	info.PromptCache = e.pcache.Stats()
	info.Checkpoints = e.checkpointStats()
	info.Speculative = e.specStats()
	return info, nil
}

func (b *Backend) engine() (*engine, error) {
	e := b.eng.Load()
	if e == nil {
		return nil, fmt.Errorf("%w: the cuda-llama backend is not loaded", iface.ErrBadRequest)
	}
	return e, nil
}

func (b *Backend) slot(i int) (*engine, *kv.Slot, error) {
	e, err := b.engine()
	if err != nil {
		return nil, nil, err
	}
	if i < 0 || i >= len(e.cells.Slots) {
		return nil, nil, fmt.Errorf("%w: %d (slots are 0..%d)", iface.ErrNoSlot, i, len(e.cells.Slots)-1)
	}
	return e, e.cells.Slots[i], nil
}

// Slot reports a slot's sequence from what the last operation on it left; it
// neither waits for a running operation nor touches the context.
func (b *Backend) Slot(ctx context.Context, i int) (iface.SlotInfo, error) {
	e, s, err := b.slot(i)
	if err != nil {
		return iface.SlotInfo{}, err
	}
	toks, logits, size := s.Snapshot()
	return iface.SlotInfo{Slot: i, NPast: len(toks), Tokens: slices.Clone(toks), StateSize: size + e.stateLogitsSize(logits)}, nil
}

// stateLogitsSize is the bytes of the logits a state carries after its
// memory's: a recurrent state's, when the slot has them (stateLayout.recurrent).
func (e *engine) stateLogitsSize(logits []float32) int64 {
	if !e.layout.recurrent() || logits == nil {
		return 0
	}
	return 4 * int64(len(logits))
}

// writeStateLogits writes the logits a state carries (stateLogitsSize).
func (e *engine) writeStateLogits(w io.Writer, logits []float32) (int64, error) {
	if e.stateLogitsSize(logits) == 0 {
		return 0, nil
	}
	n, err := w.Write(iface.AppendLogits(make([]byte, 0, 4*len(logits)), logits))
	return int64(n), err
}

// clear empties sequence i in the KV and the slot. Needs e.mu.
func (e *engine) clearLocked(i int, s *kv.Slot) {
	e.ctx.SeqRm(i)
	e.ckpts.Clear(i)
	s.Set(nil, nil, e.layout.size(0))
	s.Claim = 0
}

// ClearSlot empties a slot.
func (b *Backend) ClearSlot(ctx context.Context, i int) error {
	e, s, err := b.slot(i)
	if err != nil {
		return err
	}
	if err := s.Acquire(i); err != nil {
		return err
	}
	defer s.Release()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clearLocked(i, s)
	return nil
}

// failed empties the slot after a failed operation and returns err.
func (e *engine) failed(i int, s *kv.Slot, err error) error {
	e.mu.Lock()
	e.clearLocked(i, s)
	e.mu.Unlock()
	return err
}

// StateGet streams the slot's state, the bytes llama_state_seq_get_data gives,
// in chunks of at most chunkSize: into a ChunkWriter's own buffers when w is
// one (the shared-memory data plane: one copy less), else through staging
// buffers reused across calls. The context is held for the whole transfer.
func (b *Backend) StateGet(ctx context.Context, i int, chunkSize int, w io.Writer) (int64, error) {
	e, s, err := b.slot(i)
	if err != nil {
		return 0, err
	}
	if chunkSize <= 0 {
		return 0, fmt.Errorf("%w: chunk size %d", iface.ErrBadRequest, chunkSize)
	}
	if err := s.Acquire(i); err != nil {
		return 0, err
	}
	defer s.Release()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	defer e.beginTransfer(&e.saveMu)()
	start := time.Now()
	sv := e.saveState(ctx, i, chunkSize, w)
	b.log.Debug("state get", "slot", i, "bytes", sv.written, "chunk", chunkSize, "chunk_writer", sv.chunkWriter,
		"pinned", e.ctx.PinnedStaging(), "ring_pinned", sv.ringPinned, "elapsed", time.Since(start).String(), "error", sv.err)
	if sv.err != nil {
		return sv.written, sv.err
	}
	_, logits, _ := s.Snapshot()
	k, err := e.writeStateLogits(w, logits)
	return sv.written + k, err
}

// savedState is what saveState did.
type savedState struct {
	written     int64
	chunkWriter bool // w was a ChunkWriter, filled in place
	ringPinned  bool // its region was pinned for the save
	err         error
}

// saveState streams sequence i's memory state (without the logits a
// recurrent state carries after it) to w, as StateGet and the prompt cache
// save it; the caller holds the slot and a save (beginTransfer).
func (e *engine) saveState(ctx context.Context, i, chunkSize int, w io.Writer) savedState {
	// llama.cpp walks the cells under the context lock; the data is read
	// without it, beside the other slots' steps (StatePlan.Save).
	e.mu.Lock()
	plan, err := e.ctx.binding().PlanState(i)
	e.mu.Unlock()
	if err != nil {
		_, chunked := w.(shm.ChunkWriter)
		return savedState{chunkWriter: chunked, err: err}
	}
	defer plan.Free()
	return e.savePlan(ctx, plan, chunkSize, w)
}

// savePlan writes a planned state to w, in chunks of at most chunkSize,
// without the context lock.
func (e *engine) savePlan(ctx context.Context, plan *llama.StatePlan, chunkSize int, w io.Writer) savedState {
	call := &saveCall{ctx: ctx, w: w}
	var sink io.Writer = call
	cw, chunked := w.(shm.ChunkWriter)
	if chunked {
		sink = &chunkSave{saveCall: call, cw: cw}
	}
	// On a GPU the chunks are copied into the writer's own buffers on a
	// stream of the shim's; pinning the ring they live in makes that a
	// direct DMA.
	sv := savedState{chunkWriter: chunked}
	if rw, ok := w.(shm.RegionWriter); ok && e.device != "" {
		if unpin := llama.PinHost(rw.Region()); unpin != nil {
			defer unpin()
			sv.ringPinned = true
		}
	}
	sv.written, sv.err = plan.Save(chunkSize, sink)
	return sv
}

var _ shm.PipePutter = (*Backend)(nil)

// PipePutMaxChunk keeps restores at chunks above 1 MiB (the pipe's size) on
// the shm ring, where they are taken in place: through the pipe the plugin
// makes the socket copy itself, which pays only where the ring's per-chunk
// messages and wake-ups cost more than the host's copy saves.
func (b *Backend) PipePutMaxChunk() int { return 1 << 20 }

// StatePut restores the slot from r. The slot is emptied as the load
// begins, and on any failure (a bad head included): never half-restored.
// The state's head is checked against tokens before llama.cpp reads it, and
// each part's structure and row fields (layer count, types, row sizes) as
// llama.cpp reads them. Trailing bytes that are exactly the logits (NVocab
// f32) are adopted; otherwise the last token is re-evaluated, since the
// state holds no logits: by the first decode (restore_logits=lazy, the
// default), or here (eager). r is read to its end, except after a read error.
func (b *Backend) StatePut(ctx context.Context, i int, tokens []int32, r io.Reader, size int64) (int64, error) {
	entered := time.Now()
	e, s, err := b.slot(i)
	if err == nil {
		err = s.Acquire(i)
	}
	if err != nil {
		drain(r)
		return 0, err
	}
	defer s.Release()
	defer e.beginTransfer(&e.loadMu)()
	p := &statePut{e: e, i: i, s: s, tokens: tokens, r: r, size: size, entered: entered, log: b.log}
	n, err := p.restore(ctx)
	if err != nil {
		e.failed(i, s, nil)
		if !p.stopReading {
			drain(r)
		}
		return 0, err
	}
	return n, nil
}

// statePut is one StatePut under way: its request, and what its steps
// found, for the next steps and the debug line.
type statePut struct {
	e       *engine
	i       int
	s       *kv.Slot
	tokens  []int32
	r       io.Reader
	size    int64
	entered time.Time
	log     hclog.Logger

	head stateHead
	run  *restoreRun
	// stopReading: r failed or the restore was cancelled, so r must not be
	// drained.
	stopReading   bool
	start, loaded time.Time     // llama.cpp started and finished reading
	reeval        time.Duration // re-evaluating the last token (eager)
	// prompt: a prompt is evaluated after the restore (the prompt cache's),
	// so its logits are not computed even with restore_logits=eager.
	prompt bool
}

// restore checks the head, sets up the source, lets llama.cpp load the
// state into the emptied slot, then adopts trailing logits or computes them
// (eager). On failure the caller empties the slot. The context lock is taken
// twice (beside decoding steps each take waits up to a step): to empty the
// slot, claim its cells and load, and when llama.cpp has written the KV
// rows it reads without the lock, to finish the load and fill the slot.
func (p *statePut) restore(ctx context.Context) (n int64, err error) {
	e := p.e
	if err := ctx.Err(); err != nil {
		p.stopReading = true
		return 0, err
	}
	if p.head, err = readStateHead(p.r, p.tokens, e.model.nVocab, e.cells.SlotCtx, e.layout, p.size); err != nil {
		p.stopReading = !errors.Is(err, iface.ErrBadRequest)
		return 0, err
	}
	if p.run, err = e.restoreRun(ctx, p.r, p.head, p.size); err != nil {
		return 0, err
	}
	p.start = time.Now()
	defer func() { p.logDone(n, err) }()
	defer p.run.stop() // before r is read anywhere else, and before returning
	if n, err = p.load(); err != nil {
		return 0, err
	}
	logits, err := p.trailingLogits(n)
	if err != nil {
		return 0, err
	}
	p.run.stop()
	drain(p.r)
	if p.head.cells > 0 && logits == nil && e.eagerLogits && !p.prompt {
		t := time.Now()
		logits, err = e.reevaluate(p.i, p.tokens)
		if p.reeval = time.Since(t); err != nil {
			return 0, err
		}
	}
	if logits != nil {
		p.s.SetLogits(logits)
	}
	return n, nil
}

// beginTransfer starts a save (e.saveMu) or a restore (e.loadMu): one of
// each at a time, counted while it lasts (no context shift meanwhile); the
// function returned ends it and wakes the scheduler, whose shifts may have
// waited for it.
func (e *engine) beginTransfer(kind *sync.Mutex) func() {
	kind.Lock()
	e.transfers.Add(1)
	return func() {
		e.transfers.Add(-1)
		kind.Unlock()
		e.sched.Poke()
	}
}

// load empties the slot, claims the cells the state takes, lets llama.cpp
// read the state from the run's source, checks that it restored the
// positions the head announced and fills the slot (its logits to come); it
// returns the state's bytes, and releases them from the source.
func (p *statePut) load() (int64, error) {
	e := p.e
	lp := llama.LoadParams{Size: e.layout.size(p.head.cells), StreamMin: p.run.streamMin, PieceMin: p.run.pieceMin,
		Rules: bindingRules(e.layout.rules(p.head.cells)), NTokens: p.head.cells, Lock: &e.mu}
	lp.HoldFrom = e.layout.lockFrom(lp.Size, p.head.cells)
	var posErr error
	e.mu.Lock()
	e.clearLocked(p.i, p.s)
	if err := e.cells.Fits(p.i, p.head.cells); err != nil {
		e.mu.Unlock()
		return 0, err
	}
	p.s.Claim = p.head.cells
	got, err := e.ctx.binding().LoadState(p.i, p.run.src, lp)
	if err == nil {
		if np := e.ctx.nPos(p.i); np != p.head.cells {
			posErr = fmt.Errorf("restored %d positions, the state's head announced %d", np, p.head.cells)
		} else {
			p.s.Set(slices.Clone(p.tokens), nil, e.ctx.StateSize(p.i))
			p.s.Claim = 0
		}
	}
	e.mu.Unlock()
	p.loaded = time.Now()
	switch {
	case errors.Is(err, llama.ErrStateRefused):
		return 0, fmt.Errorf("%w: %w", iface.ErrBadRequest, err)
	case err != nil:
		p.stopReading = !errors.Is(err, iface.ErrBadRequest) // a failed reader or cancellation
		return 0, err
	case posErr != nil:
		return 0, posErr
	}
	return got, p.run.src.releaseTo(got)
}

// trailingLogits reads what follows the n bytes of state: exactly n_vocab
// f32 are the logits to adopt; nil otherwise (the rest is drained).
func (p *statePut) trailingLogits(n int64) ([]float32, error) {
	nVocab := p.e.model.nVocab
	if trailing := p.size - n; trailing != int64(4*nVocab) || nVocab == 0 {
		return nil, nil
	}
	raw := make([]byte, 4*nVocab)
	if k, err := io.ReadFull(p.run.src, raw); err != nil {
		p.stopReading = true
		return nil, truncated(n+int64(k), err)
	}
	return iface.ParseLogits(raw), nil
}

// logDone writes the restore's debug line: how it read and where the time
// went (see the README).
func (p *statePut) logDone(n int64, err error) {
	after := time.Duration(0)
	if !p.loaded.IsZero() {
		after = time.Since(p.loaded)
	}
	run := p.run
	p.log.Debug("state put", "slot", p.i, "bytes", n, "cells", p.head.cells, "in_place", run.inPlace, "streamed", run.streamMin > 0,
		"ring", run.ringSize, "ring_pinned", run.pinned, "setup", p.start.Sub(p.entered).String(), "elapsed", time.Since(p.start).String(),
		"wait_data", run.waitData.String(), "wait_space", run.waitSpace.String(), "after_load", after.String(),
		"reeval", p.reeval.String(), "error", err)
}

// restoreRun is where llama.cpp's reader takes a restore's bytes from, and
// what the restore's log line says of it.
type restoreRun struct {
	src                 restoreSource
	streamMin, pieceMin int64 // hydra_state_load's: reads streamed, and their least piece
	inPlace             bool
	ringSize            int
	pinned              bool
	waitData, waitSpace time.Duration
	stop                func() // ends the source and fills in the waits; idempotent
}

// streamPiece is the least piece a streamed restore uploads from the restore
// ring (hydra_state_load's piece_min; it takes more when the ring holds
// more); lent in place, a piece is what a buffer holds.
const streamPiece = 1 << 20

// maxInPlaceRegion is the largest data plane ring a restore takes in place:
// on a GPU the ring is pinned for each restore, which for larger rings costs
// more than the copy into the restore ring it saves.
const maxInPlaceRegion = 64 << 20

// restoreRun sets up the bytes after head (read from r) for llama.cpp: the
// shm plane's buffers in place when r lends them (pinned first on a GPU),
// else the engine's restore ring, which a prefetcher fills ahead from r.
func (e *engine) restoreRun(ctx context.Context, r io.Reader, head stateHead, size int64) (*restoreRun, error) {
	if m, ok := r.(*entryReader); ok { // a prompt cache entry, pinned (or not) for as long as it is kept
		return e.inPlaceRun(m, head, size, false)
	}
	if rr, ok := r.(shm.RegionReader); ok && len(rr.Region()) <= maxInPlaceRegion {
		run, err := e.inPlaceRun(rr, head, size, e.device != "")
		if run != nil || err != nil {
			return run, err
		}
		// Pinning failed: the plane's reader, still as it was, is read
		// into the restore ring as any other.
	}
	return e.ringRun(ctx, r, head, size)
}

// inPlaceRun lends llama.cpp the data plane's buffers, pinned for the
// restore with pin (on a GPU); nil, nil when pinning fails.
func (e *engine) inPlaceRun(rr shm.RegionReader, head stateHead, size int64, pin bool) (*restoreRun, error) {
	var unpin func()
	if pin {
		if unpin = llama.PinHost(rr.Region()); unpin == nil {
			return nil, nil
		}
	}
	ip, err := newInPlace(rr, head.raw, size)
	if err != nil {
		if unpin != nil {
			unpin()
		}
		return nil, err
	}
	run := &restoreRun{src: ip, inPlace: true, pinned: unpin != nil || pinnedRegion(rr), pieceMin: streamPiece}
	if e.streamInPlaceMin > 0 {
		run.streamMin, run.pieceMin = e.streamInPlaceMin, 1
	}
	run.stop = sync.OnceFunc(func() {
		ip.close()
		run.waitData = ip.waitData
		if unpin != nil {
			unpin()
		}
	})
	return run, nil
}

// ringRun reads the payload ahead into the engine's restore ring, one
// restore at a time, sized for the largest block unless that is streamed.
func (e *engine) ringRun(ctx context.Context, r io.Reader, head stateHead, size int64) (*restoreRun, error) {
	run := &restoreRun{pieceMin: streamPiece}
	e.ringMu.Lock()
	block := int(min(int64(head.cells)*e.layout.MaxRow, size))
	if e.streamRingMin > 0 && int64(block) >= e.streamRingMin {
		run.streamMin = e.streamRingMin
		block = min(block, streamedRingBlock) // only pieces and small fields need the ring
	}
	pf, err := startPrefetch(ctx, io.MultiReader(bytes.NewReader(head.raw), r), size, e.ring, block, e.newRing)
	if err != nil {
		e.ring = nil // startPrefetch closed it when it failed to replace it
		e.ringMu.Unlock()
		return nil, err
	}
	run.src = pf
	run.stop = sync.OnceFunc(func() {
		e.ring = pf.close()
		run.waitData, run.waitSpace = pf.waitData, pf.waitSpace
		run.ringSize, run.pinned = e.ring.size, e.ring.unpin != nil
		if e.ring.size > keepRing {
			_ = e.ring.close()
			e.ring = nil
		}
		e.ringMu.Unlock()
	})
	return run, nil
}

// reevaluate computes the logits after a restored sequence's last token, which
// the state does not carry: in the scratch sequence, sharing the restored
// cells before it (with a stream per sequence, a copy of the slot's stream),
// so the restored KV stays byte for byte as it came (a re-save gives the same
// bytes). That needs one free KV cell; in a full cache the last token is
// re-evaluated in place instead, its KV recomputed, which may differ from the
// original in the last bits.
func (e *engine) reevaluate(i int, tokens []int32) ([]float32, error) {
	if e.layout.recurrent() {
		return e.recompute(i, tokens)
	}
	n := len(tokens)
	logits := make([]float32, e.model.nVocab)
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.ctx
	c.SeqRm(e.scratch)
	if e.cells.Unified {
		c.SeqCp(i, e.scratch, 0, n-1)
	} else {
		c.SeqCp(i, e.scratch, -1, -1) // llama.cpp copies whole streams only
		c.SeqRmFrom(e.scratch, n-1)
	}
	err := c.decode(e.scratch, tokens[n-1:], n-1, true)
	c.SeqRm(e.scratch)
	if errors.Is(err, errKVFull) {
		c.SeqRmFrom(i, n-1)
		err = c.decode(i, tokens[n-1:], n-1, true)
	}
	if err != nil {
		return nil, fmt.Errorf("re-evaluating the restored sequence's last token: %w", err)
	}
	c.logitsInto(logits)
	return logits, nil
}

// recompute evaluates a sequence again from its tokens, for the logits after
// its last one: a recurrent state holds its last token already, so nothing
// shorter can give them. States carry their logits so that this is rare (a
// state from an engine that sent none, a slot after a quantisation swap).
func (e *engine) recompute(i int, tokens []int32) ([]float32, error) {
	e.log.Info("the sequence is evaluated again from its tokens: a recurrent state without its logits cannot give them otherwise",
		"slot", i, "tokens", len(tokens))
	logits := make([]float32, e.model.nVocab)
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.ctx
	c.SeqRm(i)
	for p := 0; p < len(tokens); p += c.nBatch {
		chunk := tokens[p:min(p+c.nBatch, len(tokens))]
		if err := c.decode(i, chunk, p, p+len(chunk) == len(tokens)); err != nil {
			c.SeqRm(i)
			return nil, fmt.Errorf("evaluating the restored sequence again: %w", err)
		}
	}
	c.logitsInto(logits)
	return logits, nil
}

// drain reads r to its end: the StatePut contract, so the host's stream stays
// in step whatever happened.
func drain(r io.Reader) { _, _ = io.Copy(io.Discard, r) }

// SetExpertMode switches between "solo" and "combined" (combined.go) and
// returns the mode really active: a switch that cannot be made (no peer, a
// slot at work, the peer out of memory) leaves the mode as it was, the
// reason in the log, as llama-engine answers "solo" without a peer.
func (b *Backend) SetExpertMode(ctx context.Context, mode string) (string, error) {
	if mode != "solo" && mode != "combined" {
		return "", fmt.Errorf("%w: expert_mode must be 'solo' or 'combined'", iface.ErrBadRequest)
	}
	e := b.eng.Load()
	if e == nil {
		b.log.Info("expert mode stays solo: the backend is not loaded", "requested", mode)
		return "solo", nil
	}
	if mode == "solo" && e.swap.boundTo() != "" {
		if err := e.unbindPeer(); err != nil {
			e.log.Warn("expert mode stays combined: going back to this engine's own weights: " + err.Error())
			return "combined", nil
		}
		return e.swap.modeNow(), nil
	}
	return e.setExpertMode(mode), nil
}

// LendWeights lists this engine's weights and where their bytes are, for
// a combined head of this host (lend.go).
func (b *Backend) LendWeights(ctx context.Context) (iface.WeightRegistry, error) {
	e, err := b.engine()
	if err != nil {
		return iface.WeightRegistry{}, err
	}
	return e.lendWeights()
}

// BindPeer binds the combined pattern's weights to a peer engine's
// (lend.go); what cannot be bound is answered solo with the reason.
func (b *Backend) BindPeer(ctx context.Context, reg iface.WeightRegistry) (iface.ExpertModeResult, error) {
	e, err := b.engine()
	if err != nil {
		return iface.ExpertModeResult{}, err
	}
	if e.swap.modeNow() == "combined" && e.swap.boundTo() == "" {
		return iface.ExpertModeResult{Mode: "combined", Reason: "combined mode is on with this host's peer device (" + llamaopt.OptCombinedPeer + "); SET_EXPERT_MODE solo first"}, nil
	}
	return e.bindPeer(reg), nil
}

// SwapQuant makes the weights matching tensorPattern come from the
// quantisation quantKey (quant.KEY options; "base" the loaded model), on
// the devices they are on, while every slot is idle (swap.go).
func (b *Backend) SwapQuant(ctx context.Context, quantKey, tensorPattern string) (iface.SwapResult, error) {
	e, err := b.engine()
	if err != nil {
		return iface.SwapResult{}, err
	}
	return e.swapQuant(quantKey, tensorPattern)
}

// referenceState is llama.cpp's own llama_state_seq_get_data for slot i: what
// StateGet must stream, byte for byte (the tests compare the two).
func (b *Backend) referenceState(i int) ([]byte, error) {
	e, _, err := b.slot(i)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ctx.stateData(i)
}
