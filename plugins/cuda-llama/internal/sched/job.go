package sched

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
)

// Job is one Prefill or Decode registered with the scheduler; a Decode with
// a prompt has both, prefill until the prompt is in (Prompted), then decode.
type Job struct {
	Slot int
	KV   *kv.Slot
	Done chan error // the job's end: one value, after events (if any) closed

	Prefill *Prefill
	Decode  *Decode

	// Cancelled is set by the caller that gave up (its context ended or its
	// emit failed); the loop then ends the job at its next step.
	Cancelled atomic.Bool

	ended bool // the loop's: Done was sent
}

// Prefill evaluates Prompt[Next:] into its slot.
type Prefill struct {
	Prompt    []int32
	Next      int
	Logits    []float32 // after the last token, filled by the loop
	StateSize int64     // the slot's state size after the last chunk, likewise
	Moves     []kv.Move // reused chunks to put in place before its first chunk
	Task      uint64    // the prompt's number, for the checkpoints' spacing rule
	Spans     ckpt.Spans
}

// Decode generates tokens into its slot. A token is sampled (and sent to
// the caller) one step before it is evaluated; the job ends once its last
// token is in the KV, so the slot always holds exactly the tokens emitted.
type Decode struct {
	Req     iface.DecodeRequest
	Sampler Sampler
	Base    int   // the slot's tokens when the decode started
	Pending int32 // the token to evaluate next step; -1 none
	Events  chan iface.Token
	Sampled int // tokens sent on Events
	// Emitted is how many tokens the caller passed on before it gave up.
	Emitted atomic.Int64
	Stop    string // why the job ends once Pending is evaluated ("" goes on)
	// Prompted is when the job's prompt (a Decode's, prefilled by the same
	// job first) was all evaluated; zero while it is not or for none.
	Prompted time.Time
	// Draft is this step's draft tokens after Pending (the drafter's),
	// nAccepted how many of them the target kept.
	Draft     []int32
	nAccepted int
	// SpecBegun is the drafter's: its n-gram maps indexed the decode's
	// tokens so far.
	SpecBegun bool
	// Drafted and Accepted count the decode's draft tokens (DecodeResult).
	Drafted, Accepted int

	needShift bool // the slot is full: shift its context before the next token
	// rollback is the slot's partial state before this step's draft, where
	// the target's memory cannot be cut back (a hybrid's or recurrent
	// model's state): a rejected draft token is undone from it (replay).
	rollback []byte
}

// EventBuffer is how many sampled tokens may wait for a slow caller; a slot
// whose caller lags that far skips steps until it catches up, so one slow
// client never holds the others back.
const EventBuffer = 8

// NewDecode is a decode of req sampling with smp from a slot holding base
// tokens.
func NewDecode(req iface.DecodeRequest, smp Sampler, base int) *Decode {
	return &Decode{Req: req, Sampler: smp, Base: base, Pending: -1, Events: make(chan iface.Token, EventBuffer)}
}

// Queue makes t the decoder's next token: sent to the caller now, evaluated
// next step. It claims the cell t will take.
func (d *Decode) Queue(j *Job, t iface.Token) {
	d.Pending = t.ID
	j.KV.Claim++
	d.Sampled++
	d.Events <- t // room was checked (ready) or is fresh
	if d.Sampled >= d.Req.NPredict {
		d.Stop = StopLength
		if d.Req.LastUnevaluated { // sent, not evaluated: the job ends without another step
			d.Pending = -1
			j.KV.Claim--
		}
	}
}

// Why a decode stopped (DecodeResult.StopReason).
const (
	StopEOS          = "eos"
	StopLength       = "length"
	StopNTokensLimit = "n_tokens_limit"
	// StopCancelled marks a decoder that ends once its pending token,
	// already passed on, is evaluated.
	StopCancelled = "cancelled"
)

// ErrCancelled ends a job whose caller gave up; the caller has its own error.
var ErrCancelled = errors.New("cancelled")
