package iface

import (
	"context"
	"io"
	"math/rand/v2"
)

// fakeBackend is a Backend whose methods are whatever the test sets; unset
// ones answer ErrNotImplemented.
type fakeBackend struct {
	load          func(context.Context, LoadRequest) (BackendInfo, error)
	info          func(context.Context) (BackendInfo, error)
	slot          func(context.Context, int) (SlotInfo, error)
	clearSlot     func(context.Context, int) error
	prefill       func(context.Context, PrefillRequest) (PrefillResult, error)
	tokenize      func(context.Context, PrefillRequest) (Prompt, error)
	decode        func(context.Context, DecodeRequest, func(Token) error) (DecodeResult, error)
	stateGet      func(context.Context, int, int, io.Writer) (int64, error)
	statePut      func(context.Context, int, []int32, io.Reader, int64) (int64, error)
	setExpertMode func(context.Context, string) (string, error)
	swapQuant     func(context.Context, string, string) (SwapResult, error)
	embed         func(context.Context, EmbedRequest) ([]Embedding, error)
	slotCkpt      func(context.Context, int) (*Checkpoint, error)
	putCkpt       func(context.Context, int, Checkpoint) (bool, string, error)
}

func (f *fakeBackend) SlotCheckpoint(ctx context.Context, slot int) (*Checkpoint, error) {
	if f.slotCkpt == nil {
		return nil, ErrNotImplemented
	}
	return f.slotCkpt(ctx, slot)
}

func (f *fakeBackend) PutCheckpoint(ctx context.Context, slot int, c Checkpoint) (bool, string, error) {
	if f.putCkpt == nil {
		return false, "", ErrNotImplemented
	}
	return f.putCkpt(ctx, slot, c)
}

func (f *fakeBackend) Embed(ctx context.Context, req EmbedRequest) ([]Embedding, error) {
	if f.embed == nil {
		return nil, ErrNotImplemented
	}
	return f.embed(ctx, req)
}

func (f *fakeBackend) Load(ctx context.Context, req LoadRequest) (BackendInfo, error) {
	if f.load == nil {
		return BackendInfo{}, ErrNotImplemented
	}
	return f.load(ctx, req)
}

func (f *fakeBackend) Info(ctx context.Context) (BackendInfo, error) {
	if f.info == nil {
		return BackendInfo{}, ErrNotImplemented
	}
	return f.info(ctx)
}

func (f *fakeBackend) Slot(ctx context.Context, slot int) (SlotInfo, error) {
	if f.slot == nil {
		return SlotInfo{}, ErrNotImplemented
	}
	return f.slot(ctx, slot)
}

func (f *fakeBackend) ClearSlot(ctx context.Context, slot int) error {
	if f.clearSlot == nil {
		return ErrNotImplemented
	}
	return f.clearSlot(ctx, slot)
}

func (f *fakeBackend) Prefill(ctx context.Context, req PrefillRequest) (PrefillResult, error) {
	if f.prefill == nil {
		return PrefillResult{}, ErrNotImplemented
	}
	return f.prefill(ctx, req)
}

func (f *fakeBackend) Tokenize(ctx context.Context, req PrefillRequest) (Prompt, error) {
	if f.tokenize == nil {
		return Prompt{}, ErrNotImplemented
	}
	return f.tokenize(ctx, req)
}

func (f *fakeBackend) Decode(ctx context.Context, req DecodeRequest, emit func(Token) error) (DecodeResult, error) {
	if f.decode == nil {
		return DecodeResult{}, ErrNotImplemented
	}
	return f.decode(ctx, req, emit)
}

func (f *fakeBackend) StateGet(ctx context.Context, slot int, chunkSize int, w io.Writer) (int64, error) {
	if f.stateGet == nil {
		return 0, ErrNotImplemented
	}
	return f.stateGet(ctx, slot, chunkSize, w)
}

func (f *fakeBackend) StatePut(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
	if f.statePut == nil {
		return 0, ErrNotImplemented
	}
	return f.statePut(ctx, slot, tokens, r, size)
}

func (f *fakeBackend) SetExpertMode(ctx context.Context, mode string) (string, error) {
	if f.setExpertMode == nil {
		return "", ErrNotImplemented
	}
	return f.setExpertMode(ctx, mode)
}

func (f *fakeBackend) SwapQuant(ctx context.Context, quantKey, tensorPattern string) (SwapResult, error) {
	if f.swapQuant == nil {
		return SwapResult{}, ErrNotImplemented
	}
	return f.swapQuant(ctx, quantKey, tensorPattern)
}

// randomBytes returns n reproducible pseudo-random bytes, so that a shifted,
// dropped or repeated chunk cannot go unnoticed.
func randomBytes(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// chunkRecorder is an io.Writer that keeps what it is given and the size of
// each Write.
type chunkRecorder struct {
	data   []byte
	chunks []int
}

func (w *chunkRecorder) Write(p []byte) (int, error) {
	w.data = append(w.data, p...)
	w.chunks = append(w.chunks, len(p))
	return len(p), nil
}

func (w *chunkRecorder) maxChunk() int {
	m := 0
	for _, c := range w.chunks {
		m = max(m, c)
	}
	return m
}

func (f *fakeBackend) LendWeights(context.Context) (WeightRegistry, error) {
	return WeightRegistry{}, ErrNotImplemented
}

func (f *fakeBackend) BindPeer(context.Context, WeightRegistry) (ExpertModeResult, error) {
	return ExpertModeResult{}, ErrNotImplemented
}
