//go:build llama && cgo

package cudallama

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/promptcache"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// The host-memory prompt cache (cache_ram, llama-server's --cache-ram):
// internal/promptcache decides what is saved, evicted and restored; this
// file moves a sequence's state between a slot and the cache's memory
// through the code STATE_GET and STATE_PUT use. The entries' memory is
// pinned on a GPU, so saves and restores are DMA copies.

// cachePiece is the most of a state a save writes, or a restore reads, with
// the context lock held: between pieces the other slots' steps go on, as
// between a STATE_GET's or STATE_PUT's chunks. Tests lower it.
var cachePiece = 64 << 20

// newPromptCache is the cache of a cache_ram of mib MiB (nil for 0), its
// entries pinned for DMA on a GPU.
func (e *engine) newPromptCache(mib int64) *promptcache.Cache {
	alloc := promptcache.Mapped{}
	if e.device != "" {
		alloc.Pin = llama.PinHost
	}
	c := promptcache.New(promptcache.BudgetOf(mib), e.cells.NCtx, alloc)
	if c != nil {
		limit := fmt.Sprintf("%d MiB", mib)
		if mib < 0 {
			limit = fmt.Sprintf("no limit in bytes, %d tokens", e.cells.NCtx)
		}
		e.log.Info("prompt cache in host memory: HTTP completions' sequences leaving their slot are kept there",
			llamaopt.OptCacheRAM, limit, "pinned", alloc.Pin != nil)
	}
	return c
}

// cacheRule is how much of a cached sequence a prompt keeps on this
// model's memory, as cut keeps a slot's.
func (e *engine) cacheRule() promptcache.Rule {
	return promptcache.Rule{Recurrent: e.layout.recurrent(), Window: e.nSWA}
}

// fromCache runs the prompt cache before an HTTP completion's prompt toks
// replaces slot i's sequence (req.PromptCache), where llama-server consults
// its cache: the slot is empty, or its sequence leaves it (the prompt keeps
// less than half of it). A leaving sequence that is an earlier completion's
// (req.SaveSequence) is saved first; then the cached sequence that serves
// the prompt better than the slot's is restored into the slot, and the
// prefill keeps what it shares with the prompt. A sequence that is not
// HTTP's is neither saved nor replaced: the coordinator's slots are its own.
// The caller holds the slot. A failure is logged and counted, and the
// prompt is evaluated as without a cache.
func (e *engine) fromCache(ctx context.Context, i int, s *kv.Slot, toks []int32, req iface.PrefillRequest) {
	if e.pcache == nil || !req.PromptCache {
		return
	}
	old := s.Seq()
	e.mu.Lock()
	posMin := e.ctx.SeqPosMin(i)
	e.mu.Unlock()
	rule := e.cacheRule()
	leaves := rule.Leaves(old, posMin, toks)
	switch {
	case len(old) > 0 && !leaves: // the slot serves the prompt itself
		return
	case e.servedByCheckpoint(i, old, toks, posMin): // so it does, from a checkpoint
		return
	case len(old) > 0 && !req.SaveSequence:
		return
	case leaves:
		e.saveToCache(ctx, i, old, posMin)
	}
	// A sequence still being saved that serves the prompt is waited for.
	if p := e.saving.Load(); p != nil && !rule.Leaves(p.seq, p.posMin, toks) {
		<-p.done
	}
	if r := e.pcache.Take(rule, old, posMin, toks); r != nil {
		e.restoreFromCache(ctx, i, s, r)
	}
}

// saveToCache saves slot i's sequence seq into the cache, unless the cache
// declines it (held already, or over the budget). With a park sequence
// (parks) the cells are planned and handed to the park under the lock, and
// the bytes are written by a goroutine while the slot goes on with its next
// prompt; otherwise in line. posMin is the sequence's first position.
func (e *engine) saveToCache(ctx context.Context, i int, seq []int32, posMin int) {
	e.mu.Lock()
	size := e.ctx.StateSize(i)
	e.mu.Unlock()
	sv, err := e.pcache.BeginWith(seq, size, e.checkpointsOut(i))
	if err != nil {
		e.log.Warn("prompt cache: the sequence leaving its slot is not saved", "slot", i, "tokens", len(seq), "error", err)
		return
	}
	if sv == nil {
		e.log.Debug("prompt cache: the sequence leaving its slot is held already or larger than the budget", "slot", i, "tokens", len(seq), "bytes", size)
		return
	}
	start := time.Now()
	end := e.beginTransfer(&e.saveMu) // a save before this one has written its bytes
	chunk := int(min(size, int64(cachePiece)))
	w := &entryWriter{b: sv.Mem()[:size]}
	if e.park < 0 {
		defer end()
		e.saved(i, seq, sv, e.saveState(ctx, i, chunk, w), start)
		return
	}
	e.mu.Lock()
	e.reclaimParked()
	plan, err := e.ctx.binding().PlanState(i)
	var p *parkedSave
	if err == nil {
		p = &parkedSave{seq: seq, posMin: posMin, done: make(chan struct{})}
		e.ctx.SeqCp(i, e.park, -1, -1)
		e.parked = p
		e.saving.Store(p)
		e.cells.Parked = len(seq)
	}
	e.mu.Unlock()
	if err != nil {
		end()
		e.saved(i, seq, sv, savedState{chunkWriter: true, err: err}, start)
		return
	}
	hook := parkedSaveStarts
	go func() {
		if hook != nil {
			hook()
		}
		// The request may end before the save: the save is the engine's.
		res := e.savePlan(context.Background(), plan, chunk, w)
		plan.Free()
		e.saved(i, seq, sv, res, start)
		e.saving.CompareAndSwap(p, nil)
		close(p.done)
		end()
		e.mu.Lock()
		if e.parked == p {
			e.reclaimParked()
		}
		e.mu.Unlock()
		e.sched.Poke() // a step may have waited for the cells
	}()
}

// saved commits a save into the cache, or aborts it, and logs it.
func (e *engine) saved(i int, seq []int32, sv *promptcache.Save, res savedState, start time.Time) {
	posMin := -1
	if res.err == nil {
		posMin, res.err = e.layout.firstPos(sv.Mem()[:res.written], len(seq))
	}
	if res.err == nil {
		res.err = sv.Commit(res.written, posMin)
	} else {
		sv.Abort()
	}
	e.log.Debug("prompt cache: saved the sequence leaving its slot", "slot", i, "tokens", len(seq), "bytes", res.written,
		"pinned", promptcache.Pinned(sv.Memory()), "elapsed", time.Since(start).String(), "error", res.err)
}

// parkedSaveStarts, when set, runs as a save in the background begins:
// tests hold it back while the slot goes on.
var parkedSaveStarts func()

// parkedSave is a sequence that left its slot, its cells held by the park
// sequence while a goroutine writes its state into the prompt cache.
type parkedSave struct {
	seq    []int32
	posMin int
	done   chan struct{} // closed once the entry is committed or aborted
}

// reclaimParked waits for the parked sequence's save, if any, and frees its
// cells (kv.Cells.Reclaim). Needs mu; the save it waits for does not.
func (e *engine) reclaimParked() {
	p := e.parked
	if p == nil {
		return
	}
	<-p.done
	e.ctx.SeqRm(e.park)
	e.cells.Parked = 0
	e.parked = nil
}

// awaitSave waits for a save under way, if any, to end.
func (e *engine) awaitSave() {
	if p := e.saving.Load(); p != nil {
		<-p.done
	}
}

// restoreFromCache restores a taken entry into slot i as a STATE_PUT does,
// from its memory in place; on failure the slot is empty.
func (e *engine) restoreFromCache(ctx context.Context, i int, s *kv.Slot, r *promptcache.Restore) {
	start := time.Now()
	err := func() error {
		defer e.beginTransfer(&e.loadMu)()
		p := &statePut{e: e, i: i, s: s, tokens: r.Entry.Tokens, r: newEntryReader(r.Entry), size: r.Entry.StateBytes,
			entered: start, log: e.log, prompt: true}
		_, err := p.restore(ctx)
		if err != nil {
			e.failed(i, s, nil)
			return err
		}
		e.checkpointsIn(i, r.Entry.Extra)
		return nil
	}()
	r.Done(err == nil)
	if err != nil {
		e.log.Warn("prompt cache: restoring a cached sequence failed: the prompt is evaluated in full", "slot", i,
			"tokens", len(r.Entry.Tokens), "error", err)
		return
	}
	e.log.Debug("prompt cache: restored a cached sequence", "slot", i, "tokens", len(r.Entry.Tokens), "bytes", r.Entry.StateBytes,
		"pinned", promptcache.Pinned(r.Entry.Mem), "elapsed", time.Since(start).String())
}

// entryWriter is an shm.ChunkWriter over a save's memory, in pieces of
// cachePiece, so the shim writes the state straight into it.
type entryWriter struct {
	b   []byte
	off int
}

var _ shm.ChunkWriter = (*entryWriter)(nil)

func (w *entryWriter) Buffer() ([]byte, error) {
	if w.off == len(w.b) {
		return nil, fmt.Errorf("prompt cache: the state outgrows the %d bytes it announced", len(w.b))
	}
	return w.b[w.off:min(len(w.b), w.off+cachePiece)], nil
}

func (w *entryWriter) Commit(n int) error {
	if n < 0 || w.off+n > len(w.b) {
		return fmt.Errorf("prompt cache: a commit of %d bytes at %d of %d", n, w.off, len(w.b))
	}
	w.off += n
	return nil
}

func (w *entryWriter) Write(p []byte) (int, error) {
	b, err := w.Buffer()
	if err != nil {
		return 0, err
	}
	n := copy(b, p)
	w.off += n
	if n < len(p) {
		return n, io.ErrShortWrite
	}
	return n, nil
}

// entryReader is an shm.RegionReader over a cache entry's state: the
// restore reads its head, then takes the rest in place, in pieces of
// cachePiece.
type entryReader struct {
	b      []byte
	off    int
	pinned bool
}

var _ shm.RegionReader = (*entryReader)(nil)

func newEntryReader(e *promptcache.Entry) *entryReader {
	return &entryReader{b: e.State(), pinned: promptcache.Pinned(e.Mem)}
}

func (r *entryReader) Region() []byte { return r.b }

func (r *entryReader) Next() ([]byte, error) {
	if r.off == len(r.b) {
		return nil, io.EOF
	}
	p := r.b[r.off:min(len(r.b), r.off+cachePiece)]
	r.off += len(p)
	return p, nil
}

func (r *entryReader) Read(p []byte) (int, error) {
	if r.off == len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.off:])
	r.off += n
	return n, nil
}

// pinnedRegion reports whether rr is a prompt cache entry pinned for DMA.
func pinnedRegion(rr shm.RegionReader) bool {
	m, ok := rr.(*entryReader)
	return ok && m.pinned
}
