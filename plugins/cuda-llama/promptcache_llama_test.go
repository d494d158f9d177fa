//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// httpPrefill is an HTTP completion's prefill: the prompt cache may start
// it from a cached sequence, and save the slot's when save says it is an
// earlier completion's.
func httpPrefill(t testing.TB, b *Backend, slot int, toks []int32, save bool) iface.PrefillResult {
	t.Helper()
	res, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: slot, Tokens: toks, PromptCache: true, SaveSequence: save})
	if err != nil {
		t.Fatalf("Prefill slot %d: %v", slot, err)
	}
	return res
}

// httpPromptDecode is an HTTP completion's Decode with its prompt.
func httpPromptDecode(t testing.TB, b *Backend, slot int, toks []int32, n int, save bool) ([]int32, iface.DecodeResult) {
	t.Helper()
	ids, res, err := httpPromptDecodeErr(b, slot, toks, n, save)
	if err != nil {
		t.Fatal(err)
	}
	return ids, res
}

// httpPromptDecodeErr is httpPromptDecode for any goroutine.
func httpPromptDecodeErr(b *Backend, slot int, toks []int32, n int, save bool) ([]int32, iface.DecodeResult, error) {
	var ids []int32
	res, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: slot, NPredict: n, Sampler: iface.SamplerParams{IgnoreEOS: true},
		Prompt: &iface.PrefillRequest{Tokens: toks, PromptCache: true, SaveSequence: save}},
		func(tok iface.Token) error { ids = append(ids, tok.ID); return nil })
	if err != nil {
		return nil, res, fmt.Errorf("Decode slot %d: %w", slot, err)
	}
	return ids, res, nil
}

func cacheStats(t testing.TB, b *Backend) iface.PromptCacheStats {
	t.Helper()
	info, err := b.Info(context.Background())
	if err != nil || info.PromptCache == nil {
		t.Fatalf("Info: %v, prompt cache %v", err, info.PromptCache)
	}
	return *info.PromptCache
}

// TestPromptCacheRestoresEvicted: a conversation whose sequence another
// prompt pushed out of its one slot comes back from the cache (saved when
// it left, restored for its next prompt, which evaluates only its new
// tokens) and decodes as a fresh prefill of the whole prompt does, leaving
// the same state; the RPC-style prompt without the cache's flags and a
// backend without cache_ram see none of it.
func TestPromptCacheRestoresEvicted(t *testing.T) {
	for _, c := range []struct {
		piece   int
		unified string
	}{{cachePiece, "true"}, {4093, "true"}, {cachePiece, "false"}} { // one piece; many, fields across them; a KV stream per slot
		t.Run(fmt.Sprintf("pieces of %d, kv_unified %s", c.piece, c.unified), func(t *testing.T) {
			old := cachePiece
			cachePiece = c.piece
			t.Cleanup(func() { cachePiece = old })
			testPromptCacheRestoresEvicted(t, map[string]string{llamaopt.OptKVUnified: c.unified})
		})
	}
}

func testPromptCacheRestoresEvicted(t *testing.T, opts map[string]string) {
	b := load(t, tiny(t), 1, map[string]string{llamaopt.OptCacheRAM: "64", llamaopt.OptKVUnified: opts[llamaopt.OptKVUnified]})
	referenceKernels(t, b)
	first := tokensOf(t, b, "a long conversation about the cache, "+story)
	other := tokensOf(t, b, "something else entirely, of some length too, to take the slot")
	httpPrefill(t, b, 0, first, false)
	reply, _ := decode(t, b, 0, 6, iface.SamplerParams{IgnoreEOS: true})
	conv := append(slices.Clone(first), reply...)
	if st := cacheStats(t, b); st.Saves != 0 || st.Hits+st.Misses != 1 || st.BudgetBytes != 64<<20 {
		t.Fatalf("after the first prompt into an empty slot: %+v", st)
	}
	httpPrefill(t, b, 0, other, true)
	st := cacheStats(t, b)
	if st.Saves != 1 || st.Entries != 1 || st.Tokens != int64(len(conv)) || st.SaveBytes == 0 || st.Misses != 2 {
		t.Fatalf("after another prompt took the slot: %+v", st)
	}
	convBytes := st.SaveBytes
	decode(t, b, 0, 3, iface.SamplerParams{})

	next := append(slices.Clone(conv), tokensOf(t, b, " and the next question")...)
	got, res := httpPromptDecode(t, b, 0, next, 20, true)
	if res.Prompt == nil || res.Prompt.Reused != len(conv) {
		t.Fatalf("the conversation's next prompt reused %+v of %d tokens", res.Prompt, len(conv))
	}
	st = cacheStats(t, b)
	if st.Hits != 1 || st.Restores != 1 || st.RestoreBytes != convBytes || st.Saves != 2 || st.Entries != 1 || st.RestoreFailures != 0 {
		t.Fatalf("after the conversation came back: %+v", st) // the entry restored and the other prompt's, saved as it left
	}
	state := byPosition(t, normSeq(stateOf(t, b, 0, 1<<20)))

	fresh := load(t, tiny(t), 1, opts)
	referenceKernels(t, fresh)
	want, wres, err := promptDecode(context.Background(), fresh, 0, next, 20, iface.SamplerParams{IgnoreEOS: true})
	if err != nil || wres.Prompt == nil || wres.Prompt.Reused != 0 {
		t.Fatalf("fresh: %+v, %v", wres.Prompt, err)
	}
	sameGreedy(t, fresh, 0, next, got, want, iface.SamplerParams{IgnoreEOS: true})
	// The prefill's cells may sit in another order than a fresh prefill's
	// (the restore ran beside the save of the sequence that left), and
	// attention sums in cell order: from the second layer on the rows may
	// differ in their last bits, so the cells and the first layer's K rows
	// must be equal, the rest as long.
	wantState := byPosition(t, normSeq(stateOf(t, fresh, 0, 1<<20)))
	if end := firstLayerEnd(wantState); len(state) != len(wantState) || !bytes.Equal(state[:end], wantState[:end]) {
		t.Fatalf("the state after a restored prefix against a fresh prefill's: %d and %d bytes, the cells and first layer's K equal: %v",
			len(state), len(wantState), len(state) >= end && bytes.Equal(state[:end], wantState[:end]))
	}
	if info, _ := fresh.Info(context.Background()); info.PromptCache != nil {
		t.Fatalf("a backend without cache_ram reports a cache: %+v", info.PromptCache)
	}
}

// TestPromptCacheBudget: many mixed conversations through two slots and a
// 1 MiB cache: the cache never holds more than the budget, evicts the least
// recently used, and what it restores decodes as a fresh prefill.
func TestPromptCacheBudget(t *testing.T) {
	b := load(t, tiny(t), 2, map[string]string{llamaopt.OptCacheRAM: "1"})
	referenceKernels(t, b)
	e := b.eng.Load()
	perToken := e.layout.size(2) - e.layout.size(1)
	t.Logf("%d state bytes a token: the budget holds about %d tokens", perToken, (1<<20)/perToken)
	// Ten conversations through the two slots, one of the recent ones
	// coming back more often than not: together they hold more than the
	// budget, the recent ones are still in it.
	convs := make([][]int32, 10)
	for c := range convs {
		convs[c] = seqTokens(t, 400+60*c)
		for i := range convs[c] {
			convs[c][i] = int32(100 + (int(convs[c][i])+c*31)%300) // each conversation its own tokens
		}
	}
	fresh := load(t, tiny(t), 1, nil)
	referenceKernels(t, fresh)
	checked := 0
	rng := rand.New(rand.NewPCG(1, 2))
	var recent []int
	for step := range 40 {
		c := rng.IntN(len(convs))
		if len(recent) >= 5 && rng.IntN(10) < 6 {
			c = recent[len(recent)-3-rng.IntN(3)] // saved since it left its slot, two or more prompts ago
		}
		recent = append(recent, c)
		slot := step % 2
		prompt := append(slices.Clone(convs[c]), int32(100+step))
		got, res := httpPromptDecode(t, b, slot, prompt, 4, true)
		convs[c] = append(prompt, got...)
		st := cacheStats(t, b)
		if st.Bytes > st.BudgetBytes || st.Bytes < 0 {
			t.Fatalf("step %d: the cache holds %d bytes, its budget %d: %+v", step, st.Bytes, st.BudgetBytes, st)
		}
		if res.Prompt.Reused > 0 && checked < 3 && step > 10 {
			checked++
			want, _, err := promptDecode(context.Background(), fresh, 0, prompt, 4, iface.SamplerParams{IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			sameGreedy(t, fresh, 0, prompt, got, want, iface.SamplerParams{IgnoreEOS: true})
		}
	}
	st := cacheStats(t, b)
	t.Logf("%+v", st)
	if st.Evictions == 0 || st.Hits == 0 || st.Restores != st.Hits || st.SaveFailures+st.RestoreFailures != 0 {
		t.Fatalf("the workload did not go through the cache as it should: %+v", st)
	}
	if checked == 0 {
		t.Fatal("no restored prompt was checked against a fresh one")
	}
}

// TestPromptCacheLeavesRPCSlots: a slot the coordinator filled (a prompt
// without the cache's flags) is never saved, replaced or consulted for, an
// HTTP prompt naming it (PromptCache without SaveSequence) neither saves
// nor replaces its sequence, and HTTP work in the other slot leaves its
// state as it was.
func TestPromptCacheLeavesRPCSlots(t *testing.T) {
	b := load(t, tiny(t), 2, map[string]string{llamaopt.OptCacheRAM: "16"})
	conv := seqTokens(t, 200)
	rpc := append(slices.Clone(conv[:20]), seqTokens(t, 300)[200:]...)
	httpPrefill(t, b, 1, conv, false)
	httpPrefill(t, b, 1, seqTokens(t, 40)[10:], true) // conv leaves slot 1 for the cache
	if st := cacheStats(t, b); st.Saves != 1 || st.Entries != 1 {
		t.Fatalf("setup: %+v", st)
	}
	prefillTokens(t, b, 0, rpc) // the coordinator's
	before := cacheStats(t, b)

	// The coordinator's next prompt on its slot: no save of its sequence,
	// no look in the cache, though the cache holds the prompt's prefix.
	r := prefillTokens(t, b, 0, append(slices.Clone(conv), 5))
	if st := cacheStats(t, b); r.Reused != 20 || st != before {
		t.Fatalf("an RPC prompt: reused %d (its own prefix is 20), stats %+v, were %+v", r.Reused, st, before)
	}
	// Again the coordinator's sequence, then an HTTP completion naming its
	// slot: the sequence is not saved, nor replaced by the cached one.
	prefillTokens(t, b, 0, rpc)
	r = httpPrefill(t, b, 0, append(slices.Clone(conv), 5), false)
	if st := cacheStats(t, b); r.Reused != 20 || st.Saves != before.Saves || st.Restores != 0 || st.Entries != 1 {
		t.Fatalf("an HTTP prompt on an RPC slot: reused %d, stats %+v", r.Reused, st)
	}
	// HTTP conversations come and go in slot 1 while the coordinator's
	// sequence sits in slot 0.
	prefillTokens(t, b, 0, rpc)
	rpcState := stateOf(t, b, 0, 1<<20)
	for k := range 4 {
		p := make([]int32, 100+30*k)
		for j := range p {
			p[j] = int32(100 + (j*53+k*17+5)%300) // shares no first token with conv or another
		}
		httpPrefill(t, b, 1, p, true)
	}
	httpPrefill(t, b, 1, append(slices.Clone(conv), 7), true)
	if st := cacheStats(t, b); st.Restores != 1 {
		t.Fatalf("the HTTP conversation did not come back from the cache: %+v", st)
	}
	if after := stateOf(t, b, 0, 1<<20); !bytes.Equal(after, rpcState) || !slices.Equal(slotInfo(t, b, 0).Tokens, rpc) {
		t.Fatal("HTTP work in slot 1 changed the coordinator's sequence in slot 0")
	}
}

// TestPromptCacheMemoryKinds: on every memory kind a cached sequence is
// restored for a prompt only where the restored state can be cut to what
// the prompt shares with it, or a context checkpoint the entry carries
// serves it: a plain cache any common prefix; a sliding window one window
// before the sequence's end, since llama.cpp saves only the window's cells
// (with swa_full too: its cache keeps every cell, its state does not, and
// it takes no checkpoints), or from its checkpoint at N − 4 − n_ubatch or
// N − 4; a hybrid's recurrent state a sequence the prompt extends, or from
// those checkpoints (the window's ends a position earlier: llama-server's
// [TAG_CHECKPOINTS_FIX_POS_MIN]). A prompt the cache serves decodes as a
// fresh prefill of it does.
func TestPromptCacheMemoryKinds(t *testing.T) {
	base := seqTokens(t, 60)
	longer := append(slices.Clone(base), seqTokens(t, 70)[60:]...)
	diverged := append(slices.Clone(base[:50]), 7, 8, 9, 10)
	long := seqTokens(t, 1500) // past the window cache's cells: their early positions are overwritten
	longCut := append(slices.Clone(long[:1000]), 7, 8, 9, 10)
	other := seqTokens(t, 130)[70:]
	type kind struct {
		name, memory string
		c            gguf.Config
		opts         map[string]string
	}
	kinds := []kind{}
	for _, m := range memoryModels {
		kinds = append(kinds, kind{m.name, m.memory, m.c, nil})
	}
	kinds = append(kinds, kind{"gemma3 swa_full", "iswa-full", gguf.TinyGemma3(), map[string]string{llamaopt.OptSWAFull: "true"}})
	for _, m := range kinds {
		t.Run(m.name, func(t *testing.T) {
			path := modelFile(t, "mem-"+strings.Fields(m.name)[0], m.c)
			opts := maps.Clone(m.opts)
			if opts == nil {
				opts = map[string]string{}
			}
			opts[llamaopt.OptCacheRAM] = "64"
			b := load(t, path, 1, opts)
			fresh := load(t, path, 1, m.opts)
			for _, c := range []struct {
				name        string
				first, then []int32
				reuse       map[string]int // by memory kind; 0: not restored
			}{
				{"extends", base, longer, map[string]int{"kv": 60, "iswa": 60, "iswa-full": 60, "hybrid": 60}},
				{"diverges", base, diverged, map[string]int{"kv": 50, "iswa": 0, "iswa-full": 0, "hybrid": 0}},
				{"the same prompt", base, base, map[string]int{"kv": 59, "iswa": 55, "iswa-full": 0, "hybrid": 56}},
				{"diverges in a long sequence", long, longCut, map[string]int{"kv": 1000, "iswa": 983, "iswa-full": 0, "hybrid": 984}},
				{"keeps less than a quarter of it", long, append(slices.Clone(long[:300]), 7), map[string]int{"kv": 0, "iswa": 0, "iswa-full": 0, "hybrid": 0}},
			} {
				httpPrefill(t, b, 0, c.first, true)
				httpPrefill(t, b, 0, other, true) // c.first leaves the slot
				before := cacheStats(t, b)
				res := httpPrefill(t, b, 0, c.then, true)
				st := cacheStats(t, b)
				want := c.reuse[m.memory]
				if res.Reused != want || (want > 0) != (st.Restores == before.Restores+1) {
					t.Errorf("%s: reused %d tokens, want %d; restores %d → %d", c.name, res.Reused, want, before.Restores, st.Restores)
				}
				if st.RestoreFailures != 0 || st.SaveFailures != 0 {
					t.Fatalf("%s: %+v", c.name, st)
				}
				got, _ := decode(t, b, 0, 12, iface.SamplerParams{})
				prefillTokens(t, fresh, 0, c.then)
				wantToks, _ := decode(t, fresh, 0, 12, iface.SamplerParams{})
				sameGreedy(t, fresh, 0, c.then, got, wantToks, iface.SamplerParams{})
				for _, bk := range []*Backend{b, fresh} {
					if err := bk.ClearSlot(context.Background(), 0); err != nil {
						t.Fatal(err)
					}
				}
			}
		})
	}
}

// The cache's rule is the slot's cut: for each memory kind, the tokens
// Rule.Keep says a sequence serves a prompt with are what a prefill reuses of
// it without context checkpoints (a cache entry carries none).
func TestPromptCacheRuleIsCut(t *testing.T) {
	base := seqTokens(t, 60)
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			b := load(t, modelFile(t, "mem-"+m.name, m.c), 1, map[string]string{llamaopt.OptCtxCheckpoints: "0"})
			e := b.eng.Load()
			for _, then := range [][]int32{append(slices.Clone(base), 1, 2), append(slices.Clone(base[:30]), 1), base} {
				prefillTokens(t, b, 0, base)
				e.mu.Lock()
				posMin := e.ctx.SeqPosMin(0)
				e.mu.Unlock()
				keep := e.cacheRule().Keep(base, posMin, then)
				if r := prefillTokens(t, b, 0, then); r.Reused != keep {
					t.Errorf("%d tokens after %d: the rule keeps %d, the prefill reused %d", len(then), len(base), keep, r.Reused)
				}
			}
		})
	}
}

// TestPromptCacheSavesBesideThePrompt: a sequence leaving its slot for the
// cache is saved while the slot goes on with its next prompt, on every
// memory kind. Held back until that prompt has decoded, the save still
// writes the sequence as it was (restored, it decodes as a fresh prefill
// does), the next prompt decodes as it does alone, and a prompt that needs
// the parked cells waits for the save rather than being refused.
func TestPromptCacheSavesBesideThePrompt(t *testing.T) {
	first := seqTokens(t, 60)
	other := make([]int32, 150)
	for j := range other {
		other[j] = int32(100 + (j*53+5)%300) // shares no first token with first
	}
	big := make([]int32, 210) // with first's 60 cells, more than 256
	for j := range big {
		big[j] = int32(100 + (j*71+9)%300)
	}
	sp := iface.SamplerParams{IgnoreEOS: true}
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			path := modelFile(t, "mem-"+m.name, m.c)
			fresh := load(t, path, 1, nil)
			referenceKernels(t, fresh)
			hold := func() chan struct{} {
				release := make(chan struct{})
				parkedSaveStarts = func() { <-release }
				t.Cleanup(func() { parkedSaveStarts = nil })
				return release
			}

			b := load(t, path, 1, map[string]string{llamaopt.OptCacheRAM: "64"})
			referenceKernels(t, b)
			e := b.eng.Load()
			if e.park < 0 {
				t.Fatal("no park sequence with cache_ram on one pool of cells")
			}
			release := hold()
			httpPrefill(t, b, 0, first, false)
			got, _ := httpPromptDecode(t, b, 0, other, 8, true) // first leaves, its save held back
			if e.saving.Load() == nil {
				t.Fatal("the save ended before it was let go: the prompt waited for it")
			}
			want, _, err := promptDecode(context.Background(), fresh, 0, other, 8, sp)
			if err != nil {
				t.Fatal(err)
			}
			sameGreedy(t, fresh, 0, other, got, want, sp)
			otherConv := append(slices.Clone(other), got...)
			close(release)
			parkedSaveStarts = nil

			next := append(slices.Clone(first), 7, 8, 9)
			got, res := httpPromptDecode(t, b, 0, next, 8, true)
			if res.Prompt == nil || res.Prompt.Reused != len(first) {
				t.Fatalf("the saved sequence's next prompt reused %+v of %d tokens", res.Prompt, len(first))
			}
			if st := cacheStats(t, b); st.Saves != 2 || st.Restores != 1 || st.SaveFailures+st.RestoreFailures != 0 {
				t.Fatalf("after the sequence came back: %+v", st)
			}
			want, _, err = promptDecode(context.Background(), fresh, 0, next, 8, sp)
			if err != nil {
				t.Fatal(err)
			}
			sameGreedy(t, fresh, 0, next, got, want, sp)

			// other's conversation comes back from the cache while next's
			// save, as next leaves, is held back: a restore does not wait for
			// a save.
			release2 := hold()
			back := append(slices.Clone(otherConv), 7, 8, 9)
			decoded := make(chan struct{})
			go func() {
				defer close(decoded)
				got, res, err = httpPromptDecodeErr(b, 0, back, 8, true)
			}()
			select {
			case <-decoded:
			case <-time.After(30 * time.Second):
				close(release2)
				<-decoded
				t.Fatal("a restore from the cache waited for a save under way")
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Prompt == nil || res.Prompt.Reused != len(otherConv) || e.saving.Load() == nil {
				t.Fatalf("a restore beside a held save: reused %+v of %d tokens, save under way %v", res.Prompt, len(otherConv), e.saving.Load() != nil)
			}
			want, _, err = promptDecode(context.Background(), fresh, 0, back, 8, sp)
			if err != nil {
				t.Fatal(err)
			}
			sameGreedy(t, fresh, 0, back, got, want, sp)
			close(release2)

			// 256 cells: the next prompt needs the ones first's save holds.
			b = load(t, path, 1, map[string]string{llamaopt.OptCacheRAM: "64", llamaopt.OptNCtx: "256"})
			e = b.eng.Load()
			release = hold()
			httpPrefill(t, b, 0, first, false)
			done := make(chan error, 1)
			go func() {
				_, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: 0, Tokens: big, PromptCache: true, SaveSequence: true})
				done <- err
			}()
			select {
			case err := <-done:
				t.Fatalf("a prompt needing the parked cells ended before the save was let go: %v", err)
			case <-time.After(100 * time.Millisecond):
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatalf("a prompt needing the parked cells: %v", err)
			}
			e.mu.Lock()
			parked := e.cells.Parked
			e.mu.Unlock()
			if st := cacheStats(t, b); st.Saves != 1 || parked != 0 {
				t.Fatalf("after the prompt took the parked cells: %+v, %d parked", st, parked)
			}
		})
	}
}

// byPosition is a plain KV cache's state (one part, one stream) with its
// cells in the order of their positions: a sequence restored beside a save
// that holds other cells may sit in cells of another order, which llama.cpp
// writes in cell order.
func byPosition(t testing.TB, s []byte) []byte {
	t.Helper()
	le := binary.LittleEndian
	n := int(le.Uint32(s[4:]))
	meta := s[8 : 8+n*cellMetaSize]
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	pos := func(i int) int32 { return int32(le.Uint32(meta[i*cellMetaSize:])) }
	slices.SortStableFunc(perm, func(a, b int) int { return int(pos(a) - pos(b)) })
	out := bytes.Clone(s)
	permute := func(off, size int) { // n items of size bytes from off
		for k, i := range perm {
			copy(out[off+k*size:off+(k+1)*size], s[off+i*size:off+(i+1)*size])
		}
	}
	permute(8, cellMetaSize)
	off := 8 + n*cellMetaSize
	vTrans, nLayer := le.Uint32(s[off:]), int(le.Uint32(s[off+4:]))
	off += 8
	for range nLayer { // K: type, row size, the rows
		row := int(le.Uint64(s[off+4:]))
		permute(off+12, row)
		off += 12 + n*row
	}
	for range nLayer {
		if vTrans == 0 { // V as K
			row := int(le.Uint64(s[off+4:]))
			permute(off+12, row)
			off += 12 + n*row
			continue
		}
		el, dims := int(le.Uint32(s[off+4:])), int(le.Uint32(s[off+8:])) // type, element size, n_embd_v_gqa, a row of cells per dim
		off += 12
		for range dims {
			permute(off, el)
			off += n * el
		}
	}
	if off > len(s) {
		t.Fatalf("byPosition: a state of %d bytes read to %d", len(s), off)
	}
	return out
}

// firstLayerEnd is where a plain KV cache state's first layer's K rows end:
// after the cells, v_trans and n_layer, the K type and row size, the rows.
func firstLayerEnd(s []byte) int {
	le := binary.LittleEndian
	off := cellsEnd(s) + 8
	return off + 12 + int(le.Uint32(s[4:]))*int(le.Uint64(s[off+4:]))
}
