//go:build llama && cgo

package cudallama

import (
	"context"
	"fmt"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/promptcache"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Context checkpoints: where a sequence's memory cannot be cut back (a
// hybrid's or recurrent model's state, a sliding window), the part that
// cannot is saved in host memory before chosen chunks of a prompt, and a
// prompt that parts from the slot's sequence resumes from the newest one at
// or before the point where it parts instead of from token 0. The rules are
// llama-server's (internal/ckpt); this file moves the bytes.

// newCheckpoints is the engine's checkpoint store; nil where the memory can
// always be cut, or checkpoints are off.
func (e *engine) newCheckpoints(o llamaopt.CkptOptions, nUBatch int) *ckpt.Store {
	if o.CtxCheckpoints <= 0 || !e.needsCheckpoints() {
		return nil
	}
	r := ckpt.Rules{Max: o.CtxCheckpoints, MinStep: o.CheckpointMinStep, NBatch: e.ctx.nBatch, NUBatch: nUBatch, NSWA: e.nSWA}
	return ckpt.NewStore(r, len(e.cells.Slots), o.Budget())
}

// needsCheckpoints reports whether a slot's memory cannot always be cut
// back: a recurrent state, or a sliding window that drops the positions
// before it (not swa_full), as llama-server decides.
func (e *engine) needsCheckpoints() bool {
	return e.layout.recurrent() || (e.nSWA > 0 && !e.swaFull)
}

// checkpointsText says what the load log says of checkpoints.
func (e *engine) checkpointsText(o llamaopt.CkptOptions) string {
	if e.ckpts == nil && o.CtxCheckpoints > 0 {
		return "none needed: the memory can be cut anywhere"
	}
	return o.Text()
}

// checkpointStats are the checkpoints' settings and figures for Info; nil
// where none are taken.
func (e *engine) checkpointStats() *iface.CheckpointStats {
	if !e.ckpts.Enabled() {
		return nil
	}
	st, r := e.ckpts.Stats(), e.ckpts.Rules()
	out := &iface.CheckpointStats{MaxPerSlot: r.Max, MinStep: r.MinStep, BudgetBytes: e.ckpts.Budget(),
		Held: int64(st.Held), Bytes: st.Bytes, Taken: st.Taken, Restored: st.Restored, Dropped: st.Dropped,
		TokensSaved: st.TokensSaved, OverBudget: st.OverBudget}
	for i := range e.cells.Slots {
		n, b := e.ckpts.Slot(i)
		out.Slots = append(out.Slots, iface.SlotCheckpoints{Held: n, Bytes: b})
	}
	return out
}

// ChunkEnd is where the next chunk of j's prompt ends when room tokens of
// the batch are left: early where a checkpoint is to be taken before the
// chunk after it.
func (e *engine) ChunkEnd(j *sched.Job, room int) int {
	p := j.Prefill
	if !e.ckpts.Enabled() {
		return min(len(p.Prompt), p.Next+room)
	}
	return e.ckpts.Rules().ChunkEnd(len(p.Prompt), p.Next, room, p.Spans, e.ckpts.Newest(j.Slot))
}

// CheckpointBefore saves a checkpoint of j's slot before the chunk of its
// prompt that ends at end is evaluated, where the rules say so. A failure
// is logged: the prompt goes on without it. Needs e.mu.
func (e *engine) CheckpointBefore(j *sched.Job, end int) {
	if !e.ckpts.Enabled() {
		return
	}
	p := j.Prefill
	memMin := e.ctx.SeqPosMin(j.Slot)
	if !e.ckpts.Rules().Take(len(p.Prompt), p.Next, end, memMin, p.Spans, e.ckpts.Newest(j.Slot)) {
		return
	}
	start := time.Now()
	data, err := e.ctx.PartialState(j.Slot)
	if err != nil {
		e.log.Warn("context checkpoint not taken", "slot", j.Slot, "n_tokens", p.Next, "error", err)
		return
	}
	c := &ckpt.Checkpoint{PosMin: memMin, PosMax: e.ctx.SeqPosMax(j.Slot), NTokens: p.Next, Data: data, Task: p.Task}
	if !e.ckpts.Add(j.Slot, c) {
		e.log.Warn("context checkpoint larger than the checkpoints' whole budget: not kept", "slot", j.Slot,
			"bytes", c.Size(), "budget_bytes", e.ckpts.Budget())
		return
	}
	n, bytes := e.ckpts.Slot(j.Slot)
	e.log.Debug("context checkpoint taken", "slot", j.Slot, "pos_min", c.PosMin, "pos_max", c.PosMax, "n_tokens", c.NTokens,
		"bytes", c.Size(), "slot_checkpoints", n, "slot_bytes", bytes, "elapsed", time.Since(start).String())
}

// resume readies slot i for a prompt of n tokens sharing prefix with its
// sequence (ckpt.Store.Resume) and logs what a checkpoint did; it returns
// the positions kept. Needs e.mu.
func (e *engine) resume(i, n, prefix int) int {
	start := time.Now()
	r := e.ckpts.Resume(e.ctx, i, n, prefix, e.nSWA)
	switch c := r.Restored; {
	case c != nil:
		e.log.Debug("context checkpoint restored", "slot", i, "pos_min", c.PosMin, "pos_max", c.PosMax, "n_tokens", c.NTokens,
			"kept", r.Keep, "common_prefix", prefix, "bytes", c.Size(), "elapsed", time.Since(start).String())
	case r.Failed != nil:
		e.log.Warn("context checkpoint could not be restored: the prompt is evaluated from its start", "slot", i,
			"n_tokens", r.Failed.NTokens, "error", r.Err)
	case r.NoneServes:
		e.log.Info("no context checkpoint serves the prompt: evaluated from its start", "slot", i,
			"common_prefix", prefix, "memory", e.layout.Memory)
	}
	return r.Keep
}

// servedByCheckpoint reports whether slot i's checkpoints serve a prompt
// that parts from its sequence old as well as a cut would (the prompt
// cache's measure): the sequence stays in its slot rather than leaving for
// the cache.
func (e *engine) servedByCheckpoint(i int, old, toks []int32, posMin int) bool {
	if !e.ckpts.Enabled() || len(old) == 0 {
		return false
	}
	prefix := commonPrefix(old, toks)
	return e.ckpts.Serves(i, len(toks), prefix, posMin) > 0 && float64(prefix) >= promptcache.SaveBelow*float64(len(old))
}

// cachedCheckpoints are a slot's checkpoints carried by a prompt cache
// entry (promptcache.Extra), as llama-server's cached prompts carry theirs:
// a hybrid sequence that leaves its slot can later serve a prompt that
// parts from it. The checkpoints' bytes are never changed once taken, so
// the entry shares them.
type cachedCheckpoints struct {
	rules ckpt.Rules
	list  []*ckpt.Checkpoint // oldest first
}

func (c *cachedCheckpoints) Bytes() int64 {
	var n int64
	for _, cp := range c.list {
		n += cp.Size()
	}
	return n
}

func (c *cachedCheckpoints) Serves(n, prefix, posMin int) bool {
	return c.rules.Find(c.list, n, prefix, posMin).Restore != nil
}

// checkpointsOut are slot i's checkpoints for the prompt cache entry its
// sequence is saved as; nil for none.
func (e *engine) checkpointsOut(i int) promptcache.Extra {
	if !e.ckpts.Enabled() {
		return nil
	}
	all := e.ckpts.All(i)
	if len(all) == 0 {
		return nil
	}
	return &cachedCheckpoints{rules: e.ckpts.Rules(), list: all}
}

// checkpointsIn makes the checkpoints a restored prompt cache entry
// carried (x) slot i's, oldest first, within the checkpoints' budget.
func (e *engine) checkpointsIn(i int, x promptcache.Extra) {
	c, ok := x.(*cachedCheckpoints)
	if !ok || !e.ckpts.Enabled() {
		return
	}
	for _, cp := range c.list {
		e.ckpts.Put(i, cp)
	}
	n, bytes := e.ckpts.Slot(i)
	e.log.Debug("prompt cache: the entry's context checkpoints restored", "slot", i, "carried", len(c.list),
		"slot_checkpoints", n, "slot_bytes", bytes)
}

// SlotCheckpoint returns slot i's newest checkpoint, which a STATE_GET or
// PREFILL reply's blob carries; nil where it holds none. Its bytes are
// never changed once taken, so they are shared, not copied.
func (b *Backend) SlotCheckpoint(ctx context.Context, i int) (*iface.Checkpoint, error) {
	e, _, err := b.slot(i)
	if err != nil || !e.ckpts.Enabled() {
		return nil, err
	}
	all := e.ckpts.All(i)
	if len(all) == 0 {
		return nil, nil
	}
	c := all[len(all)-1]
	return &iface.Checkpoint{PosMin: int32(c.PosMin), PosMax: int32(c.PosMax), NTokens: int64(c.NTokens), Target: c.Data}, nil
}

// PutCheckpoint keeps the checkpoint a STATE_PUT's blob carried as slot i's
// (just restored, so holding none), once llama.cpp has read it into the
// scratch sequence: a checkpoint of another memory or model, or cut short,
// is refused there before the slot relies on it. A draft part is not needed:
// the draft context re-derives its cells from the slot's tokens.
func (b *Backend) PutCheckpoint(ctx context.Context, i int, c iface.Checkpoint) (bool, string, error) {
	e, s, err := b.slot(i)
	if err != nil {
		return false, "", err
	}
	if !e.ckpts.Enabled() {
		if e.needsCheckpoints() {
			return false, "checkpoints are off (ctx_checkpoints=0)", nil
		}
		return false, "the model's memory can be cut anywhere: it needs no checkpoints", nil
	}
	n := len(s.Seq())
	if c.NTokens < 1 || c.NTokens > int64(n) || c.PosMin < 0 || c.PosMin > c.PosMax || int64(c.PosMax) >= c.NTokens {
		return false, "", fmt.Errorf("%w: a checkpoint of %d tokens at positions %d..%d does not fit the slot's sequence of %d",
			iface.ErrBadRequest, c.NTokens, c.PosMin, c.PosMax, n)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	err = e.ctx.SetPartialState(e.scratch, c.Target)
	e.ctx.SeqRm(e.scratch)
	if err != nil {
		return false, "", fmt.Errorf("%w: llama.cpp cannot read the checkpoint into this model's memory (%s): %w",
			iface.ErrBadRequest, e.layout.Memory, err)
	}
	kept := &ckpt.Checkpoint{PosMin: int(c.PosMin), PosMax: int(c.PosMax), NTokens: int(c.NTokens), Data: c.Target, Task: e.tasks.Add(1)}
	if !e.ckpts.Put(i, kept) {
		return false, fmt.Sprintf("larger (%d bytes) than the checkpoints' whole budget", len(c.Target)), nil
	}
	why := ""
	if len(c.Draft) > 0 {
		why = "its draft part is not needed: the draft model re-derives its cells from the tokens"
	}
	e.log.Debug("context checkpoint restored with the slot's state", "slot", i, "n_tokens", c.NTokens, "bytes", len(c.Target))
	return true, why, nil
}

// messageDelimiters are the chat template's message delimiters as
// common/chat knows them, tokenized as llama-server tokenizes them (special
// tokens parsed, nothing added); nil where checkpoints are off or
// common/chat cannot read the template.
func (e *engine) messageDelimiters() []ckpt.Delimiter {
	if !e.ckpts.Enabled() || e.chatc == nil {
		return nil
	}
	p, err := e.chatc.apply([]byte(`{"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		e.log.Warn("the chat template's message delimiters are unknown: no checkpoints at user messages", "error", err)
		return nil
	}
	var out []ckpt.Delimiter
	for _, d := range p.MessageDelimiters {
		toks, err := e.model.tokenizeWith(d.Delimiter, false, true)
		if err != nil || len(toks) == 0 {
			continue
		}
		out = append(out, ckpt.Delimiter{User: d.Role == "user", Tokens: toks})
	}
	return out
}

// spansOf are where a prompt's user messages start: for a prompt rendered
// from chat messages (here, or by the host: FromChat), as llama-server finds
// them for a chat completion; none for text or token ids (llama-server's
// /completion takes no delimiters).
func (e *engine) spansOf(req iface.PrefillRequest, toks []int32) ckpt.Spans {
	if (len(req.Messages) == 0 && !req.FromChat) || e.delims == nil {
		return ckpt.Spans{}
	}
	return ckpt.UserStarts(toks, e.delims)
}
