package sched

import (
	"errors"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Context is the llama_context as the scheduler uses it: a batch decoded
// into the sequences' memory, each row's logits, and a sequence cut or its
// partial state (a hybrid's or recurrent model's) saved and restored.
type Context interface {
	// Decode evaluates the batch; ErrKVFull where no cells hold it.
	Decode(b *Batch) error
	// Logits is the last batch's row's logits (computed for it), valid
	// until the next Decode; nil where it has none.
	Logits(row int) []float32
	// SeqRmFrom removes positions p0 and after; false where the memory
	// cannot be cut there.
	SeqRmFrom(seq, p0 int) bool
	// CanShift reports whether positions can move (a context shift).
	CanShift() bool
	// PartialStateInto saves what cannot be cut of the sequence's state,
	// into buf's memory where it fits.
	PartialStateInto(seq int, buf []byte) ([]byte, error)
	// SetPartialState restores what PartialStateInto saved.
	SetPartialState(seq int, data []byte) error
	// StateSize is the bytes the sequence's state takes.
	StateSize(seq int) int64
}

// ErrKVFull is Decode's error where the KV cache has no cells for the batch.
var ErrKVFull = errors.New("the KV cache is full")

// Vocab is what the scheduler asks of the vocabulary.
type Vocab interface {
	IsEOG(tok int32) bool
	Piece(tok int32) string
}

// Sampler picks a decode's token at position pos from a row's logits, with
// its log-probability where logprob is set, and keeps it in its history.
type Sampler interface {
	Sample(logits []float32, pos int, logprob bool) iface.Token
}

// Slots is the adapter's part in a slot's memory that the scheduler
// cannot do over Context: a context shift and emptying a slot, which
// checkpoints and logs follow, and whether a state transfer is reading or
// writing the KV.
type Slots interface {
	Transferring() bool
	Shift(j *Job)
	Clear(j *Job)
}

// Prompts is the adapter's part in a prompt's chunks: the reused chunks
// put in place before the first, where a chunk ends, and the context
// checkpoint taken before it.
type Prompts interface {
	ApplyMoves(j *Job)
	ChunkEnd(j *Job, room int) int
	CheckpointBefore(j *Job, end int)
}

// Drafter drafts tokens for the step's decoders (a draft model, n-grams,
// an MTP block).
type Drafter interface {
	// Behind is how many of seq's tokens it would evaluate before drafting
	// for slot.
	Behind(slot int, seq []int32) int
	// Draft sets each decoders[i].Decode.Draft to at most lens[i] tokens
	// after its pending one, and returns the time and tokens it took to
	// catch up with the slots' sequences.
	Draft(decoders []*Job, lens []int) (catchUp time.Duration, catchUpTokens int)
	// Accept tells it how many of slot's draft tokens were kept.
	Accept(slot, n int)
	// Process is handed every batch the target evaluated (an MTP block's
	// hidden states).
	Process(b *Batch)
}

// Logger is the part of the host's logger the scheduler writes to.
type Logger interface {
	Trace(msg string, args ...any)
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
	IsTrace() bool
}
