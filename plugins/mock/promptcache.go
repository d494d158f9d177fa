package mock

import (
	"bytes"
	"context"
	"io"
	"slices"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/promptcache"
)

// OptCacheRAM is the host-memory prompt cache's budget in MiB, as the llama
// plugin's cache_ram (llama-server's --cache-ram): 0 off (the default), -1
// no limit in bytes (n_ctx tokens then).
const OptCacheRAM = "cache_ram"

// maxCacheRAM is the largest budget taken, in MiB.
const maxCacheRAM = 1 << 32

// The mock keeps the llama plugin's prompt cache, the same rules
// (internal/promptcache) over its fake state: a sequence leaving its slot
// has its state generated into the cache's memory, as STATE_GET writes it,
// and a cached one chosen for a prompt is checked byte for byte as
// STATE_PUT checks a state before the slot takes its tokens. So the host's
// side of the cache (which prompts may use it, its figures on /metrics)
// runs without llama.cpp. Its memory is real: budget it like the plugin's.

// fromCache runs the prompt cache before an HTTP completion's prompt
// replaces slot i's sequence, as the llama plugin's does: the slot is empty
// or its sequence leaves it (the prompt keeps less than half of it); a
// leaving sequence an earlier completion left (SaveSequence) is saved, then
// the cached sequence that serves the prompt better than the slot's is
// restored into it. A sequence not HTTP's is neither saved nor replaced.
// The caller holds the slot.
func (b *Backend) fromCache(ctx context.Context, e *engine, i int, s *slot, prompt []int32, req iface.PrefillRequest) {
	if e.pcache == nil || !req.PromptCache {
		return
	}
	old, _ := s.snapshot()
	posMin := -1
	if len(old) > 0 {
		posMin = 0
	}
	var rule promptcache.Rule // a plain cache: any prefix is kept
	leaves := rule.Leaves(old, posMin, prompt)
	switch {
	case len(old) > 0 && !leaves:
		return
	case len(old) > 0 && !req.SaveSequence:
		return
	case leaves:
		b.saveToCache(e, i, old)
	}
	if r := e.pcache.Take(rule, old, posMin, prompt); r != nil {
		b.restoreFromCache(ctx, e, i, s, r)
	}
}

// saveToCache generates the state of slot i's sequence toks into the cache.
func (b *Backend) saveToCache(e *engine, i int, toks []int32) {
	size := StateSize(e.kvBytes, len(toks))
	sv, err := e.pcache.Begin(toks, size)
	if err != nil {
		b.log.Warn("prompt cache: the sequence leaving its slot is not saved", "slot", i, "tokens", len(toks), "error", err)
	}
	if sv == nil {
		return
	}
	n, err := io.ReadFull(newStateGen(toks, int32(i), e.kvBytes, e.pat), sv.Mem()[:size])
	if err == nil {
		err = sv.Commit(int64(n), 0)
	} else {
		sv.Abort()
	}
	b.log.Debug("prompt cache: saved the sequence leaving its slot", "slot", i, "tokens", len(toks), "bytes", n, "error", err)
}

// restoreFromCache checks a taken entry's state as STATE_PUT does and puts
// its sequence in slot i; on failure the slot is empty.
func (b *Backend) restoreFromCache(ctx context.Context, e *engine, i int, s *slot, r *promptcache.Restore) {
	toks, state := r.Entry.Tokens, r.Entry.State()
	s.clear()
	err := e.claimCells(i, len(toks))
	if err == nil {
		_, _, err = restore(e, toks, newStateSource(ctx, bytes.NewReader(state), int64(len(state))), int64(len(state)))
		e.unclaim(i)
	}
	if err == nil {
		own := slices.Clone(toks)
		s.set(own, seqHash(own))
	}
	r.Done(err == nil)
	if err != nil {
		b.log.Warn("prompt cache: restoring a cached sequence failed: the prompt is evaluated in full", "slot", i, "error", err)
		return
	}
	b.log.Debug("prompt cache: restored a cached sequence", "slot", i, "tokens", len(toks), "bytes", len(state))
}
