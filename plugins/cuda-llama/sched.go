//go:build llama && cgo

package cudallama

import (
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
)

// The scheduler is internal/sched's: each step batches every decoding
// slot's token and chunks of the pending prompts into one llama_decode and
// samples each decoder from its own row. The engine is its llama.cpp:
// lctx its Context, model its Vocab, sampler its Sampler, speculator its
// Drafter; and the engine itself does what the scheduler leaves to it
// (sched.Slots, sched.Prompts), under the context lock the step holds.

func newScheduler(e *engine) *sched.Scheduler {
	c := sched.Config{Lock: &e.mu, Ctx: e.ctx, Vocab: e.model, Slots: e, Prompts: e, Cells: &e.cells, Log: e.log,
		Size: e.ctx.nBatch, Shift: e.contextShift,
		Rollback: e.layout.recurrent() && e.ctx.NRsSeq() == 0, Snapshots: e.layout.recurrent() && e.ctx.NRsSeq() > 0}
	if e.spec != nil {
		c.Spec = e.spec.Speculation
	}
	return sched.New(c)
}

// Transferring reports whether a state transfer is reading or writing the
// KV (let go of the lock while it waits on the data plane).
func (e *engine) Transferring() bool { return e.transfers.Load() > 0 }

// Shift shifts decoder j's full slot (shiftContext).
func (e *engine) Shift(j *sched.Job) { e.shiftContext(j.Slot, j.KV, j.Decode.Req.NKeep) }

// Clear empties job j's slot (clearLocked).
func (e *engine) Clear(j *sched.Job) { e.clearLocked(j.Slot, j.KV) }

// ApplyMoves puts prefill j's reused chunks in place (applyMoves).
func (e *engine) ApplyMoves(j *sched.Job) { e.applyMoves(j.Slot, j.KV, j.Prefill) }
