// Package iface is the contract between the engine host and its backends: the
// Backend interface, the versioned gRPC protocol that carries it across the
// go-plugin process boundary, and the adapters on both sides. The host and the
// plugins import this package, never each other.
package iface

import (
	"context"
	"errors"
	"io"
)

// Backend is what a plugin implements. The host serialises operations on one
// slot (it never runs two calls for the same slot at once); calls for
// different slots, and Info, may run concurrently.
type Backend interface {
	// Load loads the model and sizes the slots. It is called once, right after
	// the plugin process starts (model loading stays out of the handshake).
	Load(ctx context.Context, req LoadRequest) (BackendInfo, error)
	// Info returns what Load returned, updated if the model changed.
	Info(ctx context.Context) (BackendInfo, error)

	// Slot reports a slot's sequence: its tokens, n_past and the exact size of
	// the state StateGet would write now.
	Slot(ctx context.Context, slot int) (SlotInfo, error)
	// ClearSlot empties a slot's sequence.
	ClearSlot(ctx context.Context, slot int) error

	// Prefill replaces the slot's sequence with the prompt and evaluates it.
	Prefill(ctx context.Context, req PrefillRequest) (PrefillResult, error)
	// Decode generates up to req.NPredict tokens continuing the slot's
	// sequence, calling emit for each as it is produced. An error from emit
	// stops generation and is returned.
	Decode(ctx context.Context, req DecodeRequest, emit func(Token) error) (DecodeResult, error)

	// StateGet writes the slot's per-sequence state, exactly SlotInfo.StateSize
	// bytes, to w in pieces of at most chunkSize bytes.
	StateGet(ctx context.Context, slot int, chunkSize int, w io.Writer) (int64, error)
	// StatePut restores the slot from r, which holds size bytes: the state,
	// possibly followed by trailing bytes (logits: exactly NVocab×4 of them are
	// used, anything else is ignored). tokens are the sequence's token ids from
	// the blob header. StatePut reads r to its end. On any error the slot is left
	// empty, never half-restored. It returns the bytes of state consumed.
	StatePut(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error)

	// SetExpertMode asks for "solo" or "combined" and returns the mode really
	// active.
	SetExpertMode(ctx context.Context, mode string) (string, error)
	// SwapQuant swaps the quantisation of tensors matching pattern; backends
	// without it return ErrNotImplemented.
	SwapQuant(ctx context.Context, quantKey, tensorPattern string) error
}

// Errors a backend returns; they keep their identity across the gRPC boundary
// (errors.Is works on the host side) and map to Hydra status codes there.
var (
	ErrNoSlot         = errors.New("invalid slot ID")
	ErrBusy           = errors.New("slot busy")
	ErrBadRequest     = errors.New("bad request")
	ErrNotImplemented = errors.New("not implemented")
)

// LoadRequest configures a backend at start.
type LoadRequest struct {
	Model   string            // model path (GGUF for llama); may be empty for the mock
	NSlots  int               // number of slots (sequences)
	Options map[string]string // --backend-opt key=value pairs, backend specific
}

// ModelIdentity names the resident model; the JSON names are the protocol's.
type ModelIdentity struct {
	Alias string `json:"model_alias"`
	Hash  string `json:"model_hash"` // hex SHA-256 of the model file
	Path  string `json:"model_path"`
}

// BackendInfo describes a loaded backend.
type BackendInfo struct {
	Name         string // e.g. "mock", "cuda-llama"
	Version      string
	Model        ModelIdentity
	NSlots       int
	NVocab       int
	NCtx         int
	Capabilities []string // extra capabilities, e.g. "quant_swap"
}

// SlotInfo is a slot's sequence.
type SlotInfo struct {
	Slot      int
	NPast     int     // positions in the slot's KV
	Tokens    []int32 // the sequence's token ids
	StateSize int64   // bytes StateGet writes now
}

// Message is one chat message of an OpenAI-style request.
type Message struct {
	Role    string `json:"role" mapstructure:"role"`
	Content string `json:"content" mapstructure:"content"`
}

// SamplerParams selects the sampler. Temperature 0 means greedy.
type SamplerParams struct {
	Temperature float32
	TopK        int32
	TopP        float32
	Seed        uint64
}

// PrefillRequest replaces a slot's sequence. Exactly one of Messages and
// Tokens is set.
type PrefillRequest struct {
	Slot     int
	Messages []Message // chat messages: the backend applies its template and tokenizes
	Tokens   []int32   // raw token ids
	Model    string    // requested model alias, "" for the resident one
}

// PrefillResult is a prefilled slot.
type PrefillResult struct {
	Slot          SlotInfo
	Logits        []float32 // next-token logits at the last position (NVocab)
	ModelFallback bool      // a model was asked for that is not resident
}

// DecodeRequest continues a slot's sequence.
type DecodeRequest struct {
	Slot     int
	NPredict int
	Sampler  SamplerParams
}

// Token is one generated token.
type Token struct {
	ID      int32
	Text    string // the token's UTF-8 piece
	Logprob float32
}

// DecodeResult ends a decode.
type DecodeResult struct {
	TokensGenerated int
	NPast           int
	StopReason      string // "eos", "length" or "n_tokens_limit"
}
