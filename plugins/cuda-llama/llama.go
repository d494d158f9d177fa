//go:build llama && cgo

package cudallama

// The adapter's side of the binding (internal/llama): the model as the
// engine uses it, the context with its batch size and streams, and
// llama.cpp's log routed to hclog.

import (
	"errors"
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// llamaCommit is the commit of the llama.cpp tree this binary was built
// from, as the build read it from the tree (hydra-llama-commit.h).
const llamaCommit = llama.Commit

// initLlama initialises llama.cpp once per process and routes its logs (and
// ggml's) to the function llama.SetLog set.
func initLlama() { llama.Init() }

// loadBackendLibrary registers a ggml backend library (libggml-cuda.so). Only
// this one library is loaded: ggml_backend_load_all would also register a
// second CPU backend next to the one linked in.
func loadBackendLibrary(path string) bool { return llama.LoadBackend(path) }

// gpuDevice is the first GPU device ggml knows, or nil.
func gpuDevice() (*llama.Device, string) { return llama.FirstGPU() }

// registerHostBufferAvailable reports whether the GPU backend offers
// ggml_backend_register_host_buffer (llama.Device.RegisterHostBuffer says
// why that cannot pin the data plane's ring). Logged at load.
func registerHostBufferAvailable(dev *llama.Device) bool { return dev.RegisterHostBuffer() }

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

// lctx is the one llama_context (the binding's, which has its batch and
// state streaming) as the engine uses it: the scheduler's Context and the
// slots' Memory through the binding's methods. Every method needs
// engine.mu.
type lctx struct {
	*llama.Context
	nBatch int
	nVocab int
	// nStream is the KV cache's streams: 1 (unified), or one per sequence.
	nStream int
}

type contextParams struct {
	nCtx, nBatch, nUBatch   int
	nSeqMax                 int
	nRsSeq                  int  // recurrent-state snapshots a sequence (speculative rollback)
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

func newContext(m *model, p contextParams, gpu *llama.Device) (*lctx, error) {
	cp := llama.ContextParams{NCtx: p.nCtx, NBatch: p.nBatch, NUBatch: p.nUBatch, NSeqMax: p.nSeqMax, NRsSeq: p.nRsSeq, PerSeqKV: p.perSeqKV,
		NThreads: p.nThreads, NThreadsBatch: p.nThreadsBatch, FlashAttn: p.flashAttn, TypeK: p.typeK, TypeV: p.typeV,
		SWAFull: p.swaFull, RopeScaling: p.RopeScaling, RopeFreqScale: p.RopeFreqScale, YarnOrigCtx: p.YarnOrigCtx, GPU: gpu}
	if p.embedPooling != nil {
		cp.Embeddings, cp.Pooling = true, *p.embedPooling
	}
	c, err := llama.NewContext(m.m, cp)
	if err != nil {
		return nil, err
	}
	return ofContext(c), nil
}

// ofContext is c as the engine uses it.
func ofContext(c *llama.Context) *lctx {
	return &lctx{Context: c, nBatch: c.NBatch(), nVocab: c.NVocab(), nStream: c.NStream()}
}

// binding is the context as internal/llama's type, for the binding's
// functions that take one.
func (c *lctx) binding() *llama.Context { return c.Context }

// errKVFull: llama_decode found no free KV cells for the batch.
var errKVFull = sched.ErrKVFull

// decodeErr is a decode's error as the scheduler knows it.
func decodeErr(err error) error {
	if errors.Is(err, llama.ErrKVFull) {
		return errKVFull
	}
	return err
}

// decode evaluates tokens at positions pos.. in sequence seq (at most
// nBatch of them), computing logits for the last one when logits is set.
func (c *lctx) decode(seq int, tokens []int32, pos int, logits bool) error {
	return decodeErr(c.DecodeSeq(seq, tokens, pos, logits))
}

// Decode evaluates b (at most nBatch rows) through the context's batch.
func (c *lctx) Decode(b *sched.Batch) error { return decodeErr(c.Context.Decode((*llama.Batch)(b))) }

// logitsInto copies the logits of the batch's last token.
func (c *lctx) logitsInto(dst []float32) { c.LogitsInto(-1, dst) }

// nPos is the number of positions in the sequence's KV (pos max + 1).
func (c *lctx) nPos(seq int) int { return c.SeqPosMax(seq) + 1 }

// stateData is llama.cpp's own llama_state_seq_get_data as one stream,
// without its head, the reference the tests compare the streamed bytes
// with.
func (c *lctx) stateData(seq int) ([]byte, error) {
	raw, err := c.StateData(seq)
	if err != nil {
		return nil, err
	}
	return oneStream(raw, c.nStream, seq), nil
}

// stateParts measures the parts of sequence seq's state.
func (c *lctx) stateParts(seq int) ([]measuredPart, error) {
	parts, err := c.StateParts(seq)
	if err != nil {
		return nil, err
	}
	out := make([]measuredPart, len(parts))
	for i, p := range parts {
		out[i] = measuredPart{kind: partKind(p.Kind), cellMeta: p.CellMeta, capacity: p.Capacity, swa: p.SWA, bytes: p.Bytes, maxRow: p.MaxRow,
			fields: p.Fields}
	}
	return out, nil
}

// bindingRules is rules as the binding checks a restore against them.
func bindingRules(rules []partRule) []llama.PartRule {
	out := make([]llama.PartRule, len(rules))
	for i, r := range rules {
		out[i] = llama.PartRule{Kind: int(r.Kind), CellMeta: r.CellMeta, Base: r.Base, PerCell: r.PerCell, Empty: r.Empty,
			MinCells: r.MinCells, MaxCells: r.MaxCells, Fields: r.Fields}
	}
	return out
}

// Logs: the binding assembles llama.cpp's and ggml's log lines and keeps its
// error lines (llama.SetLog, llama.LastError); the backend re-logs them
// through hclog (Backend.relog).

// ggml log levels.
const (
	logInfo  = llama.LogInfo
	logWarn  = llama.LogWarn
	logError = llama.LogError
)

// llamaLogText writes text to llama.cpp's log (llama.Log).
func llamaLogText(level int, text string) { llama.Log(level, text) }

// lastLlamaError returns ": " and the first error lines llama.cpp logged since
// the last call (clearLlamaError), or "".
func lastLlamaError() string { return llama.LastError() }

func clearLlamaError() { llama.ClearError() }
