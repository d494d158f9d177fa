package schedtest

import (
	"fmt"
	"slices"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
)

// Vocab ends generation at its EOG tokens; a token's text is its id.
type Vocab struct{ EOG []int32 }

func (v Vocab) IsEOG(tok int32) bool   { return slices.Contains(v.EOG, tok) }
func (v Vocab) Piece(tok int32) string { return fmt.Sprintf("<%d>", tok) }

// Greedy samples the greatest logit; it records the position of each
// token it sampled.
type Greedy struct{ Pos []int }

func (g *Greedy) Sample(logits []float32, pos int, _ bool) iface.Token {
	if logits == nil {
		panic("schedtest: sampling a row without logits")
	}
	g.Pos = append(g.Pos, pos)
	return iface.Token{ID: int32(slices.Index(logits, slices.Max(logits)))}
}

// Host is the adapter's work on a slot and a prompt (sched.Slots,
// sched.Prompts) over the fake memory: a context shift, clearing a slot,
// reused chunks put in place, chunks cut at the batch's room.
type Host struct {
	Ctx          *Context
	BOS          int32
	Transfers    bool  // a state transfer is in flight
	Shifts       int   // context shifts done
	Cleared      []int // slots emptied, in order
	Checkpoints  int   // CheckpointBefore calls
	ChunksBefore int   // ApplyMoves calls
}

func (h *Host) Transferring() bool { return h.Transfers }

func (h *Host) Shift(j *sched.Job) {
	kept, _, _ := kv.Shift(&h.Ctx.Memory, j.Slot, j.KV.Seq(), j.Decode.Req.NKeep, h.BOS)
	j.KV.Set(kept, j.KV.Logits(), j.KV.StateSize())
	h.Shifts++
}

func (h *Host) Clear(j *sched.Job) {
	h.Ctx.SeqRm(j.Slot)
	j.KV.Set(nil, nil, 0)
	j.KV.Claim = 0
	h.Cleared = append(h.Cleared, j.Slot)
}

func (h *Host) ApplyMoves(j *sched.Job) {
	p := j.Prefill
	kv.ApplyMoves(&h.Ctx.Memory, j.Slot, p.Moves, p.Next)
	j.KV.Set(p.Prompt[:p.Next:p.Next], nil, 0)
	p.Moves = nil
	h.ChunksBefore++
}

func (h *Host) ChunkEnd(j *sched.Job, room int) int {
	return min(len(j.Prefill.Prompt), j.Prefill.Next+room)
}

func (h *Host) CheckpointBefore(*sched.Job, int) { h.Checkpoints++ }

// Drafter drafts what Guess says for a slot whose sequence is seq and
// pending token pending, at most n tokens; it records each slot's
// accepted counts.
type Drafter struct {
	Guess    func(slot int, seq []int32, pending int32, n int) []int32
	Accepted map[int][]int
	Batches  int // batches handed to Process
}

func (d *Drafter) Behind(int, []int32) int { return 0 }

func (d *Drafter) Draft(decoders []*sched.Job, lens []int) (time.Duration, int) {
	for i, j := range decoders {
		if lens[i] == 0 {
			continue
		}
		g := d.Guess(j.Slot, j.KV.Seq(), j.Decode.Pending, lens[i])
		j.Decode.Draft = slices.Clone(g[:min(len(g), lens[i])])
	}
	return 0, 0
}

func (d *Drafter) Accept(slot, n int) {
	if d.Accepted == nil {
		d.Accepted = map[int][]int{}
	}
	d.Accepted[slot] = append(d.Accepted[slot], n)
}

func (d *Drafter) Process(*sched.Batch) { d.Batches++ }

// Log discards what the scheduler logs, counting its warnings and errors.
type Log struct{ Warnings, Errors int }

func (*Log) Trace(string, ...any)   {}
func (*Log) Info(string, ...any)    {}
func (l *Log) Warn(string, ...any)  { l.Warnings++ }
func (l *Log) Error(string, ...any) { l.Errors++ }
func (*Log) IsTrace() bool          { return false }
