// Package iface is the contract between the engine host and its backends: the
// Backend interface, the versioned gRPC protocol that carries it across the
// go-plugin process boundary, and the adapters on both sides. The host and the
// plugins import this package, never each other.
package iface

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
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
	// Tokenize returns the tokens Prefill would evaluate for req (its Slot
	// is ignored), evaluating nothing: a front end compares them with the
	// slots' sequences to pick the one whose cache it can reuse.
	Tokenize(ctx context.Context, req PrefillRequest) (Prompt, error)
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
	// SwapQuant makes the weights whose names match tensorPattern come from
	// the quantisation quantKey ("base": the loaded model's own), all or
	// none of them; backends without it return ErrNotImplemented.
	SwapQuant(ctx context.Context, quantKey, tensorPattern string) (SwapResult, error)
	// LendWeights lists the weights this engine holds and where their bytes
	// are, for a combined head on the same host (lend.go); backends that
	// lend none return ErrNotImplemented.
	LendWeights(ctx context.Context) (WeightRegistry, error)
	// BindPeer makes combined mode use a peer engine's lent weights for the
	// weights its pattern names, each checked against its own (name and
	// shape; the type may differ, as a peer may hold another quantisation),
	// re-binding when already bound. What it cannot bind leaves solo active,
	// the reason in the result; backends without it return
	// ErrNotImplemented.
	BindPeer(ctx context.Context, reg WeightRegistry) (ExpertModeResult, error)

	// Embed evaluates each input as a sequence of its own, apart from every
	// slot's (no slot's KV is touched), and returns their embeddings in
	// order, pooled as BackendInfo.Pooling says. Backends without CapEmbed
	// return ErrNotImplemented; an input the backend cannot take (empty,
	// a token outside the vocabulary, too long) is ErrBadRequest naming
	// it as input[i].
	Embed(ctx context.Context, req EmbedRequest) ([]Embedding, error)

	// SlotCheckpoint returns the slot's newest context checkpoint, which a
	// STATE_GET or PREFILL reply's blob carries; nil where it holds none.
	SlotCheckpoint(ctx context.Context, slot int) (*Checkpoint, error)
	// PutCheckpoint gives a slot just restored by StatePut the checkpoint
	// its blob carried, for a later prompt that parts from the sequence. It
	// reports whether it was kept and, if not, why (the memory can be cut
	// anywhere, checkpoints are off); a checkpoint that does not fit the
	// slot's sequence or the model's memory is ErrBadRequest.
	PutCheckpoint(ctx context.Context, slot int, c Checkpoint) (kept bool, why string, err error)
}

// Checkpoint is a context checkpoint as a KV blob carries it: the part of a
// sequence's memory that cannot be cut back (a hybrid's recurrent state, a
// sliding window's cells), saved when the sequence held NTokens tokens at
// positions PosMin..PosMax. Target is the model's partial state as llama.cpp
// writes it (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY), Draft a draft model's
// (empty: none).
type Checkpoint struct {
	PosMin, PosMax int32
	NTokens        int64
	Target, Draft  []byte
}

// SwapResult is what a SwapQuant did.
type SwapResult struct {
	Swapped     int           // weights that now come from the quantisation asked for
	Bytes       int64         // their bytes in that quantisation
	Duration    time.Duration // the swap's time in the backend
	KVPreserved bool          // the slots' sequences and KV cache are as they were
}

// Errors a backend returns; they keep their identity across the gRPC boundary
// (errors.Is works on the host side) and map to Hydra status codes there.
var (
	ErrNoSlot         = errors.New("invalid slot ID")
	ErrBusy           = errors.New("slot busy")
	ErrBadRequest     = errors.New("bad request")
	ErrNotImplemented = errors.New("not implemented")
	// ErrNoRoom: the prompt fits a slot but not the KV cells the slots
	// share, which other sequences hold; clearing one makes room.
	ErrNoRoom = errors.New("KV cache full")
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
	// NCtxSlot is the most KV cells one slot may hold: NCtx when the slots
	// share one pool (KVUnified), less when the cells are split between
	// them. 0 means NCtx.
	NCtxSlot  int
	KVUnified bool

	// Quants are the quantisations SwapQuant swaps to, "base" (the loaded
	// model) first; none when the backend swaps none. ActiveQuant names the
	// ones the weights come from now: "base", a key, or keys joined by "+".
	Quants      []string
	ActiveQuant string

	// Expert placement (SetExpertMode). ExpertMode is the mode active,
	// "solo" or "combined" ("" when the backend does not say); PeerDevice
	// the device combined mode runs the experts on ("" when none is
	// configured) and PeerReachable whether this host has it; LayerSplit
	// the devices the layers are on ("0-23:CUDA0,24-47:CUDA1"); SplitMode
	// how the model is split across devices ("none", "layer", "row").
	ExpertMode    string
	PeerDevice    string
	PeerReachable bool
	LayerSplit    string
	SplitMode     string

	// PromptDecode: Decode evaluates DecodeRequest.Prompt first, in one call.
	PromptDecode bool

	// MaxTokenBytes is the longest text one token stands for (0: not known),
	// so that a front end refuses a prompt too long for a slot before it is
	// tokenized: one of more than SlotCtx × MaxTokenBytes bytes cannot fit.
	MaxTokenBytes int

	// StateLayout is what a state StateGet writes must match to restore
	// here, a JSON object the backend defines (the llama backend's
	// architecture, memory kind, layer and head dimensions, KV and state
	// types; the mock's fake state's parameters); "" when it names none. The
	// host writes it into the blobs it sends where the client asks, and
	// refuses a STATE_PUT whose blob names another layout before the
	// backend sees a byte. The model identity is Model's: a state of
	// another model with the same layout restores.
	StateLayout string

	// ChatTemplate is the chat template requests are rendered with, BOSToken
	// and EOSToken its tokens' text, as llama-server's /props reports them;
	// "" where the backend has none.
	ChatTemplate       string
	BOSToken, EOSToken string

	// PromptCache is the backend's host-memory prompt cache as it stands
	// now (cache_ram, llama-server's --cache-ram); nil where it keeps none.
	PromptCache *PromptCacheStats

	// Special is the vocabulary's special tokens and what tokenizing adds,
	// for the prompts a front end builds of token ids as llama-server builds
	// them (infill's FIM tokens, rerank's separators); nil: not known.
	Special *SpecialTokens
	// RerankTemplate is the model's "rerank" chat template, in which
	// {query} and {document} stand for the texts; "" where it has none.
	RerankTemplate string
	// NBatch is the logical batch (llama-server's n_batch), which bounds
	// an infill prompt's prefix and suffix; 0: not known.
	NBatch int
	// Pooling is how Embed pools a sequence's embeddings (PoolingNone …
	// PoolingRank); "" where the backend serves none.
	Pooling string

	// Checkpoints are the context checkpoints' settings and figures now
	// (llama-server's --ctx-checkpoints); nil where the backend takes none.
	Checkpoints *CheckpointStats

	// Speculative is speculative decoding's rule and its last decision;
	// nil where the backend does not speculate.
	Speculative *SpeculativeStats
}

// SpeculativeStats are how speculative decoding decides its drafts and
// what it decided last, so that an operator sees why it drafts or not.
type SpeculativeStats struct {
	// Rule is "measured" (drafts only where they bring more tokens a second
	// on this device) or "always".
	Rule string
	// Drafting is the measured rule's last decision (a probe aside);
	// PlainRate and DraftRate the tokens a second it expected of that step
	// without drafts and with its best plan (0: not measured yet).
	Drafting             bool
	PlainRate, DraftRate float64
	// Stops counts the decisions that stopped drafting, Probes the steps
	// drafted only to measure again.
	Stops, Probes uint64
	// Running sums over the decode-only steps since the backend loaded:
	// steps without and with drafts, the time of the former, and the parts
	// of the latter (drafting less its catch-up, the draft model's catch-up
	// with sequences it had not seen, rollback saves of a target that
	// cannot cut its memory, the verify step, replays of rejected drafts).
	PlainSteps, DraftSteps                                                  uint64
	PlainSeconds                                                            float64
	DraftSeconds, CatchUpSeconds, SaveSeconds, VerifySeconds, ReplaySeconds float64
}

// CheckpointStats are context checkpoints' settings, what they hold now,
// and running totals since the backend loaded. A checkpoint is the part of
// a sequence's memory that cannot be cut back (a hybrid's recurrent state,
// a sliding window), saved in host memory so that a prompt parting from the
// sequence resumes there rather than from its start.
type CheckpointStats struct {
	MaxPerSlot, MinStep int   // ctx_checkpoints, checkpoint_min_step
	BudgetBytes         int64 // checkpoint_ram; -1: no limit in bytes
	Held, Bytes         int64 // checkpoints held now by all slots, and their bytes
	// Taken counts checkpoints saved from a slot's memory (not those a prompt
	// cache entry or a STATE_PUT brought), Restored those restored; Dropped those
	// given up to the count per slot, the spacing or the budget; TokensSaved
	// the prompt tokens restores spared evaluating; OverBudget checkpoints
	// not kept, larger than the whole budget.
	Taken, Restored, Dropped, TokensSaved, OverBudget uint64
	// Slots are each slot's holdings, by slot.
	Slots []SlotCheckpoints
}

// SlotCheckpoints are one slot's checkpoints held and their bytes.
type SlotCheckpoints struct {
	Held  int
	Bytes int64
}

// PromptCacheStats is a prompt cache's figures: what it holds now, and
// running totals since the backend loaded.
type PromptCacheStats struct {
	// BudgetBytes is the most it may hold, -1 for no limit in bytes (the
	// tokens it holds are then bounded by n_ctx, as llama-server's are).
	BudgetBytes int64
	Bytes       int64 // held now: the entries' memory and tokens, memory kept for the next saves, saves and restores under way
	Entries     int64
	Tokens      int64
	// Hits and Misses count the prompts it was asked for: a cached sequence
	// chosen to start the prompt from, or none.
	Hits, Misses uint64
	// Saves are sequences saved into it; Restores sequences restored from
	// it into a slot; each with its state bytes and the seconds it took.
	Saves, SaveBytes       uint64
	SaveSeconds            float64
	Restores, RestoreBytes uint64
	RestoreSeconds         float64
	// Evictions are entries dropped, least recently used first, to stay
	// within the budget (or n_ctx's tokens); Skipped sequences not saved,
	// being in it already or larger than the budget; the failures saves
	// and restores that failed (a restore's slot is then evaluated anew).
	Evictions, Skipped            uint64
	SaveFailures, RestoreFailures uint64
}

// NoToken is a SpecialTokens id the vocabulary does not have.
const NoToken = -1

// SpecialTokens are a vocabulary's special token ids (NoToken for those it
// lacks) and what tokenizing a text with add_special puts around it, as
// llama.cpp's llama_vocab_* accessors report them.
type SpecialTokens struct {
	BOS, EOS, SEP                                  int32
	FIMPre, FIMSuf, FIMMid, FIMPad, FIMRep, FIMSep int32
	AddBOS, AddEOS, AddSEP                         bool
}

// Poolings of Embed, llama.cpp's pooling types by llama-server's names.
const (
	PoolingNone = "none" // one embedding per token, not normalised
	PoolingMean = "mean"
	PoolingCLS  = "cls"  // the first token's
	PoolingLast = "last" // the last token's
	PoolingRank = "rank" // a classifier's scores (a reranker's relevance first)
)

// Capabilities (BackendInfo.Capabilities) of the embedding routes: CapEmbed,
// Embed serves (llama-server's --embeddings); CapRerank, the pooling was
// asked to be rank (llama-server's --reranking), which llama-server's
// /rerank requires.
const (
	CapEmbed  = "embed"
	CapRerank = "rerank"
)

// EmbedRequest is what Embed evaluates.
type EmbedRequest struct {
	Inputs [][]int32
	// Normalize is llama.cpp's embd_normalize for pooled embeddings: -1
	// none, 0 the largest absolute value scaled to int16's range, 1
	// taxicab, 2 euclidean, p > 2 the p-norm; nil: the backend's default.
	// Pooling none is never normalised.
	Normalize *int
}

// Embedding is one input's embedding: one vector when pooled, one per token
// with pooling none.
type Embedding struct {
	Vectors [][]float32
	NTokens int // the input's tokens evaluated
}

// SplitKV reports whether every slot has KV cells of its own (NCtxSlot of
// them) rather than a share of one pool.
func (i BackendInfo) SplitKV() bool { return !i.KVUnified && i.NCtxSlot > 0 }

// SlotCtx is the most KV cells one slot may hold.
func (i BackendInfo) SlotCtx() int {
	if i.NCtxSlot > 0 {
		return i.NCtxSlot
	}
	return i.NCtx
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
	// ReasoningContent is an earlier assistant turn's thinking, for
	// templates that replay it.
	ReasoningContent string     `json:"reasoning_content,omitempty" mapstructure:"reasoning_content"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty" mapstructure:"tool_calls"`
	ToolCallID       string     `json:"tool_call_id,omitempty" mapstructure:"tool_call_id"` // a tool result: the call it answers
	Name             string     `json:"name,omitempty" mapstructure:"name"`                 // a tool result: the tool's name
}

// ToolCall is one function call of an assistant message.
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"` // JSON text
}

// SamplerParams selects the sampler. Temperature 0 means greedy (after the
// penalties and biases, which apply whatever the temperature). Zero values
// mean "off" throughout, so an older peer's request means what it meant.
type SamplerParams struct {
	Temperature float32 `json:"temperature"`
	TopK        int32   `json:"top_k"` // 0: all tokens
	TopP        float32 `json:"top_p"` // 0 or 1: off
	MinP        float32 `json:"min_p"` // 0: off
	Seed        uint64  `json:"seed"`

	RepeatPenalty    float32 `json:"repeat_penalty"` // 0 or 1: off
	RepeatLastN      int32   `json:"repeat_last_n"`  // tokens the penalties look back over; 0: none, -1: the whole sequence
	PresencePenalty  float32 `json:"presence_penalty"`
	FrequencyPenalty float32 `json:"frequency_penalty"`

	IgnoreEOS bool              `json:"ignore_eos"`           // end-of-generation tokens are never sampled
	LogitBias map[int32]float32 `json:"logit_bias,omitempty"` // added to the token's logit before sampling
}

// Penalized reports whether any penalty applies.
func (p SamplerParams) Penalized() bool {
	return p.RepeatLastN != 0 && ((p.RepeatPenalty != 0 && p.RepeatPenalty != 1) ||
		p.PresencePenalty != 0 || p.FrequencyPenalty != 0)
}

// PrefillRequest replaces a slot's sequence. Exactly one of Messages, Tokens
// and Text is set.
type PrefillRequest struct {
	Slot     int
	Messages []Message // chat messages: the backend applies its template and tokenizes
	Tokens   []int32   // raw token ids
	Text     string    // a raw text prompt: the backend tokenizes it (special tokens parsed)
	Model    string    // requested model alias, "" for the resident one
	// Tools are OpenAI tool definitions (JSON objects) and TemplateKwargs a
	// JSON object of variables for the chat template (merged over the
	// backend's own), both for Messages.
	Tools          []string
	TemplateKwargs string
	// ToolChoice is OpenAI's tool_choice for Tools: "" (auto), "auto",
	// "none" or "required"; ToolChoiceName names the one function a
	// "required" reply calls. ParallelToolCalls nil: as the template allows.
	ToolChoice        string
	ToolChoiceName    string
	ParallelToolCalls *bool
	// Tokenize, for Tokenize alone, asks for the answers of llama-server's
	// /tokenize, /detokenize and /apply-template (Prompt.Text, Pieces) rather
	// than the prompt Prefill would evaluate; nil: that prompt.
	Tokenize *TokenizeOptions
	// PromptCache: the prompt is an HTTP completion's, which a backend with
	// a host-memory prompt cache may start from a cached sequence's state,
	// restored into the slot where it is empty or SaveSequence is set.
	// SaveSequence: the slot's sequence is an earlier HTTP completion's,
	// which the backend may save into that cache before the prompt replaces
	// it. A Hydra RPC client's prompt sets neither: a slot the coordinator
	// fills is its own, never saved, dropped or replaced by the cache.
	PromptCache  bool
	SaveSequence bool
	// FromChat: Tokens are a chat template's rendering of messages (the
	// host's Tokenize of Messages), so the backend may find where the
	// messages start in them, as it does for Messages (context checkpoints
	// at user messages, as llama-server takes them for a chat completion).
	FromChat bool
}

// TokenizeOptions are llama-server's /tokenize switches.
type TokenizeOptions struct {
	AddSpecial   bool // Text: BOS/EOS added as the model adds them
	ParseSpecial bool // Text: special tokens' text is the special token
	WithPieces   bool // Prompt.Pieces: each token's piece
}

// CheckPrompt is what every backend checks of a prompt before it turns it
// into tokens: exactly one of Messages, Tokens and Text (judged by length:
// over gRPC an empty list and none are alike), every message with a role,
// every token id in [0, nVocab). Its errors wrap ErrBadRequest.
func (r PrefillRequest) CheckPrompt(nVocab int) error {
	given := 0
	for _, has := range []bool{len(r.Messages) > 0, len(r.Tokens) > 0, r.Text != ""} {
		if has {
			given++
		}
	}
	switch {
	case given == 0:
		return fmt.Errorf("%w: empty prompt: prefill needs messages, tokens or text", ErrBadRequest)
	case given > 1:
		return fmt.Errorf("%w: prefill takes one of messages, tokens and text", ErrBadRequest)
	}
	for i, m := range r.Messages {
		if m.Role == "" {
			return fmt.Errorf("%w: message %d has no role", ErrBadRequest, i)
		}
	}
	for i, t := range r.Tokens {
		if t < 0 || int(t) >= nVocab {
			return fmt.Errorf("%w: token %d at position %d is outside the vocabulary [0, %d)", ErrBadRequest, t, i, nVocab)
		}
	}
	return nil
}

// Prompt is a prompt as the backend would evaluate it (Tokenize).
type Prompt struct {
	Tokens []int32
	// OpensThinking: the rendered prompt ends inside a reasoning block (its
	// template opened <think> for the reply), so the reply starts in it.
	OpensThinking bool
	// With PrefillRequest.Tokenize: Text is the rendered chat (Messages) or
	// the tokens' text (Tokens: their pieces joined, llama-server's
	// /detokenize); Pieces each token's piece where asked.
	Text   string
	Pieces []string
}

// PrefillResult is a prefilled slot.
type PrefillResult struct {
	Slot          SlotInfo
	Logits        []float32 // next-token logits at the last position (NVocab)
	ModelFallback bool      // a model was asked for that is not resident
	// Reused is how many of the prompt's tokens the slot already held and
	// kept instead of evaluating them again.
	Reused int
}

// DecodeRequest continues a slot's sequence.
type DecodeRequest struct {
	Slot     int
	NPredict int
	Sampler  SamplerParams
	// Logprobs asks for each token's log-probability (Token.Logprob is 0
	// otherwise: computing it reads the whole vocabulary's logits), NProbs
	// for that many alternatives at each position as well.
	Logprobs bool
	NProbs   int
	// NKeep is how many tokens after BOS a context shift keeps at the start
	// of a full slot (where the backend shifts contexts).
	NKeep int
	// Prompt, when set, is evaluated into the slot first, as Prefill would
	// (its Slot is ignored), and the decode continues it: one call, so that a
	// backend batching several slots samples the first token in the step
	// that ends the prompt rather than a step later. Only for backends whose
	// BackendInfo.PromptDecode is set; DecodeResult.Prompt then says what the
	// prefill did. A prompt that fails fails the call before any token.
	Prompt *PrefillRequest
	// Output, when set, is what the reply must be and how the backend reads
	// it; backends without CapOutput refuse it (ErrNotImplemented).
	Output *Output
	// Speculative, when set, bounds this decode's speculative decoding, as
	// llama-server's per-request fields do; a backend without speculative
	// decoding configured ignores it, as llama-server does, one without any
	// (the mock) refuses it.
	Speculative *SpeculativeParams
	// LastUnevaluated: a decode that reaches NPredict ends at once, its last
	// token sent but not evaluated, as llama-server's completions end (an
	// HTTP completion's, whose next prompt re-renders the reply anyway): the
	// slot holds the tokens before it, with the logits it was sampled from,
	// and the reply is a step sooner. A backend that evaluates nothing (the
	// mock) has nothing to leave out and keeps every token.
	LastUnevaluated bool
}

// SpeculativeParams are llama-server's per-request speculative.n_max (0:
// no drafts), speculative.n_min and speculative.p_min; -1 leaves a field
// the backend's.
type SpeculativeParams struct {
	NMax, NMin int
	PMin       float32
}

// NoSpeculativeOverride is a SpeculativeParams that overrides nothing.
var NoSpeculativeOverride = SpeculativeParams{NMax: -1, NMin: -1, PMin: -1}

// CapOutput is the capability (BackendInfo.Capabilities) of backends that
// honour DecodeRequest.Output.
const CapOutput = "output"

// Output constrains a decode's reply and says how to read it.
type Output struct {
	// Chat is the chat the reply answers, as Prefill took it: the backend
	// constrains the reply as its tool choice asks (and JSONSchema or
	// Grammar), parses it as the chat template writes tool calls and
	// reasoning, and sends what each token added as Token.Deltas and the
	// whole reply as DecodeResult.Message.
	Chat *PrefillRequest
	// JSONSchema (JSON text) or Grammar (GBNF) constrain the reply; at most
	// one of them.
	JSONSchema string
	Grammar    string
	// Stops end the reply before the first of them the text reaches
	// (StopReason StopString); with Chat the parse ends there too.
	Stops []string
	// ReasoningBudget, when set, bounds the reasoning of Chat's reply as
	// llama-server's reasoning budget does; nil: unbounded. Only to a
	// backend with CapReasoningBudget.
	ReasoningBudget *ReasoningBudget
}

// CapReasoningBudget is the capability of backends that honour
// Output.ReasoningBudget: the host refuses a budget to any other, since a
// backend built before the field would leave the reasoning unbounded.
const CapReasoningBudget = "reasoning_budget"

// ReasoningBudget is llama-server's reasoning budget (llama.cpp's
// common/reasoning-budget): once the reply has spent Tokens tokens inside a
// reasoning block that the chat's template opens and closes with its
// thinking tags, Message and the end tag are forced and the reply goes on
// as content. A template without thinking tags has no block to bound.
type ReasoningBudget struct {
	Tokens  int32  // tokens the reasoning may take, >= 0; 0: it ends as it opens
	Message string // forced before the end tag when the budget runs out; "": none
}

// StopString is the stop reason of a decode that reached one of Output.Stops.
const StopString = "stop_string"

// ChatDelta is what a token added to a parsed reply: content, reasoning,
// or a piece of tool call ToolCall (-1: none), whose ID and name come with
// its first piece, as llama-server's diffs.
type ChatDelta struct {
	Content   string
	Reasoning string
	ToolCall  int
	ToolID    string
	ToolName  string
	ToolArgs  string
}

// ChatReply is a parsed reply.
type ChatReply struct {
	Content   string
	Reasoning string
	ToolCalls []ToolCall
}

// Token is one generated token.
type Token struct {
	ID      int32
	Text    string // the token's UTF-8 piece
	Logprob float32
	Top     []TokenProb // the NProbs most likely tokens at this position, most likely first
	// Deltas: what this token added to the parsed reply (Output.Chat); none
	// while the parser holds its text back (a tool call's opening marker).
	Deltas []ChatDelta
}

// TokenProb is a candidate token and its log-probability.
type TokenProb struct {
	ID      int32
	Text    string
	Logprob float32
}

// DecodeResult ends a decode.
type DecodeResult struct {
	TokensGenerated int
	NPast           int
	StopReason      string        // "eos", "length", "n_tokens_limit" or StopString
	Prompt          *PromptResult // with DecodeRequest.Prompt
	Message         *ChatReply    // with DecodeRequest.Output.Chat: the parsed reply
	// Deltas: what the final parse added after the last token's (text the
	// parser held back until it knew the reply ended).
	Deltas []ChatDelta
	// DraftTokens are the draft tokens speculative decoding had verified,
	// DraftAccepted those accepted (llama-server's timings draft_n and
	// draft_n_accepted); 0 without speculation.
	DraftTokens, DraftAccepted int
}

// PromptResult is what a Decode's prompt did (DecodeRequest.Prompt).
type PromptResult struct {
	NTokens       int // the prompt's tokens, now the start of the slot's sequence
	Reused        int // of those, kept from the slot's previous sequence
	ModelFallback bool
	Prefill       time.Duration // from the call to the prompt's last token evaluated
}

// PromptResult is what this prefill did, as a Decode that took elapsed for it
// reports it.
func (r PrefillResult) PromptResult(elapsed time.Duration) *PromptResult {
	return &PromptResult{NTokens: len(r.Slot.Tokens), Reused: r.Reused, ModelFallback: r.ModelFallback, Prefill: elapsed}
}
