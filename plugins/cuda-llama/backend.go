//go:build llama && cgo

package cudallama

/*
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime/cgo"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Linked reports whether llama.cpp is compiled in (build tag "llama", cgo).
const Linked = true

// Stop reasons of Decode.
const (
	StopEOS          = "eos"
	StopLength       = "length"
	StopNTokensLimit = "n_tokens_limit"
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
// The llama_context and model are never freed, deliberately: one engine per
// plugin process, and with this llama.cpp (ollama's ggml) llama_free of a
// context on the CUDA backend crashes (the scheduler's destructor resets
// backends the context already destroyed). The process exit reclaims them.
// Should a context ever need freeing, free its scheduler first.
type engine struct {
	info        iface.BackendInfo
	model       *model
	nCtx        int
	scratch     int         // the sequence id re-evaluations borrow: nSlots
	layout      stateLayout // state size as a function of cells
	device      string      // the GPU in use, "" on CPU
	pinRing     bool        // pin the data plane's ring for DMA (option pin_ring)
	copyThreads int         // goroutines copying restores out of the ring (option copy_threads)
	// streamMin: restores upload blocks of at least this many bytes piece by
	// piece from a small ring (option stream_restore, shim.cpp); 0: never.
	streamMin int64
	// inPlace: restores from the shm plane take its buffers where they are
	// and stream blocks of streamMinBlock bytes or more straight from them
	// (option restore_in_place, inplace_linux.go).
	inPlace   bool
	canStream bool // the KV buffers' hooks are ready (enableStream)
	// eagerLogits: a restore without logits re-evaluates its last token
	// before STATE_PUT answers, not in the first decode (restore_logits).
	eagerLogits bool
	slots       []*slot

	mu  sync.Mutex // serialises every use of ctx
	ctx *lctx

	ringMu sync.Mutex // held by the restore using ring
	ring   *mirror    // the restore ring (prefetch_linux.go), kept across restores up to keepRing bytes
}

// streamRing is the largest read a streamed restore takes from its ring:
// streamPiece, with room to spare.
const streamRing = 2 << 20

// The smallest block a restore streams: with stream_restore=true every
// block over 1 MiB; with auto (the default) only those a kept ring would
// not hold, where the mirror's memory (about 2.25× the block, pinned) is the
// larger cost. H200, 1.2 GB state of 18.8 MB blocks, medians of 6 STATE_PUTs
// in one run, streamed vs mirror: TCP 256 KiB 4.89 vs 5.26 GB/s, 2 MiB 4.45
// vs 4.75; Unix 3.13 vs 3.08, 3.33 vs 3.40 (docs/benchmarks/README.md, 19).
// Tests lower them to stream the tiny models' blocks.
var (
	streamMinBlock int64 = 1 << 20
	streamAutoMin  int64 = keepRing
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
		m.unpin = pinRegion(m.mem)
	}
	return m, nil
}

// slot is one sequence. mu guards the fields and is held briefly, so Slot
// answers while an operation runs; busy turns a second concurrent operation
// on the slot into ErrBusy should a caller break the one-op-per-slot rule.
// tokens and logits describe what the KV holds: the logits are the
// next-token distribution after the last token, nil when the slot is empty
// or a restore left them to the first decode (restore_logits=lazy).
type slot struct {
	mu        sync.Mutex
	busy      bool
	tokens    []int32 // append-only below len: snapshots share the array
	logits    []float32
	stateSize int64
}

func (s *slot) acquire(i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy {
		return fmt.Errorf("%w: slot %d", iface.ErrBusy, i)
	}
	s.busy = true
	return nil
}

func (s *slot) release() {
	s.mu.Lock()
	s.busy = false
	s.mu.Unlock()
}

func (s *slot) snapshot() ([]int32, []float32, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[:len(s.tokens):len(s.tokens)], s.logits, s.stateSize
}

func (s *slot) set(tokens []int32, logits []float32, size int64) {
	s.mu.Lock()
	s.tokens, s.logits, s.stateSize = tokens, logits, size
	s.mu.Unlock()
}

// Load loads the model (on the GPU when libggml-cuda.so is present and sees
// one), creates the context and measures the state layout.
func (b *Backend) Load(ctx context.Context, req iface.LoadRequest) (iface.BackendInfo, error) {
	b.loadMu.Lock()
	defer b.loadMu.Unlock()
	if b.eng.Load() != nil {
		return iface.BackendInfo{}, fmt.Errorf("%w: the cuda-llama backend is already loaded", iface.ErrBadRequest)
	}
	opts, err := parseOptions(req.Options)
	if err != nil {
		return iface.BackendInfo{}, err
	}
	nSlots := req.NSlots
	switch {
	case nSlots == 0:
		nSlots = DefaultNSlots
	case nSlots < 0 || nSlots > MaxSlots:
		return iface.BackendInfo{}, fmt.Errorf("%w: n_slots %d out of range [1, %d]", iface.ErrBadRequest, nSlots, MaxSlots)
	}
	path, err := checkModelFile(req.Model)
	if err != nil {
		return iface.BackendInfo{}, err
	}
	start := time.Now()
	llamaLog.Lock()
	llamaLog.log = b.relog
	llamaLog.Unlock()
	initLlama()

	// Hash the model while llama.cpp loads it: both read the whole file.
	hashCtx, cancelHash := context.WithCancel(ctx)
	defer cancelHash()
	type hashed struct {
		id  iface.ModelIdentity
		err error
	}
	hashDone := make(chan hashed, 1)
	go func() {
		id, err := iface.FileIdentity(hashCtx, path, opts.alias)
		hashDone <- hashed{id, err}
	}()

	gpuDev, gpuName := b.loadGPU(opts)
	if gpuDev != nil && opts.cudaSync != "auto" {
		if err := setCUDASync(opts.cudaSync); err != nil {
			b.log.Warn("CUDA keeps its default way of waiting: " + err.Error())
		} else {
			b.log.Info("CUDA waits for the GPU: "+opts.cudaSync, OptCUDASync, opts.cudaSync)
		}
	}
	nGPU := opts.nGPULayers
	switch {
	case gpuDev == nil && nGPU > 0:
		b.log.Warn("n_gpu_layers ignored: no GPU backend", "n_gpu_layers", nGPU)
		nGPU = 0
	case gpuDev == nil:
		nGPU = 0
	case nGPU < 0:
		nGPU = math.MaxInt32 // every layer
	}
	clearLlamaError()
	mdl, err := loadModel(path, modelParams{nGPULayers: nGPU, mmap: opts.mmap})
	if err != nil {
		return iface.BackendInfo{}, err
	}
	if why := mdl.unsupportedMemory(); why != "" {
		mdl.free()
		return iface.BackendInfo{}, fmt.Errorf("%w: %s is %s: its KV state is not a plain attention cache, which the cuda-llama backend's state streaming supports so far",
			iface.ErrBadRequest, path, why)
	}
	// ggml quantizes cache rows in blocks of 32 values and asserts (aborts
	// the process) if a head does not divide into them.
	for _, ct := range []string{opts.cacheTypeK, opts.cacheTypeV} {
		if hd := mdl.headDim(); isQuantized(ct) && hd%32 != 0 {
			mdl.free()
			return iface.BackendInfo{}, fmt.Errorf("%w: a %s KV cache needs a head size that is a multiple of 32; this model's is %d",
				iface.ErrBadRequest, ct, hd)
		}
	}
	lc, err := newContext(mdl, contextParams{
		nCtx: opts.nCtx, nBatch: opts.nBatch, nUBatch: opts.nUBatch, nSeqMax: nSlots + 1,
		nThreads: opts.nThreads, nThreadsBatch: opts.nThreadsBatch, flashAttn: opts.flashAttn,
		typeK: opts.cacheTypeK, typeV: opts.cacheTypeV,
	}, gpuDev)
	if err != nil {
		mdl.free()
		return iface.BackendInfo{}, err
	}
	e := &engine{model: mdl, ctx: lc, nCtx: lc.nCtx(), scratch: nSlots, device: gpuName, pinRing: opts.pinRing, copyThreads: opts.copyThreads,
		inPlace: opts.restoreInPlace && (gpuName == "" || opts.pinRing), eagerLogits: opts.eagerLogits, slots: make([]*slot, nSlots)}
	switch opts.streamRestore {
	case "on":
		e.streamMin = streamMinBlock
	case "auto":
		e.streamMin = streamAutoMin
	}
	for i := range e.slots {
		e.slots[i] = &slot{stateSize: emptyState}
	}
	if e.layout, err = e.measureLayout(); err != nil {
		return iface.BackendInfo{}, err
	}
	h := <-hashDone
	if h.err != nil {
		return iface.BackendInfo{}, h.err
	}
	e.info = iface.BackendInfo{
		Name:    Name,
		Version: Version + "+ollama." + llamaVersion(), // the llama.cpp/ggml source
		Model:   h.id,
		NSlots:  nSlots,
		NVocab:  mdl.nVocab,
		NCtx:    e.nCtx,
	}
	b.eng.Store(e)
	device := "CPU"
	if gpuName != "" {
		device = gpuName
	}
	b.log.Info("cuda-llama backend loaded", "model", mdl.desc(), "model_alias", h.id.Alias, "model_hash", h.id.Hash,
		"model_path", path, "device", device, "n_gpu_layers", nGPU, "n_layer", mdl.nLayer(), "n_slots", nSlots,
		"n_ctx", e.nCtx, "n_vocab", mdl.nVocab, "flash_attn", flashName(opts.flashAttn), "cache_type_k", opts.cacheTypeK,
		"cache_type_v", opts.cacheTypeV, "kv_bytes_per_token", e.layout.PerCell,
		"register_host_buffer", registerHostBufferAvailable(gpuDev), "load_time", time.Since(start).Round(time.Millisecond).String())
	return e.info, nil
}

// gpuLoad remembers the one ggml_backend_load of a process: registering the
// library twice would list every GPU twice.
var gpuLoad struct {
	sync.Mutex
	done bool
	lib  string
	dev  C.ggml_backend_dev_t
	name string
}

// loadGPU loads the ggml CUDA backend library if there is one; nil means CPU,
// and the log says why.
func (b *Backend) loadGPU(o options) (C.ggml_backend_dev_t, string) {
	gpuLoad.Lock()
	defer gpuLoad.Unlock()
	if gpuLoad.done {
		if gpuLoad.dev != nil && o.libDir != "" && filepath.Dir(gpuLoad.lib) != filepath.Clean(o.libDir) {
			b.log.Warn("the CUDA backend is already loaded from another directory", "loaded", gpuLoad.lib, OptLibDir, o.libDir)
		}
		return gpuLoad.dev, gpuLoad.name
	}
	dev, name, lib := b.loadGPUOnce(o)
	gpuLoad.done, gpuLoad.dev, gpuLoad.name, gpuLoad.lib = lib != "", dev, name, lib
	return dev, name
}

func (b *Backend) loadGPUOnce(o options) (_ C.ggml_backend_dev_t, _ string, loaded string) {
	lib, err := cudaLibrary(o.libDir)
	switch {
	case errors.Is(err, errNoCUDALibrary):
		b.log.Info("running on CPU: "+err.Error(), "hint", "make cuda builds it; --backend-opt lib_dir=DIR points at it")
		return nil, "", ""
	case err != nil:
		// A library from another llama.cpp would corrupt memory, not fail
		// cleanly: refuse it loudly, and run on CPU.
		b.log.Error("not loading the CUDA backend, running on CPU: " + err.Error())
		return nil, "", ""
	}
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
	case logError:
		b.log.Error("llama.cpp: " + msg)
	case logWarn:
		b.log.Warn("llama.cpp: " + msg)
	case logInfo:
		b.log.Debug("llama.cpp: " + msg)
	default:
		b.log.Trace("llama.cpp: " + msg)
	}
}

// measureLayout finds the state's size as a function of its cells by
// evaluating one and two tokens in the scratch sequence (which also warms the
// compute graphs up). An empty state must be the 8 bytes of a single stream.
func (e *engine) measureLayout() (stateLayout, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.ctx
	defer c.seqRm(e.scratch)
	if s := c.stateSize(e.scratch); s != emptyState {
		return stateLayout{}, fmt.Errorf("an empty sequence's state is %d bytes, want %d: not a single-stream KV cache", s, emptyState)
	}
	var sizes [2]int64
	var row int64
	for i := range sizes {
		if err := c.decode(e.scratch, []int32{0}, i, false); err != nil {
			return stateLayout{}, fmt.Errorf("warming up: %w", err)
		}
		sizes[i] = c.stateSize(e.scratch)
		if i == 0 {
			var err error
			if row, err = maxRow(c.stateData(e.scratch)); err != nil {
				return stateLayout{}, fmt.Errorf("reading a one-cell state: %w", err)
			}
			// Streaming needs the KV buffers' hooks; not worth them when
			// no block can reach a threshold.
			maxBlock := row * int64(e.nCtx)
			if e.streamMin > maxBlock {
				e.streamMin = 0
			}
			if e.streamMin > 0 || (e.inPlace && maxBlock >= streamMinBlock) {
				if err := c.enableStream(e.scratch, maxBlock); err != nil {
					return stateLayout{}, err
				}
				e.canStream = true
			}
		}
	}
	l := stateLayout{PerCell: sizes[1] - sizes[0], MaxRow: row}
	l.Base = sizes[0] - l.PerCell
	if l.PerCell <= cellMetaSize || l.Base <= emptyState || l.MaxRow <= 0 || l.MaxRow > l.PerCell {
		return stateLayout{}, fmt.Errorf("unexpected state sizes %d and %d for 1 and 2 cells", sizes[0], sizes[1])
	}
	return l, nil
}

// Info returns what Load returned.
func (b *Backend) Info(ctx context.Context) (iface.BackendInfo, error) {
	e, err := b.engine()
	if err != nil {
		return iface.BackendInfo{}, err
	}
	return e.info, nil
}

func (b *Backend) engine() (*engine, error) {
	e := b.eng.Load()
	if e == nil {
		return nil, fmt.Errorf("%w: the cuda-llama backend is not loaded", iface.ErrBadRequest)
	}
	return e, nil
}

func (b *Backend) slot(i int) (*engine, *slot, error) {
	e, err := b.engine()
	if err != nil {
		return nil, nil, err
	}
	if i < 0 || i >= len(e.slots) {
		return nil, nil, fmt.Errorf("%w: %d (slots are 0..%d)", iface.ErrNoSlot, i, len(e.slots)-1)
	}
	return e, e.slots[i], nil
}

// Slot reports a slot's sequence from what the last operation on it left; it
// neither waits for a running operation nor touches the context.
func (b *Backend) Slot(ctx context.Context, i int) (iface.SlotInfo, error) {
	_, s, err := b.slot(i)
	if err != nil {
		return iface.SlotInfo{}, err
	}
	toks, _, size := s.snapshot()
	return iface.SlotInfo{Slot: i, NPast: len(toks), Tokens: slices.Clone(toks), StateSize: size}, nil
}

// clear empties sequence i in the KV and the slot. Needs e.mu.
func (e *engine) clearLocked(i int, s *slot) {
	e.ctx.seqRm(i)
	s.set(nil, nil, emptyState)
}

// ClearSlot empties a slot.
func (b *Backend) ClearSlot(ctx context.Context, i int) error {
	e, s, err := b.slot(i)
	if err != nil {
		return err
	}
	if err := s.acquire(i); err != nil {
		return err
	}
	defer s.release()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.clearLocked(i, s)
	return nil
}

// promptTokens validates a prefill's prompt and returns its tokens.
func (e *engine) promptTokens(req iface.PrefillRequest) ([]int32, error) {
	// Presence is judged by length: over gRPC an empty list and none are alike.
	var toks []int32
	switch {
	case len(req.Messages) > 0 && len(req.Tokens) > 0:
		return nil, fmt.Errorf("%w: prefill has both messages and tokens", iface.ErrBadRequest)
	case len(req.Messages) > 0:
		for i, m := range req.Messages {
			if m.Role == "" {
				return nil, fmt.Errorf("%w: message %d has no role", iface.ErrBadRequest, i)
			}
		}
		text, err := e.model.applyTemplate(req.Messages)
		if err != nil {
			return nil, err
		}
		if toks, err = e.model.tokenize(text); err != nil {
			return nil, err
		}
	case len(req.Tokens) > 0:
		for i, t := range req.Tokens {
			if t < 0 || int(t) >= e.model.nVocab {
				return nil, fmt.Errorf("%w: token %d at position %d is outside the vocabulary [0, %d)",
					iface.ErrBadRequest, t, i, e.model.nVocab)
			}
		}
		toks = slices.Clone(req.Tokens)
	default:
		return nil, fmt.Errorf("%w: empty prompt: prefill needs messages or tokens", iface.ErrBadRequest)
	}
	switch {
	case len(toks) == 0:
		return nil, fmt.Errorf("%w: the prompt has no tokens", iface.ErrBadRequest)
	case len(toks) > e.nCtx:
		return nil, fmt.Errorf("%w: prompt has %d tokens, n_ctx is %d", iface.ErrBadRequest, len(toks), e.nCtx)
	}
	return toks, nil
}

// Prefill replaces the slot's sequence with the prompt. The slot is emptied
// first, so a failed prefill leaves it empty, not holding the old sequence.
// The context is released between batches so other slots' decodes go on.
func (b *Backend) Prefill(ctx context.Context, req iface.PrefillRequest) (iface.PrefillResult, error) {
	e, s, err := b.slot(req.Slot)
	if err != nil {
		return iface.PrefillResult{}, err
	}
	toks, err := e.promptTokens(req)
	if err != nil {
		return iface.PrefillResult{}, err
	}
	if err := s.acquire(req.Slot); err != nil {
		return iface.PrefillResult{}, err
	}
	defer s.release()
	e.mu.Lock()
	e.clearLocked(req.Slot, s)
	e.mu.Unlock()

	logits := make([]float32, e.model.nVocab)
	for off := 0; off < len(toks); off += e.ctx.nBatch {
		if err := ctx.Err(); err != nil {
			return iface.PrefillResult{}, e.failed(req.Slot, s, err)
		}
		end := min(off+e.ctx.nBatch, len(toks))
		e.mu.Lock()
		err := e.ctx.decode(req.Slot, toks[off:end], off, end == len(toks))
		if err == nil && end == len(toks) {
			e.ctx.logitsInto(logits)
		}
		e.mu.Unlock()
		if errors.Is(err, errKVFull) {
			err = fmt.Errorf("%w: no room for the prompt's %d tokens: the %d KV cells (n_ctx) are shared by all slots; clear some",
				iface.ErrBadRequest, len(toks), e.nCtx)
		}
		if err != nil {
			return iface.PrefillResult{}, e.failed(req.Slot, s, err)
		}
	}
	e.mu.Lock()
	size := e.ctx.stateSize(req.Slot)
	e.mu.Unlock()
	s.set(toks, logits, size)

	fallback := req.Model != "" && req.Model != e.info.Model.Alias
	if fallback {
		b.log.Warn("requested model is not resident, staying on the resident one",
			"requested", req.Model, "resident", e.info.Model.Alias, "slot", req.Slot)
	}
	return iface.PrefillResult{
		Slot:          iface.SlotInfo{Slot: req.Slot, NPast: len(toks), Tokens: slices.Clone(toks), StateSize: size},
		Logits:        slices.Clone(logits),
		ModelFallback: fallback,
	}, nil
}

// failed empties the slot after a failed operation and returns err.
func (e *engine) failed(i int, s *slot, err error) error {
	e.mu.Lock()
	e.clearLocked(i, s)
	e.mu.Unlock()
	return err
}

// Decode continues the slot's sequence. Each generated token is evaluated
// before it is emitted, so the KV always holds exactly the slot's tokens (a
// STATE_GET after a decode has them all) and the logits for the next token
// are ready; an interrupted decode keeps what it emitted.
func (b *Backend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	e, s, err := b.slot(req.Slot)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	if req.NPredict < 0 {
		return iface.DecodeResult{}, fmt.Errorf("%w: n_predict %d is negative", iface.ErrBadRequest, req.NPredict)
	}
	if err := s.acquire(req.Slot); err != nil {
		return iface.DecodeResult{}, err
	}
	defer s.release()
	toks, logits, _ := s.snapshot()
	if len(toks) == 0 {
		return iface.DecodeResult{}, fmt.Errorf("%w: slot is empty (slot %d)", iface.ErrBadRequest, req.Slot)
	}
	if logits == nil { // restored without logits (restore_logits=lazy)
		t := time.Now()
		if logits, err = e.reevaluate(req.Slot, toks); err != nil {
			return iface.DecodeResult{}, e.failed(req.Slot, s, err)
		}
		b.log.Debug("decode re-evaluated the restored last token", "slot", req.Slot, "reeval", time.Since(t).String())
		s.mu.Lock()
		s.logits = logits
		s.mu.Unlock()
	}
	var smp *sampler
	if !greedy(req.Sampler) {
		smp = newSampler(req.Sampler, e.model.nVocab)
		defer smp.free()
	}
	res := iface.DecodeResult{NPast: len(toks)}
	defer func() {
		e.mu.Lock()
		size := e.ctx.stateSize(req.Slot)
		e.mu.Unlock()
		s.mu.Lock()
		s.stateSize = size
		s.mu.Unlock()
	}()
	for {
		switch {
		case res.TokensGenerated >= req.NPredict:
			res.StopReason = StopLength
			return res, nil
		case res.NPast >= e.nCtx:
			res.StopReason = StopNTokensLimit
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		var tok int32
		if smp == nil {
			tok = int32(argmax(logits))
		} else {
			tok = smp.sample(logits, uniform(req.Sampler.Seed, res.NPast))
		}
		lp := logprob(logits, int(tok))
		if e.model.isEOG(tok) {
			res.StopReason = StopEOS
			return res, nil
		}
		e.mu.Lock()
		err := e.ctx.decode(req.Slot, []int32{tok}, res.NPast, true)
		if err == nil {
			e.ctx.logitsInto(logits) // the slot's own buffer: we hold the slot
		}
		e.mu.Unlock()
		if errors.Is(err, errKVFull) {
			b.log.Warn("KV cache full: the slots' sequences fill n_ctx together", "slot", req.Slot, "n_ctx", e.nCtx)
			res.StopReason = StopNTokensLimit
			return res, nil
		}
		if err != nil {
			// The KV may or may not hold the token: start the slot afresh
			// rather than guess.
			return res, e.failed(req.Slot, s, err)
		}
		s.mu.Lock()
		s.tokens = append(s.tokens, tok)
		s.mu.Unlock()
		res.TokensGenerated++
		res.NPast++
		if emit != nil {
			if err := emit(iface.Token{ID: tok, Text: e.model.piece(tok), Logprob: lp}); err != nil {
				return res, err
			}
		}
	}
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
	if err := s.acquire(i); err != nil {
		return 0, err
	}
	defer s.release()
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	call := &saveCall{ctx: ctx, w: w}
	mode := C.int(0)
	if cw, ok := w.(iface.ChunkWriter); ok {
		call.cw, mode = cw, 1
	}
	// On a GPU the chunks are copied synchronously into the writer's own
	// buffers; pinning the ring they live in makes that a direct DMA.
	pinned := false
	if rw, ok := w.(iface.RegionWriter); ok && e.device != "" && e.pinRing {
		if unpin := pinRegion(rw.Region()); unpin != nil {
			defer unpin()
			pinned = true
		}
	}
	h := cgo.NewHandle(call)
	defer h.Delete()
	defer call.pin.Unpin()
	var msg [512]C.char
	start := time.Now()
	defer func() {
		b.log.Debug("state get", "slot", i, "bytes", call.written, "chunk", chunkSize, "chunk_writer", call.cw != nil,
			"pinned", e.ctx.pinnedStaging(), "ring_pinned", pinned, "elapsed", time.Since(start).String(), "error", call.err)
	}()
	e.mu.Lock()
	n := C.hydra_state_save(e.ctx.io, e.ctx.c, C.llama_seq_id(i), C.uintptr_t(h), C.size_t(chunkSize), mode, &msg[0], C.size_t(len(msg)))
	e.mu.Unlock()
	switch {
	case n >= 0 && int64(n) != call.written:
		return call.written, fmt.Errorf("state stream: %d bytes produced, %d written", int64(n), call.written)
	case n >= 0:
		return call.written, nil
	case call.err != nil:
		return call.written, call.err
	default:
		return call.written, fmt.Errorf("llama.cpp state write failed: %s", C.GoString(&msg[0]))
	}
}

var _ iface.PipePutter = (*Backend)(nil)

// PipePutMaxChunk keeps restores at chunks above 1 MiB (the pipe's size) on
// the shm ring. Through the pipe the plugin makes the socket copy itself
// (the prefetcher's read); that pays where the ring's per-chunk messages and
// wake-ups cost more than the host's copy saves. H200, 1.2 GB state,
// `scripts/gpu-bench.sh plugin-ab`, medians of 12 STATE_PUTs in one run, this
// rule vs pipes at every chunk size: 2 MiB TCP 4.40 vs 4.59 GB/s, Unix 3.12
// vs 2.73 (docs/benchmarks/README.md, 16 and 18).
func (b *Backend) PipePutMaxChunk() int { return 1 << 20 }

// StatePut restores the slot from r. The slot is emptied first, and on any
// failure emptied again: never half-restored. The state's head is checked
// against tokens before llama.cpp reads it; llama.cpp checks the rest (layer
// count, types, row sizes). Trailing bytes that are exactly the logits
// (NVocab f32) are adopted; otherwise the last token is re-evaluated, since the
// state holds no logits: by the first decode (restore_logits=lazy, the
// default), or here (eager). r is read to its end, except after a read error.
func (b *Backend) StatePut(ctx context.Context, i int, tokens []int32, r io.Reader, size int64) (n int64, err error) {
	entered := time.Now()
	e, s, err := b.slot(i)
	if err != nil {
		drain(r)
		return 0, err
	}
	if err := s.acquire(i); err != nil {
		drain(r)
		return 0, err
	}
	defer s.release()
	readErr := false
	defer func() {
		if err != nil {
			e.failed(i, s, nil)
			if !readErr {
				drain(r)
			}
		}
	}()
	e.mu.Lock()
	e.clearLocked(i, s)
	e.mu.Unlock()
	if err := ctx.Err(); err != nil {
		readErr = true // cancelled: stop reading
		return 0, err
	}

	// The shm plane's buffers are lent to llama.cpp in place; any other
	// reader is read ahead into the engine's restore ring.
	rr, _ := r.(iface.RegionReader)
	if !e.inPlace {
		rr = nil
	}
	cr := r
	if rr == nil {
		cr = readerFor(r, e.copyThreads)
	}
	head, err := readStateHead(cr, tokens, e.model.nVocab, e.nCtx, e.layout, size)
	if err != nil {
		readErr = !errors.Is(err, iface.ErrBadRequest)
		return 0, err
	}
	run, err := e.restoreRun(ctx, rr, cr, head, size)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	var loaded time.Time     // llama.cpp done with the bytes
	var reeval time.Duration // re-evaluating the last token, part of elapsed
	defer func() {
		after := time.Duration(0)
		if !loaded.IsZero() {
			after = time.Since(loaded)
		}
		b.log.Debug("state put", "slot", i, "bytes", n, "cells", head.cells, "in_place", run.inPlace, "streamed", run.streamMin > 0,
			"ring", run.ringSize, "ring_pinned", run.pinned, "setup", start.Sub(entered).String(), "elapsed", time.Since(start).String(),
			"wait_data", run.waitData.String(), "wait_space", run.waitSpace.String(), "after_load", after.String(),
			"reeval", reeval.String(), "error", err)
	}()
	stop := run.stop // before r is read anywhere else, and before returning
	defer stop()
	pf := run.src
	call := &loadCall{pf: pf}
	h := cgo.NewHandle(call)
	defer h.Delete()
	var msg [512]C.char
	e.mu.Lock()
	clearLlamaError()
	got := C.hydra_state_load(e.ctx.io, e.ctx.c, C.llama_seq_id(i), C.uintptr_t(h), C.size_t(run.streamMin), C.size_t(run.pieceMin),
		&msg[0], C.size_t(len(msg)))
	if got >= 0 {
		if np := e.ctx.nPos(i); np != head.cells {
			err = fmt.Errorf("restored %d positions, the state's head announced %d", np, head.cells)
		}
	}
	llamaErr := lastLlamaError()
	e.mu.Unlock()
	loaded = time.Now()
	switch {
	case got < 0 && call.err != nil:
		readErr = !errors.Is(call.err, iface.ErrBadRequest) // a failed reader or cancellation: stop reading
		return 0, call.err
	case got < 0:
		return 0, fmt.Errorf("%w: llama.cpp refused the state: %s%s", iface.ErrBadRequest, C.GoString(&msg[0]), llamaErr)
	case err != nil:
		return 0, err
	}
	n = int64(got)
	if err := pf.releaseTo(n); err != nil {
		return 0, err
	}

	// What follows the state: logits to adopt, or anything else to skip.
	var logits []float32
	if trailing := size - n; trailing == int64(4*e.model.nVocab) && e.model.nVocab > 0 {
		raw := make([]byte, trailing)
		if k, err := io.ReadFull(pf, raw); err != nil {
			readErr = true
			return 0, truncated(n+int64(k), err)
		}
		logits = make([]float32, e.model.nVocab)
		for j := range logits {
			logits[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
		}
	}
	stop()
	drain(r)
	if head.cells > 0 && logits == nil && e.eagerLogits {
		t := time.Now()
		logits, err = e.reevaluate(i, tokens)
		reeval = time.Since(t)
		if err != nil {
			return 0, err
		}
	}
	e.mu.Lock()
	stateSize := e.ctx.stateSize(i)
	e.mu.Unlock()
	s.set(slices.Clone(tokens), logits, stateSize)
	return n, nil
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

// maxInPlaceRegion is the largest data plane ring a restore takes in place.
// On a GPU the ring is pinned for each restore, which for the 256 MiB ring
// of 64 MiB chunks cost more than the copy it saves (H200, 1.2 GB state:
// in place 2.06 GB/s over TCP, 2.17 over Unix, against 2.74 and 2.76 with
// the restore ring in an earlier run, docs/benchmarks/README.md, 22).
const maxInPlaceRegion = 64 << 20

// restoreRun sets up the bytes after head (read from cr) for llama.cpp: the
// shm plane's buffers in place when rr is set (pinned first on a GPU; if
// that fails, the restore ring after all), else the engine's restore ring,
// which a prefetcher fills ahead from cr.
func (e *engine) restoreRun(ctx context.Context, rr iface.RegionReader, cr io.Reader, head stateHead, size int64) (*restoreRun, error) {
	run := &restoreRun{pieceMin: streamPiece}
	if rr != nil && len(rr.Region()) <= maxInPlaceRegion {
		var unpin func()
		if e.device != "" {
			unpin = pinRegion(rr.Region())
		}
		if e.device == "" || unpin != nil {
			ip, err := newInPlace(rr, head.raw, size)
			if err != nil {
				if unpin != nil {
					unpin()
				}
				return nil, err
			}
			run.src, run.inPlace, run.pinned = ip, true, unpin != nil
			if e.canStream {
				run.streamMin, run.pieceMin = streamMinBlock, 1
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
	}
	if rr != nil {
		// Not in place after all (a ring too large, or pinning failed): the
		// plane's reader, still as it was, copies as any other would.
		cr = readerFor(cr, e.copyThreads)
	}
	// The restore ring is the engine's, one restore at a time; the
	// prefetcher reads the payload ahead into it from here on.
	e.ringMu.Lock()
	block := int(min(int64(head.cells)*e.layout.MaxRow, size))
	if e.canStream && e.streamMin > 0 && int64(block) >= e.streamMin {
		run.streamMin = e.streamMin
		block = min(block, streamRing) // only pieces and small fields need the ring
	}
	pf, err := startPrefetch(ctx, io.MultiReader(bytes.NewReader(head.raw), cr), size, e.ring, block, e.newRing)
	if err != nil {
		e.ring = nil // startPrefetch closed it when it failed to replace it
		e.ringMu.Unlock()
		return nil, err
	}
	run.src = pf
	run.stop = sync.OnceFunc(func() {
		e.ring = pf.close()
		run.waitData, run.waitSpace = pf.waits()
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
// cells before it, so the restored KV stays byte for byte as it came (a
// re-save gives the same bytes). That needs one free KV cell; in a full cache
// the last token is re-evaluated in place instead, its KV recomputed, which
// may differ from the original in the last bits.
func (e *engine) reevaluate(i int, tokens []int32) ([]float32, error) {
	n := len(tokens)
	logits := make([]float32, e.model.nVocab)
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.ctx
	c.seqRm(e.scratch)
	c.seqCp(i, e.scratch, 0, n-1)
	err := c.decode(e.scratch, tokens[n-1:], n-1, true)
	c.seqRm(e.scratch)
	if errors.Is(err, errKVFull) {
		c.seqRmFrom(i, n-1)
		err = c.decode(i, tokens[n-1:], n-1, true)
	}
	if err != nil {
		return nil, fmt.Errorf("re-evaluating the restored sequence's last token: %w", err)
	}
	c.logitsInto(logits)
	return logits, nil
}

// drain reads r to its end: the StatePut contract, so the host's stream stays
// in step whatever happened.
func drain(r io.Reader) { _, _ = io.Copy(io.Discard, r) }

// SetExpertMode accepts "solo" and "combined"; without a peer there is nothing
// to combine with, so the mode stays "solo" (as llama-engine does).
func (b *Backend) SetExpertMode(ctx context.Context, mode string) (string, error) {
	switch mode {
	case "solo":
		return "solo", nil
	case "combined":
		b.log.Info("expert mode combined requested, but no peer is configured: staying solo")
		return "solo", nil
	default:
		return "", fmt.Errorf("%w: expert_mode must be 'solo' or 'combined'", iface.ErrBadRequest)
	}
}

// SwapQuant is not supported yet.
func (b *Backend) SwapQuant(ctx context.Context, quantKey, tensorPattern string) error {
	return fmt.Errorf("%w: the cuda-llama backend cannot swap quantisations", iface.ErrNotImplemented)
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
	return e.ctx.stateData(i), nil
}
