//go:build llama && cgo

package cudallama

// A thin binding of our own over llama.h and the shim (shim.cpp). The
// include paths into the pinned llama.cpp tree and its static libraries
// (llama, ggml, ggml-base, ggml-cpu, built by its CMake) come from
// CGO_CPPFLAGS and CGO_LDFLAGS (mk/llama.mk).

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include "hydra-llama-commit.h"
#include "kernels.h"
#include "shim.h"

// The fields a prefill or decode batch sets; the rest of llama_batch stays as
// llama_batch_init left it.
static void hydra_batch_set(struct llama_batch * b, int i, llama_token tok, llama_pos pos, llama_seq_id seq, int logits) {
	b->token[i] = tok;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = (int8_t) logits;
}
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// llamaCommit is the commit of the llama.cpp tree this binary was built
// from, as the build read it from the tree (hydra-llama-commit.h).
const llamaCommit = C.HYDRA_LLAMA_COMMIT

var initOnce sync.Once

// initLlama initialises llama.cpp once per process and routes its logs (and
// ggml's) to hclog.
func initLlama() {
	initOnce.Do(func() {
		C.hydra_log_install()
		C.llama_backend_init()
	})
}

// loadBackendLibrary registers a ggml backend library (libggml-cuda.so). Only
// this one library is loaded: ggml_backend_load_all would also register a
// second CPU backend next to the one linked in.
func loadBackendLibrary(path string) bool {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	return C.ggml_backend_load(cs) != nil
}

// gpuDevice is the first GPU device ggml knows, or nil.
func gpuDevice() (C.ggml_backend_dev_t, string) {
	for i := C.size_t(0); i < C.ggml_backend_dev_count(); i++ {
		d := C.ggml_backend_dev_get(i)
		switch C.ggml_backend_dev_type(d) {
		case C.GGML_BACKEND_DEVICE_TYPE_GPU, C.GGML_BACKEND_DEVICE_TYPE_IGPU:
			return d, C.GoString(C.ggml_backend_dev_name(d)) + " (" + C.GoString(C.ggml_backend_dev_description(d)) + ")"
		}
	}
	return nil, ""
}

// registerHostBufferAvailable reports whether the GPU backend offers
// ggml_backend_register_host_buffer (ggml-cuda does, through
// ggml_backend_reg_get_proc_address). It pins existing host memory, but only
// with GGML_CUDA_REGISTER_HOST set and read-only for the device (it was made
// for mmapped weights), so it cannot pin the data plane's ring as a copy
// destination; that needs a writable cudaHostRegister. Logged at load.
func registerHostBufferAvailable(dev C.ggml_backend_dev_t) bool {
	if dev == nil {
		return false
	}
	name := C.CString("ggml_backend_register_host_buffer")
	defer C.free(unsafe.Pointer(name))
	return C.ggml_backend_reg_get_proc_address(C.ggml_backend_dev_backend_reg(dev), name) != nil
}

// model is a loaded llama_model. Like the context, it is never freed: see
// engine.
type model struct {
	m      llama.Model
	vocab  llama.Vocab
	nVocab int
	bos    int32  // the BOS token, -1 if none
	tmpl   string // chat template (the model's, else ChatML) for llama.cpp's matcher
	jinja  string // the model's own chat template, "" if it has none
	// tok is the vocabulary's special tokens, what add_special adds and
	// MaxTokenBytes (vocab.go).
	tok *tokenizer
}

type modelParams struct {
	nGPULayers int
	mmap       bool
	placement  llamaopt.PlacementOptions // override_tensor, n_cpu_moe
	mtp        bool                      // load the multi-token-prediction block too (draft-mtp)
}

func loadModel(path string, p modelParams) (*model, error) {
	m, err := loadWeights(path, llama.ModelParams{GPULayers: p.nGPULayers, Mmap: p.mmap, MTP: p.mtp}, p.placement)
	if errors.Is(err, llama.ErrLoad) {
		return nil, fmt.Errorf("llama.cpp could not load model %s%s", path, lastLlamaError())
	}
	if err != nil {
		return nil, err
	}
	logPlacement(m, p.placement.Rules())
	mdl := &model{m: m}
	mdl.vocab = m.Vocab()
	mdl.nVocab = mdl.vocab.NTokens()
	mdl.bos = mdl.vocab.BOS()
	if mdl.tok, err = newTokenizer(mdl.vocab); err != nil {
		m.Free()
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	var ok bool
	if mdl.jinja, ok = m.ChatTemplate(""); ok {
		mdl.tmpl = mdl.jinja
	} else {
		mdl.tmpl = "chatml" // llama-server's default too
	}
	return mdl, nil
}

// specialText is a special token's text (BOS, EOS), as a template writes it.
func (m *model) specialText(tok int32) string {
	if tok < 0 {
		return ""
	}
	if t := m.vocab.Piece(tok, true); len(t) <= 128 { // the buffer it was read into, "" beyond it
		return t
	}
	return ""
}

// cmodel is the model for the adapter's cgo (draft contexts, swaps,
// combined mode, embeddings, common/chat) until that moves into the binding.
func (m *model) cmodel() *C.struct_llama_model { return (*C.struct_llama_model)(m.m.Ptr()) }

// cvocab is the vocabulary for the adapter's cgo (sampler chains, grammars).
func (m *model) cvocab() *C.struct_llama_vocab { return (*C.struct_llama_vocab)(m.vocab.Ptr()) }

// addsBOS reports whether tokenizing adds BOS at the start.
func (m *model) addsBOS() bool { return m.vocab.AddsBOS() }

// eos is the end-of-sequence token, -1 if none.
func (m *model) eos() int32 { return m.vocab.EOS() }

// free releases a model that no context uses (a Load that failed after
// loading it). Freeing models is safe; it is contexts on CUDA that are not
// (see engine).
func (m *model) free() { m.m.Free() }

// recurrentState reports whether the model's memory holds a recurrent state
// (recurrent or hybrid), which cannot be cut back before its last token.
func (m *model) recurrentState() bool { return m.m.Recurrent() || m.m.Hybrid() }

// composite says what the model's memory is made of when it is more than
// one attention cache ("" when it is one): its states have several parts.
func (m *model) composite() string {
	switch {
	case m.m.Recurrent():
		return "recurrent"
	case m.m.Hybrid():
		return "hybrid (attention + recurrent)"
	case m.nSWA() > 0:
		return "sliding-window attention"
	}
	return ""
}

// nSWA is the attention window of a sliding-window model (0: none).
func (m *model) nSWA() int { return m.m.NSWA() }

func (m *model) desc() string { return m.m.Desc() }

func (m *model) nLayer() int { return m.m.NLayer() }

func (m *model) nEmbd() int { return m.m.NEmbd() }

// metaString is a GGUF metadata value as text ("" if the model has none).
func (m *model) metaString(key string) string { return m.m.MetaString(key) }

// headDim is the attention head size (n_embd / n_head).
func (m *model) headDim() int {
	h := m.m.NHead()
	if h <= 0 {
		return 0
	}
	return m.m.NEmbd() / h
}

func (m *model) IsEOG(tok int32) bool { return m.vocab.IsEOG(tok) }

// tokenize tokenizes text as llama-server tokenizes a completion's prompt:
// special tokens parsed, BOS (and EOS) added as the vocabulary says.
func (m *model) tokenize(text string) ([]int32, error) { return m.tokenizePrompt(text, "", 0) }

// Piece is a token's text; control tokens have none. Byte tokens give single
// bytes, possibly part of a UTF-8 sequence, as llama.cpp returns them.
func (m *model) Piece(tok int32) string { return m.vocab.Piece(tok, false) }

// applyTemplate renders chat messages with the model's template (llama.cpp's
// built-in template engine recognises the common ones), ending with the
// assistant's turn.
func (m *model) applyTemplate(msgs []iface.Message) (string, error) {
	chat := make([]llama.ChatMessage, len(msgs))
	for i, msg := range msgs {
		chat[i] = llama.ChatMessage{Role: msg.Role, Content: msg.Content}
	}
	s, ok := llama.ApplyTemplate(m.tmpl, chat)
	if !ok {
		return "", fmt.Errorf("%w: the model's chat template %q is not one llama.cpp knows", iface.ErrBadRequest, truncate(m.tmpl, 80))
	}
	return s, nil
}

// lctx is the one llama_context with its batch and the shim's streaming
// state. Every method needs engine.mu.
type lctx struct {
	c      *C.struct_llama_context
	mem    C.llama_memory_t
	batch  C.struct_llama_batch
	nBatch int
	nVocab int
	io     *C.struct_hydra_io
	// nStream is the KV cache's streams: 1 (unified), or one per sequence.
	nStream int
}

type contextParams struct {
	nCtx, nBatch, nUBatch   int
	nSeqMax                 int
	perSeqKV                bool // a KV stream per sequence, n_ctx split among them
	nThreads, nThreadsBatch int
	flashAttn               int
	typeK, typeV            string
	swaFull                 bool
	llamaopt.RopeOptions    // rope_scaling, rope_scale, yarn_orig_ctx
	// embedPooling, when set, makes an embedding context (embed.go): it
	// outputs embeddings pooled so (a llama_pooling_type; -1 the model's).
	embedPooling *int
}

func ggmlType(t string) C.enum_ggml_type {
	switch t {
	case "f32":
		return C.GGML_TYPE_F32
	case "bf16":
		return C.GGML_TYPE_BF16
	case "q8_0":
		return C.GGML_TYPE_Q8_0
	case "q4_0":
		return C.GGML_TYPE_Q4_0
	}
	return C.GGML_TYPE_F16
}

func newContext(m *model, p contextParams, gpu C.ggml_backend_dev_t) (*lctx, error) {
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(p.nCtx)
	cp.n_batch = C.uint32_t(min(p.nBatch, p.nCtx))
	cp.n_ubatch = C.uint32_t(min(p.nUBatch, p.nBatch, p.nCtx))
	cp.n_seq_max = C.uint32_t(p.nSeqMax)
	cp.n_threads = C.int32_t(p.nThreads)
	cp.n_threads_batch = C.int32_t(p.nThreadsBatch)
	cp.flash_attn_type = C.enum_llama_flash_attn_type(p.flashAttn)
	cp.type_k = ggmlType(p.typeK)
	cp.type_v = ggmlType(p.typeV)
	cp.rope_scaling_type = C.enum_llama_rope_scaling_type(p.RopeScaling) // -1: the model's
	if p.RopeFreqScale > 0 {
		cp.rope_freq_scale = C.float(p.RopeFreqScale) // 0 (the default): the model's
	}
	cp.yarn_orig_ctx = C.uint32_t(p.YarnOrigCtx) // 0: the model's training context
	cp.kv_unified = C.bool(!p.perSeqKV)          // states are one stream on the wire either way (shim.cpp)
	cp.swa_full = C.bool(p.swaFull)
	cp.offload_kqv = true
	cp.no_perf = true
	if p.embedPooling != nil {
		cp.embeddings = true
		cp.pooling_type = C.enum_llama_pooling_type(*p.embedPooling)
	}
	// Everything that can fail comes before the context, which is never freed.
	io := C.hydra_io_new(gpu)
	if io == nil {
		return nil, errors.New("out of memory")
	}
	clearLlamaError()
	c := C.llama_init_from_model(m.cmodel(), cp)
	if c == nil {
		return nil, fmt.Errorf("llama.cpp could not create a context%s", lastLlamaError())
	}
	lc := &lctx{c: c, mem: C.llama_get_memory(c), nBatch: int(cp.n_batch), nVocab: m.nVocab, io: io, nStream: 1}
	if p.perSeqKV {
		lc.nStream = int(C.llama_n_seq_max(c))
	}
	lc.batch = C.llama_batch_init(C.int32_t(lc.nBatch), 0, 1)
	return lc, nil
}

// binding is the context as internal/llama's type, for the binding's
// functions that take one.
func (c *lctx) binding() *llama.Context { return llama.ContextOf(unsafe.Pointer(c.c)) }

// lctxOf is an lctx over a context the binding made (a draft's), with no
// batch or streaming state: for the methods that need the context and its
// memory alone.
func lctxOf(c *llama.Context) *lctx {
	p := (*C.struct_llama_context)(c.Ptr())
	return &lctx{c: p, mem: C.llama_get_memory(p)}
}

func (c *lctx) nCtx() int { return int(C.llama_n_ctx(c.c)) }

// useReferenceKernels makes the context's CPU work run ggml's reference
// kernels, for tests whose oracle is bit-for-bit equality of results computed
// in batches of different sizes, which ggml's optimized CPU kernels do not
// give (kernels.cpp); it returns the CPU backends switched.
func (c *lctx) useReferenceKernels() int { return int(C.hydra_cpu_reference_kernels(c.c)) }

// nCtxSeq is the cells one sequence may hold: n_ctx, or its stream's.
func (c *lctx) nCtxSeq() int { return int(C.llama_n_ctx_seq(c.c)) }

// errKVFull: llama_decode found no free KV cells for the batch.
var errKVFull = sched.ErrKVFull

// decode evaluates tokens at positions pos.. in sequence seq (at most nBatch
// of them), computing logits for the last one when logits is set.
func (c *lctx) decode(seq int, tokens []int32, pos int, logits bool) error {
	n := len(tokens)
	for i, t := range tokens {
		last := 0
		if logits && i == n-1 {
			last = 1
		}
		C.hydra_batch_set(&c.batch, C.int(i), C.llama_token(t), C.llama_pos(pos+i), C.llama_seq_id(seq), C.int(last))
	}
	return c.decodeBatch(&c.batch, n)
}

// decodeBatch evaluates the first n tokens of batch.
func (c *lctx) decodeBatch(batch *C.struct_llama_batch, n int) error {
	batch.n_tokens = C.int32_t(n)
	clearLlamaError()
	switch r := C.llama_decode(c.c, *batch); {
	case r == 0:
		return nil
	case r == 1:
		return errKVFull
	default:
		return fmt.Errorf("llama_decode failed (%d)%s", int(r), lastLlamaError())
	}
}

// Decode evaluates b (at most nBatch rows) through the context's batch.
func (c *lctx) Decode(b *sched.Batch) error {
	n := b.Len()
	copy(unsafe.Slice((*int32)(unsafe.Pointer(c.batch.token)), n), b.Token)
	copy(unsafe.Slice((*int32)(unsafe.Pointer(c.batch.pos)), n), b.Pos)
	nSeq, seqs, logits := unsafe.Slice(c.batch.n_seq_id, n), unsafe.Slice(c.batch.seq_id, n), unsafe.Slice(c.batch.logits, n)
	for i := range n {
		nSeq[i], *seqs[i], logits[i] = 1, C.llama_seq_id(b.Seq[i]), 0
		if b.Logits[i] {
			logits[i] = 1
		}
	}
	return c.decodeBatch(&c.batch, n)
}

// Logits is the logits of the batch's row i (computed for it), in
// llama.cpp's memory until the next evaluation; nil where it has none.
func (c *lctx) Logits(i int) []float32 {
	p := c.logitsPtr(i)
	if p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), c.nVocab)
}

// logitsInto copies the logits of the batch's last token.
func (c *lctx) logitsInto(dst []float32) { c.logitsAt(-1, dst) }

// logitsPtr is the logits of the batch's i-th token (computed for it; -1:
// the last).
func (c *lctx) logitsPtr(i int) *C.float { return C.llama_get_logits_ith(c.c, C.int32_t(i)) }

// logitsAt copies the logits of the batch's i-th token.
func (c *lctx) logitsAt(i int, dst []float32) {
	copy(dst, unsafe.Slice((*float32)(unsafe.Pointer(c.logitsPtr(i))), c.nVocab))
}

func (c *lctx) SeqRm(seq int) {
	C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), -1, -1)
}

// seqRmFrom removes positions p0 and after from the sequence; false where
// the memory cannot be cut there (a recurrent state, which holds its last
// token), the sequence then as it was.
func (c *lctx) SeqRmFrom(seq, p0 int) bool {
	return bool(C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), -1))
}

// seqPosMin is the sequence's first position the memory still holds (a
// sliding window drops the positions before its window); -1 if empty.
func (c *lctx) SeqPosMin(seq int) int {
	return int(C.llama_memory_seq_pos_min(c.mem, C.llama_seq_id(seq)))
}

// canShift reports whether the cache can move positions (context shift,
// cache reuse).
func (c *lctx) CanShift() bool { return bool(C.llama_memory_can_shift(c.mem)) }

// seqRmRange removes positions [p0, p1) from the sequence.
func (c *lctx) SeqRmRange(seq, p0, p1 int) {
	C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), C.llama_pos(p1))
}

// seqShift adds delta to the positions [p0, p1) of the sequence; the keys
// are re-rotated by the next llama_decode.
func (c *lctx) SeqShift(seq, p0, p1, delta int) {
	C.llama_memory_seq_add(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), C.llama_pos(p1), C.llama_pos(delta))
}

// seqCp shares positions [p0, p1) of src with dst (in a unified cache the
// cells gain a sequence id; no KV is copied). Between streams llama.cpp
// copies the whole stream, and only for p0 = p1 = -1.
func (c *lctx) seqCp(src, dst, p0, p1 int) {
	C.llama_memory_seq_cp(c.mem, C.llama_seq_id(src), C.llama_seq_id(dst), C.llama_pos(p0), C.llama_pos(p1))
}

// nPos is the number of positions in the sequence's KV (pos max + 1).
func (c *lctx) nPos(seq int) int {
	return int(C.llama_memory_seq_pos_max(c.mem, C.llama_seq_id(seq))) + 1
}

// seqPosMax is the sequence's last position in memory; -1 if empty.
func (c *lctx) seqPosMax(seq int) int {
	return int(C.llama_memory_seq_pos_max(c.mem, C.llama_seq_id(seq)))
}

// nUBatch is the context's physical batch.
func (c *lctx) nUBatch() int { return int(C.llama_n_ubatch(c.c)) }

// partialState is the part of the sequence's memory that cannot be cut
// back (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid's recurrent rows, a
// sliding window's cache), in host memory: a context checkpoint's bytes.
func (c *lctx) partialState(seq int) ([]byte, error) { return c.PartialStateInto(seq, nil) }

// PartialStateInto is partialState written into buf's memory where it fits
// (a speculating slot's rollback, saved every step), else into new memory.
func (c *lctx) PartialStateInto(seq int, buf []byte) ([]byte, error) {
	const flags = C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
	n := C.llama_state_seq_get_size_ext(c.c, C.llama_seq_id(seq), flags)
	if n == 0 {
		return nil, fmt.Errorf("llama.cpp has no partial state of sequence %d", seq)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, int(n))
	}
	buf = buf[:int(n)]
	got := C.llama_state_seq_get_data_ext(c.c, (*C.uint8_t)(unsafe.Pointer(&buf[0])), n, C.llama_seq_id(seq), flags)
	if got != n {
		return nil, fmt.Errorf("llama.cpp wrote %d bytes of sequence %d's partial state, announced %d: %s", got, seq, n, lastLlamaError())
	}
	return buf, nil
}

// SetPartialState loads a partialState into the sequence, replacing the
// part it covers; the rest of the memory is left as it is.
func (c *lctx) SetPartialState(seq int, data []byte) error {
	if len(data) == 0 {
		return errors.New("empty partial state")
	}
	got := C.llama_state_seq_set_data_ext(c.c, (*C.uint8_t)(unsafe.Pointer(&data[0])), C.size_t(len(data)), C.llama_seq_id(seq),
		C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
	if int(got) != len(data) {
		return fmt.Errorf("llama.cpp read %d of the %d bytes of sequence %d's partial state: %s", got, len(data), seq, lastLlamaError())
	}
	return nil
}

// seqStateHead is the head llama_state_seq_get_data writes before the
// sequence's memory: a magic number and the source sequence id. The wire's
// state is the memory's serialisation alone (shim.cpp), which restores
// into any slot.
const (
	seqStateHead  = 8
	seqStateMagic = 0xaf143cd8
)

// StateSize is the bytes of the sequence's state as one stream (shim.cpp):
// llama.cpp's, less its head and the other streams' empty cell counts.
func (c *lctx) StateSize(seq int) int64 {
	return int64(C.llama_state_seq_get_size(c.c, C.llama_seq_id(seq))) - seqStateHead - 4*int64(c.nStream-1)
}

// stateData is llama.cpp's own llama_state_seq_get_data as one stream,
// without its head, the reference the tests compare the streamed bytes
// with.
func (c *lctx) stateData(seq int) ([]byte, error) {
	n := c.StateSize(seq) + seqStateHead + 4*int64(c.nStream-1)
	buf := C.malloc(C.size_t(max(n, 1)))
	defer C.free(buf)
	got := C.llama_state_seq_get_data(c.c, (*C.uint8_t)(buf), C.size_t(n), C.llama_seq_id(seq))
	raw := C.GoBytes(buf, C.int(got))
	if len(raw) < seqStateHead || binary.LittleEndian.Uint32(raw) != seqStateMagic || int32(binary.LittleEndian.Uint32(raw[4:])) != int32(seq) {
		return nil, fmt.Errorf("llama.cpp's state of sequence %d does not start with its head (magic %#x, the sequence id): % x",
			seq, seqStateMagic, raw[:min(len(raw), seqStateHead)])
	}
	return oneStream(raw[seqStateHead:], c.nStream, seq), nil
}

func (c *lctx) pinnedStaging() bool { return C.hydra_io_pinned(c.io) != 0 }

// streamed counts the K/V blocks restores streamed and the runs of them
// llama.cpp read (more than one a block where it scatters the block).
func (c *lctx) streamed() (blocks, runs uint64) {
	var r C.uint64_t
	b := C.hydra_io_streamed(c.io, &r)
	return uint64(b), uint64(r)
}

// Logs: llama.cpp and ggml log through one callback (shim.cpp), often a line
// in several pieces; lines are assembled here and re-logged through hclog.
// Error lines are also kept: llama.cpp reports most failures only in its log.
var llamaLog struct {
	sync.Mutex
	log    func(level int, msg string)
	line   strings.Builder
	level  int
	errors []string // since the last lastLlamaError
}

// ggml log levels.
const (
	logDebug = 1
	logInfo  = 2
	logWarn  = 3
	logError = 4
	logCont  = 5
)

const maxKeptErrors = 3

func llamaLogText(level int, text string) {
	l := &llamaLog
	l.Lock()
	defer l.Unlock()
	if level != logCont {
		l.level = level
	}
	for text != "" {
		i := strings.IndexByte(text, '\n')
		if i < 0 {
			l.line.WriteString(text)
			return
		}
		l.line.WriteString(text[:i])
		text = text[i+1:]
		msg := strings.TrimSpace(l.line.String())
		l.line.Reset()
		if msg == "" {
			continue
		}
		if l.level == logError && len(l.errors) < maxKeptErrors {
			l.errors = append(l.errors, msg)
		}
		if l.log != nil {
			l.log(l.level, msg)
		}
	}
}

// lastLlamaError returns ": " and the first error lines llama.cpp logged since
// the last call (clearLlamaError), or "".
func lastLlamaError() string {
	llamaLog.Lock()
	defer llamaLog.Unlock()
	e := llamaLog.errors
	llamaLog.errors = nil
	if len(e) == 0 {
		return ""
	}
	return ": " + strings.Join(e, "; ")
}

func clearLlamaError() { _ = lastLlamaError() }
