// Package mock is a pure-Go, deterministic CPU backend with a fake KV cache.
// It exists so that CI, demos and benchmarks can drive the whole host and the
// state-transfer pipeline without a GPU or a model file: tokens are bytes, the
// next token is a hash of the sequence, and the per-sequence state is a
// llama.cpp-like byte stream whose KV part is generated on the fly (see
// state.go), so multi-gigabyte states cost no memory.
package mock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/promptcache"
)

// Identity of the backend as reported by Info.
const (
	Name    = "mock"
	Version = "0.1.0"
)

// Defaults and limits of the load options.
const (
	DefaultKVBytesPerToken = 16384
	DefaultNCtx            = 32768
	DefaultNSlots          = 4
	DefaultAlias           = "mock"

	MaxKVBytesPerToken = 16 << 20
	// MaxNCtx keeps n_cells within the format's u32 and a full state
	// (MaxNCtx × MaxKVBytesPerToken) within int64.
	MaxNCtx    = 1 << 24
	MaxNSlots  = 4096
	maxOpDelay = time.Hour
)

// Option keys understood by Load.
const (
	OptKVBytesPerToken = "kv_bytes_per_token"
	OptNCtx            = "n_ctx"
	OptOpDelayMS       = "op_delay_ms"
	OptAlias           = "alias"
	// OptKVUnified: the slots share one pool of n_ctx cells, as llama.cpp's
	// unified cache (a prompt that finds the pool held by other sequences
	// fails with iface.ErrNoRoom, a decode stops when it fills); default
	// false: each slot has n_ctx cells of its own.
	OptKVUnified = "kv_unified"
)

var knownOptions = []string{OptAlias, OptCacheRAM, OptEmbdNormalize, OptEmbeddings, OptKVBytesPerToken, OptKVUnified, OptNCtx, OptOpDelayMS, OptPooling}

// LlamaServerOptions are the llama plugin's options that hydra-engine's
// llama-server mode passes (cmd/hydra-engine/llamaserver.go), beyond those
// the mock shares with it (n_ctx, kv_unified, alias). The mock accepts them
// so that a node configuration written for llama-server runs on it, as the
// tests run one, and says at load, in one line, that they have no effect
// here: the mock has no weights, template or threads for them to set.
var LlamaServerOptions = []string{
	"cache_reuse", "cache_type_k", "cache_type_v", "chat_template_file", "chat_template_kwargs", "checkpoint_min_step",
	"checkpoint_ram", "combined_pattern", "context_shift", "ctx_checkpoints", "flash_attn", "jinja", "n_batch", "n_cpu_moe", "n_gpu_layers", "n_threads", "n_threads_batch",
	"n_ubatch", "override_tensor", "reasoning", "rope_scale", "rope_scaling", "swa_full", "use_mmap", "yarn_orig_ctx",
}

// SpecOptions are the llama plugin's speculative-decoding options (and
// llama-server's --spec-* parameters' in its mode): the mock refuses them,
// saying so, since it has no model to draft with and its tokens are not a
// model's, so a configuration that asks for drafts learns it cannot have them.
var SpecOptions = []string{
	"draft_model", "draft_max", "draft_min", "draft_p_min", "draft_n_gpu_layers", "draft_batch_max", "draft_rule", "spec_type",
	"spec_ngram_simple_size_n", "spec_ngram_simple_size_m", "spec_ngram_map_k_size_n", "spec_ngram_map_k_size_m",
}

// Backend is the mock backend. The zero value is not usable; call New.
type Backend struct {
	log hclog.Logger

	loadMu sync.Mutex             // serialises Load
	eng    atomic.Pointer[engine] // nil until Load succeeds; immutable afterwards
}

var _ iface.Backend = (*Backend)(nil)

// engine is what Load configures. Its fields never change after Load, so the
// hot paths read them without locking; only the slots carry mutable state.
type engine struct {
	info      iface.BackendInfo
	kvBytes   int    // fake KV bytes per token, a multiple of 8
	pat       []byte // what cells' KV is cut from (newPattern)
	nCtx      int    // cells a slot may hold; with kvUnified, all slots together
	kvUnified bool
	opDelay   time.Duration
	embed     embedOptions
	slots     []*slot
	cells     sync.Mutex         // serialises the shared pool's checks with the claims they make (kvUnified)
	pcache    *promptcache.Cache // HTTP completions' sequences in host memory (promptcache.go); nil without
}

// New returns an unloaded mock backend logging to logger (nil: discard).
func New(logger hclog.Logger) *Backend {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Backend{log: logger}
}

// Load parses the options, computes the model identity and sizes the slots.
func (b *Backend) Load(ctx context.Context, req iface.LoadRequest) (iface.BackendInfo, error) {
	b.loadMu.Lock()
	defer b.loadMu.Unlock()
	if b.eng.Load() != nil {
		return iface.BackendInfo{}, fmt.Errorf("%w: mock backend is already loaded", iface.ErrBadRequest)
	}
	opts, err := parseOptions(req.Options)
	if err != nil {
		return iface.BackendInfo{}, err
	}
	nSlots := req.NSlots
	switch {
	case nSlots == 0:
		nSlots = DefaultNSlots
	case nSlots < 0 || nSlots > MaxNSlots:
		return iface.BackendInfo{}, fmt.Errorf("%w: n_slots %d out of range [1, %d]", iface.ErrBadRequest, nSlots, MaxNSlots)
	}
	id, err := modelIdentity(ctx, req.Model, opts)
	if err != nil {
		return iface.BackendInfo{}, err
	}
	e := &engine{
		info: iface.BackendInfo{
			Name:    Name,
			Version: Version,
			Model:   id,
			NSlots:  nSlots,
			NVocab:  NVocab,
			NCtx:    opts.nCtx * nSlots,
			// Decode's prompt is a Prefill then the decode (Decode in slots.go).
			PromptDecode:  true,
			NCtxSlot:      opts.nCtx,
			KVUnified:     opts.kvUnified,
			MaxTokenBytes: 1, // a token is a byte (Tokenize)
			StateLayout:   StateLayout(opts.kvBytes),
			Special:       specialTokens(),
			NBatch:        NBatch,
		},
		embed:     opts.embed,
		kvBytes:   opts.kvBytes,
		pat:       newPattern(opts.kvBytes),
		nCtx:      opts.nCtx,
		kvUnified: opts.kvUnified,
		opDelay:   opts.opDelay,
		slots:     make([]*slot, nSlots),
	}
	for i := range e.slots {
		e.slots[i] = &slot{hash: hashSeed}
	}
	opts.embed.describe(&e.info)
	if opts.kvUnified {
		e.info.NCtx = opts.nCtx
	}
	e.pcache = promptcache.New(promptcache.BudgetOf(opts.cacheRAM), e.info.NCtx, promptcache.Mapped{})
	b.eng.Store(e)
	if len(opts.inert) > 0 {
		b.log.Info("options of the llama plugin, no effect on the mock: " + strings.Join(opts.inert, " "))
	}
	b.log.Info("mock backend loaded", "model_alias", id.Alias, "model_hash", id.Hash, "model_path", id.Path,
		"n_slots", nSlots, "n_ctx", opts.nCtx, "kv_unified", opts.kvUnified, "kv_bytes_per_token", opts.kvBytes, "op_delay", opts.opDelay,
		OptCacheRAM+"_mib", opts.cacheRAM, "pooling", e.info.Pooling)
	return e.info, nil
}

// Info returns what Load returned.
func (b *Backend) Info(ctx context.Context) (iface.BackendInfo, error) {
	e, err := b.engine()
	if err != nil {
		return iface.BackendInfo{}, err
	}
	info := e.info
	info.PromptCache = e.pcache.Stats()
	return info, nil
}

// SetExpertMode accepts "solo" and "combined"; the mock has no peer to
// combine with, so the active mode is always "solo" (as llama-engine does when
// no peer is configured).
func (b *Backend) SetExpertMode(ctx context.Context, mode string) (string, error) {
	switch mode {
	case "solo":
		return "solo", nil
	case "combined":
		b.log.Info("expert mode combined requested, but the mock backend has no peer: staying solo")
		return "solo", nil
	default:
		return "", fmt.Errorf("%w: expert_mode must be 'solo' or 'combined'", iface.ErrBadRequest)
	}
}

// SwapQuant is not supported: the mock has no tensors.
func (b *Backend) SwapQuant(ctx context.Context, quantKey, tensorPattern string) (iface.SwapResult, error) {
	return iface.SwapResult{}, fmt.Errorf("%w: the mock backend has no quantised tensors", iface.ErrNotImplemented)
}

// LendWeights is not supported: the mock has no weights to lend.
func (b *Backend) LendWeights(context.Context) (iface.WeightRegistry, error) {
	return iface.WeightRegistry{}, fmt.Errorf("%w: the mock backend has no weights to lend", iface.ErrNotImplemented)
}

// BindPeer is not supported: the mock has no weights to bind.
func (b *Backend) BindPeer(context.Context, iface.WeightRegistry) (iface.ExpertModeResult, error) {
	return iface.ExpertModeResult{}, fmt.Errorf("%w: the mock backend has no weights to bind to a peer's", iface.ErrNotImplemented)
}

func (b *Backend) engine() (*engine, error) {
	e := b.eng.Load()
	if e == nil {
		return nil, fmt.Errorf("%w: mock backend is not loaded", iface.ErrBadRequest)
	}
	return e, nil
}

// slot returns slot i of a loaded engine.
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

type options struct {
	kvBytes   int
	nCtx      int
	cacheRAM  int64 // MiB; -1: no limit; 0: no prompt cache
	kvUnified bool
	opDelay   time.Duration
	alias     string
	embed     embedOptions
	inert     []string // LlamaServerOptions given, as key=value
}

func parseOptions(m map[string]string) (options, error) {
	o := options{kvBytes: DefaultKVBytesPerToken, nCtx: DefaultNCtx, embed: embedOptions{normalize: 2}}
	// Sorted so that the first error reported does not depend on map order.
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m[k]
		if ok, err := o.embed.parse(k, v); ok {
			if err != nil {
				return options{}, err
			}
			continue
		}
		var err error
		switch k {
		case OptKVBytesPerToken:
			o.kvBytes, err = iface.ParseIntOption(k, v, 8, MaxKVBytesPerToken)
			if err == nil && o.kvBytes%8 != 0 {
				err = fmt.Errorf("%w: option %s=%q: must be a multiple of 8", iface.ErrBadRequest, k, v)
			}
		case OptNCtx:
			o.nCtx, err = iface.ParseIntOption(k, v, 1, MaxNCtx)
		case OptCacheRAM:
			var mib int
			mib, err = iface.ParseIntOption(k, v, -1, maxCacheRAM)
			o.cacheRAM = int64(mib)
		case OptKVUnified:
			o.kvUnified, err = iface.ParseBoolOption(k, v)
		case OptOpDelayMS:
			var ms int
			ms, err = iface.ParseIntOption(k, v, 0, int(maxOpDelay/time.Millisecond))
			o.opDelay = time.Duration(ms) * time.Millisecond
		case OptAlias:
			if strings.TrimSpace(v) == "" {
				err = fmt.Errorf("%w: option %s: must not be empty", iface.ErrBadRequest, k)
			}
			o.alias = v
		default:
			if slices.Contains(LlamaServerOptions, k) {
				o.inert = append(o.inert, k+"="+v)
				continue
			}
			if slices.Contains(SpecOptions, k) {
				err = fmt.Errorf("%w: option %s: the mock backend has no speculative decoding (a llama plugin option)", iface.ErrBadRequest, k)
				break
			}
			err = fmt.Errorf("%w: unknown option %q (known: %s; and, without effect, the llama plugin's options that llama-server mode passes)",
				iface.ErrBadRequest, k, strings.Join(knownOptions, ", "))
		}
		if err != nil {
			return options{}, err
		}
	}
	return o, nil
}

// StateLayout is the layout of the mock's states at kvBytes per token: what
// a state must match to restore (the format and the KV row size; n_ctx and
// the model file do not shape it).
func StateLayout(kvBytes int) string {
	return fmt.Sprintf(`{"memory":"mock","state_format":%d,%q:%d}`, stateVersion, OptKVBytesPerToken, kvBytes)
}

// modelIdentity names the resident model. With a model file the identity is
// the file's; without one it is derived from the options that shape the
// state, so that engines configured alike recognise each other's states. The
// alias option, when given, overrides the derived alias in both cases.
func modelIdentity(ctx context.Context, model string, o options) (iface.ModelIdentity, error) {
	var id iface.ModelIdentity
	if model == "" {
		sum := sha256.Sum256(fmt.Appendf(nil, "hydra-mock;format=%d;%s=%d;%s=%d",
			stateVersion, OptKVBytesPerToken, o.kvBytes, OptNCtx, o.nCtx))
		id = iface.ModelIdentity{Alias: DefaultAlias, Hash: hex.EncodeToString(sum[:])}
	} else {
		var err error
		if id, err = iface.FileIdentity(ctx, model, ""); err != nil {
			return id, fmt.Errorf("%w: model %q: %w", iface.ErrBadRequest, model, err)
		}
	}
	if o.alias != "" {
		id.Alias = o.alias
	}
	return id, nil
}

// sleep waits d, or less if ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
