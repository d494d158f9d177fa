// Package promptcache is the backends' host-memory prompt cache (the
// backend option cache_ram, llama-server's --cache-ram): when an HTTP
// completion's prompt takes a slot whose sequence, an earlier completion's,
// it would mostly drop, that sequence's state is saved here; a later prompt
// that shares more with a cached sequence than with its slot's starts from
// that state, restored into the slot, and evaluates only the rest. It
// decides as llama-server's server_prompt_cache does at the llama.cpp
// commit the llama backend is built from (tools/server/server-task.cpp):
// what to save, what to evict, which entry to restore. The backends move
// the bytes; this package holds them, counts them and chooses.
package promptcache

import (
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's thresholds (server-context.cpp, server-task.cpp).
const (
	// SaveBelow: a slot whose sequence keeps less than this share of its
	// tokens under the new prompt is saved first ("about to lose a large
	// portion of the existing context").
	SaveBelow = 0.5
	// MinKeep: an entry the prompt keeps less of than this share is never
	// restored ("don't trash large prompts").
	MinKeep = 0.25
)

// tokenBytes is what the cache counts for each token an entry keeps.
const tokenBytes = 4

// Memory is an entry's state bytes, from an Allocator.
type Memory interface {
	// Bytes is the memory, at least the size asked for.
	Bytes() []byte
	// Free gives it back; Bytes must not be used afterwards.
	Free()
}

// Pinned reports whether mem is pinned for DMA (Mapped with Pin).
func Pinned(mem Memory) bool {
	p, ok := mem.(interface{ Pinned() bool })
	return ok && p.Pinned()
}

// Allocator makes the entries' memory. Size says what an allocation of n
// bytes holds (a mapping's whole pages), before it is made, so the cache
// makes room first and never holds more than its budget.
type Allocator interface {
	Size(n int64) int64
	Alloc(n int64) (Memory, error)
}

// Rule is how much of a cached sequence a prompt can keep, which depends
// on the memory the state is of: what the backend's own prompt reuse can
// cut a sequence to.
type Rule struct {
	// Recurrent: the state holds a recurrent part (a hybrid or recurrent
	// model), which stands for the whole sequence up to its last token and
	// cannot be cut before it: a sequence is kept only where it is a prefix
	// of the prompt, shorter than the prompt.
	Recurrent bool
	// Window is a sliding window's span (0: every position is kept): a
	// sequence is kept to keep tokens only where its first position held is
	// at most keep − Window, the window before the cut.
	Window int
}

// Keep is how many leading tokens of prompt a sequence seq whose first
// position held is posMin (-1: none) serves, 0 for none: their common
// prefix, less the prompt's last token, which is always evaluated (its
// logits are the reply's), where the memory can be cut there.
func (r Rule) Keep(seq []int32, posMin int, prompt []int32) int {
	keep := min(iface.CommonPrefix(seq, prompt), len(prompt)-1)
	switch {
	case keep <= 0 || posMin < 0 || posMin > max(0, keep-r.Window):
		return 0
	case r.Recurrent && keep < len(seq):
		return 0
	}
	return keep
}

// shared is the common prefix llama-server's ratios take, where the
// sequence serves the prompt at all (Keep), else 0.
func (r Rule) shared(seq []int32, posMin int, prompt []int32) int {
	if r.Keep(seq, posMin, prompt) == 0 {
		return 0
	}
	return iface.CommonPrefix(seq, prompt)
}

// Extra is what an entry carries beside its state: a hybrid's or
// sliding-window model's context checkpoints, which let a prompt that parts
// from the sequence resume where the state alone cannot be cut. The cache
// counts its bytes against the budget and asks it whether it serves a
// prompt; the backend that saved it restores it with the state.
type Extra interface {
	// Bytes is the host memory it holds.
	Bytes() int64
	// Serves reports whether it restores the sequence, whose state's first
	// position is posMin, to a point from which a prompt of n tokens
	// sharing prefix tokens with it resumes (not from token 0).
	Serves(n, prefix, posMin int) bool
}

// sharedEntry is shared for a cached entry: where its state cannot be cut
// to the common prefix, what it carries (Extra) may still serve the prompt,
// and then the prefix counts, as llama-server counts an entry restored with
// its checkpoints.
func (r Rule) sharedEntry(e *Entry, prompt []int32) int {
	if n := r.shared(e.Tokens, e.PosMin, prompt); n > 0 || e.Extra == nil {
		return n
	}
	prefix := iface.CommonPrefix(e.Tokens, prompt)
	if min(prefix, len(prompt)-1) <= 0 || !e.Extra.Serves(len(prompt), prefix, e.PosMin) {
		return 0
	}
	return prefix
}

// Leaves reports whether a slot's sequence seq (first position posMin)
// leaves its slot for prompt: it has tokens, and the prompt keeps less
// than SaveBelow of them. Such a sequence is what a cache saves.
func (r Rule) Leaves(seq []int32, posMin int, prompt []int32) bool {
	return len(seq) > 0 && float64(r.shared(seq, posMin, prompt)) < SaveBelow*float64(len(seq))
}

// Entry is one cached sequence.
type Entry struct {
	Tokens []int32
	// PosMin is the first position the state holds once restored (a
	// sliding window's part holds the window only), for Rule.Keep.
	PosMin int
	// StateBytes is the state's length in Mem.
	StateBytes int64
	Mem        Memory
	// Extra is what the entry carries beside its state; nil for nothing.
	Extra Extra
	held  int64 // what the cache counts for it: Mem's size and the tokens'
}

// State is the entry's state bytes.
func (e *Entry) State() []byte { return e.Mem.Bytes()[:e.StateBytes] }

// Cache is one backend's prompt cache, safe for concurrent use by the
// slots' operations.
type Cache struct {
	alloc Allocator
	// budget is the most held may reach; < 0: no limit in bytes, and then
	// the entries hold at most tokenLimit tokens together (llama-server's
	// limit_tokens, n_ctx, which with a budget in bytes never binds).
	budget     int64
	tokenLimit int

	mu      sync.Mutex
	entries []*Entry // least recently used first
	// spare is memory of entries gone (restored, dropped for a longer one,
	// a failed save's), kept for the next saves: a fresh mapping costs a
	// page fault a page as it is written, and on a GPU its pinning, which
	// memory written before does not. At most maxSpare, dropped first when
	// room is needed.
	spare []Memory
	held  int64 // the entries', the spare memory, what restores and saves under way hold
	// releasing is the part of held given up and being freed (release).
	releasing int64
	// tokens is the entries' tokens; stats the running totals.
	tokens int
	stats  iface.PromptCacheStats
}

// maxSpare bounds the memory kept for reuse: a few conversations taking
// turns reuse each other's.
const maxSpare = 4

// New is a cache of budget bytes (< 0: no limit, tokenLimit tokens then)
// whose memory comes from alloc; budget 0 is no cache: nil.
func New(budget int64, tokenLimit int, alloc Allocator) *Cache {
	if budget == 0 {
		return nil
	}
	return &Cache{alloc: alloc, budget: max(budget, -1), tokenLimit: tokenLimit}
}

// BudgetOf is the budget of a cache_ram of mib MiB (-1: no limit).
func BudgetOf(mib int64) int64 {
	if mib < 0 {
		return -1
	}
	return mib << 20
}

// roomFor is the memory a state of n bytes is given: above 2 MiB up to a
// quarter more (the next of 5, 6, 7 or 8 × 2^k), so that a conversation's
// next, longer state still fits the memory its last one left (spare).
func roomFor(n int64) int64 {
	if n <= 2<<20 {
		return n
	}
	step := int64(1) << (bits.Len64(uint64(n-1)) - 3)
	return (n + step - 1) / step * step
}

// Save is a save under way: Mem is where the state goes, its bytes
// already counted; Commit makes it an entry, Abort drops it.
type Save struct {
	c     *Cache
	entry *Entry
	start time.Time
	once  sync.Once
}

// Mem is the memory the state is to be written into, at least the state's
// size.
func (s *Save) Mem() []byte { return s.entry.Mem.Bytes() }

// Memory is the save's memory as its allocator made it.
func (s *Save) Memory() Memory { return s.entry.Mem }

// Begin starts saving a sequence of tokens whose state takes stateBytes
// and which carries nothing more (BeginWith).
func (c *Cache) Begin(tokens []int32, stateBytes int64) (*Save, error) {
	return c.BeginWith(tokens, stateBytes, nil)
}

// BeginWith starts saving a sequence of tokens whose state takes
// stateBytes and which carries extra (nil: nothing), as llama-server's
// alloc does: nothing when an entry holds all of tokens already or the
// entry alone (state, tokens, extra) exceeds the budget (Skipped); else the
// entries that are prefixes of tokens are dropped (the new one holds them),
// and memory is found: spare memory it fits, else new memory, for which
// spare memory and then the least recently used entries go until it fits
// the budget. A failed allocation is a save failure. nil: no save.
func (c *Cache) BeginWith(tokens []int32, stateBytes int64, extra Extra) (*Save, error) {
	if c == nil || len(tokens) == 0 {
		return nil, nil
	}
	start := time.Now()
	fresh := c.alloc.Size(roomFor(stateBytes))
	beside := tokenBytes * int64(len(tokens)) // what the entry holds beside its state
	if extra != nil {
		beside += extra.Bytes()
	}
	c.mu.Lock()
	for _, e := range c.entries {
		if iface.CommonPrefix(e.Tokens, tokens) == len(tokens) {
			c.stats.Skipped++
			c.mu.Unlock()
			return nil, nil
		}
	}
	if c.budget > 0 && c.alloc.Size(stateBytes)+beside > c.budget {
		c.stats.Skipped++
		c.mu.Unlock()
		return nil, nil
	}
	var free []Memory
	kept := c.entries[:0]
	for _, e := range c.entries {
		if iface.CommonPrefix(e.Tokens, tokens) == len(e.Tokens) {
			c.tokens -= len(e.Tokens)
			free = append(free, c.retireLocked(e)...)
			continue
		}
		kept = append(kept, e)
	}
	clear(c.entries[len(kept):])
	c.entries = kept
	mem := c.takeSpareLocked(stateBytes, fresh) // counted in held already
	need := beside
	if mem == nil {
		need += fresh
	}
	// Memory on its way to be freed stays counted until it is (release), so
	// that what is allocated never exceeds the budget; it makes room here.
	more, releasing := c.makeRoomLocked(need, sizeOf(free))
	free = append(free, more...)
	if c.budget > 0 && c.held-releasing+need > c.budget { // restores and saves under way hold the rest
		if mem != nil {
			c.spare = append(c.spare, mem)
		}
		c.stats.Skipped++
		c.giveUpLocked(free)
		c.mu.Unlock()
		c.release(free)
		return nil, nil
	}
	c.held += need
	held := need
	if mem != nil {
		held += int64(len(mem.Bytes()))
	}
	c.giveUpLocked(free)
	c.mu.Unlock()
	c.release(free)
	if mem == nil {
		var err error
		mem, err = c.alloc.Alloc(roomFor(stateBytes))
		if err == nil && (int64(len(mem.Bytes())) < stateBytes || int64(len(mem.Bytes())) > fresh) {
			err = fmt.Errorf("an allocation of %d bytes gave %d", fresh, len(mem.Bytes()))
			mem.Free()
		}
		if err != nil {
			c.mu.Lock()
			c.held -= held
			c.stats.SaveFailures++
			c.mu.Unlock()
			return nil, fmt.Errorf("prompt cache: memory for a %d-byte state: %w", stateBytes, err)
		}
	}
	return &Save{c: c, start: start, entry: &Entry{Tokens: append([]int32(nil), tokens...),
		StateBytes: stateBytes, Mem: mem, Extra: extra, held: held}}, nil
}

// takeSpareLocked takes the smallest spare memory a state of n bytes fits,
// none more than twice fresh (what new memory for it would be): a large
// spare left for a small state would hold its bytes for nothing. c.mu is
// held; the memory stays counted in held.
func (c *Cache) takeSpareLocked(n, fresh int64) Memory {
	best := -1
	for i, m := range c.spare {
		size := int64(len(m.Bytes()))
		if size >= n && size <= 2*fresh && (best < 0 || size < int64(len(c.spare[best].Bytes()))) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	m := c.spare[best]
	c.spare = slices.Delete(c.spare, best, best+1)
	return m
}

// makeRoomLocked gives up spare memory, the largest first, then evicts the
// least recently used entries, until need more bytes fit the budget beside
// the releasing bytes already on their way out; it returns the memory to
// release once c.mu is let go and the bytes on their way out then. c.mu is
// held.
func (c *Cache) makeRoomLocked(need, releasing int64) ([]Memory, int64) {
	var free []Memory
	for c.budget > 0 && c.held-releasing+need > c.budget && len(c.spare) > 0 {
		i := 0
		for j, m := range c.spare {
			if len(m.Bytes()) > len(c.spare[i].Bytes()) {
				i = j
			}
		}
		m := c.spare[i]
		c.spare = slices.Delete(c.spare, i, i+1)
		releasing += int64(len(m.Bytes()))
		free = append(free, m)
	}
	for c.budget > 0 && c.held-releasing+need > c.budget && len(c.entries) > 0 {
		e := c.evictOldestLocked()
		releasing += int64(len(e.Mem.Bytes())) // evicted to make room: freed, not kept
		free = append(free, e.Mem)
	}
	return free, releasing
}

// giveUpLocked marks memory as on its way out: it stays in held, which
// saves check the budget against, until release frees it, so that what is
// allocated never exceeds the budget even while another save allocates;
// Stats leaves it out. c.mu is held.
func (c *Cache) giveUpLocked(ms []Memory) { c.releasing += sizeOf(ms) }

// release frees memory given up under c.mu, then uncounts it.
func (c *Cache) release(ms []Memory) {
	if len(ms) == 0 {
		return
	}
	n := sizeOf(ms)
	for _, m := range ms {
		m.Free()
	}
	c.mu.Lock()
	c.held -= n
	c.releasing -= n
	c.mu.Unlock()
}

// sizeOf is the bytes of ms.
func sizeOf(ms []Memory) int64 {
	var n int64
	for _, m := range ms {
		n += int64(len(m.Bytes()))
	}
	return n
}

// Commit makes the save an entry, the most recently used, once the state
// is in Mem: wrote is the state's bytes written, which must be what Begin
// was told, posMin the first position the state holds (Entry.PosMin). With
// no limit in bytes, the least recently used entries then go while the
// entries hold more than the token limit.
func (s *Save) Commit(wrote int64, posMin int) error {
	if wrote != s.entry.StateBytes {
		s.fail()
		return fmt.Errorf("prompt cache: %d state bytes saved, %d announced", wrote, s.entry.StateBytes)
	}
	done := false
	s.once.Do(func() {
		done = true
		c := s.c
		s.entry.PosMin = posMin
		c.mu.Lock()
		c.entries = append(c.entries, s.entry)
		c.tokens += len(s.entry.Tokens)
		c.stats.Saves++
		c.stats.SaveBytes += uint64(wrote)
		c.stats.SaveSeconds += time.Since(s.start).Seconds()
		var free []Memory
		for c.budget < 0 && c.tokenLimit > 0 && c.tokens > c.tokenLimit && len(c.entries) > 0 {
			free = append(free, c.retireLocked(c.evictOldestLocked())...)
		}
		c.giveUpLocked(free)
		c.mu.Unlock()
		c.release(free)
	})
	if !done {
		return fmt.Errorf("prompt cache: a save committed twice or after Abort")
	}
	return nil
}

// Abort drops a save that failed: its memory is kept for another or freed.
func (s *Save) Abort() { s.fail() }

func (s *Save) fail() {
	s.once.Do(func() {
		c := s.c
		c.mu.Lock()
		c.stats.SaveFailures++
		free := c.retireLocked(s.entry)
		c.giveUpLocked(free)
		c.mu.Unlock()
		c.release(free)
	})
}

// Restore is an entry taken out of the cache to be restored into a slot;
// its memory stays counted until Done.
type Restore struct {
	c     *Cache
	Entry *Entry
	start time.Time
	once  sync.Once
}

// Take chooses the entry to start prompt from, as llama-server's load
// does, and takes it out of the cache (the slot holds it from then on):
// the slot's own sequence seq (first position posMin) scores the share of
// itself the prompt keeps (f_keep, -1 for an empty slot) and the share of
// the prompt it serves (f_sim); an entry is chosen over it, and over every
// entry before it, only where both of its shares are higher and it keeps
// at least MinKeep of itself. Shares count the common prefix where rule
// says the sequence serves the prompt at all, else nothing. A choice is a
// hit, none a miss. nil: start from the slot.
func (c *Cache) Take(rule Rule, seq []int32, posMin int, prompt []int32) *Restore {
	if c == nil || len(prompt) == 0 {
		return nil
	}
	base := rule.shared(seq, posMin, prompt)
	keepBest, simBest := -1.0, float64(base)/float64(len(prompt))
	if len(seq) > 0 {
		keepBest = float64(base) / float64(len(seq))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	best := -1
	for i, e := range c.entries {
		n := float64(rule.sharedEntry(e, prompt))
		keep, sim := n/float64(len(e.Tokens)), n/float64(len(prompt))
		if keep < MinKeep {
			continue
		}
		if keepBest < keep && simBest < sim {
			keepBest, simBest, best = keep, sim, i
		}
	}
	if best < 0 {
		c.stats.Misses++
		return nil
	}
	c.stats.Hits++
	e := c.entries[best]
	c.entries = slices.Delete(c.entries, best, best+1) // clears the vacated end, so the entry is not kept alive
	c.tokens -= len(e.Tokens)
	return &Restore{c: c, Entry: e, start: time.Now()}
}

// Done ends a taken entry's restore, counting a restore of its state bytes
// or a restore failure; its memory is kept for another save or freed.
func (r *Restore) Done(restored bool) {
	r.once.Do(func() {
		c := r.c
		c.mu.Lock()
		if restored {
			c.stats.Restores++
			c.stats.RestoreBytes += uint64(r.Entry.StateBytes)
			c.stats.RestoreSeconds += time.Since(r.start).Seconds()
		} else {
			c.stats.RestoreFailures++
		}
		free := c.retireLocked(r.Entry)
		c.giveUpLocked(free)
		c.mu.Unlock()
		c.release(free)
	})
}

// retireLocked uncounts e's tokens (out of c.entries, or never in them),
// keeping its memory as spare while there is room for it, and returns what
// is to be released once c.mu is let go. c.mu is held.
func (c *Cache) retireLocked(e *Entry) []Memory {
	c.held -= e.held - int64(len(e.Mem.Bytes()))
	if len(c.spare) < maxSpare {
		c.spare = append(c.spare, e.Mem)
		return nil
	}
	return []Memory{e.Mem}
}

// evictOldestLocked takes out the least recently used entry, counted as an
// eviction, its tokens uncounted (its bytes are its caller's to retire or
// free); c.mu is held and there is one.
func (c *Cache) evictOldestLocked() *Entry {
	e := c.entries[0]
	c.entries[0] = nil
	c.entries = c.entries[1:]
	c.stats.Evictions++
	c.tokens -= len(e.Tokens)
	c.held -= e.held - int64(len(e.Mem.Bytes()))
	e.held = int64(len(e.Mem.Bytes()))
	return e
}

// Stats is the cache's figures now; nil for no cache.
func (c *Cache) Stats() *iface.PromptCacheStats {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.BudgetBytes, s.Bytes, s.Entries, s.Tokens = c.budget, c.held-c.releasing, int64(len(c.entries)), int64(c.tokens)
	return &s
}

// Drop frees every entry and the spare memory (the backend's sequences
// are gone: a model reload). Saves and restores under way keep theirs
// until they end.
func (c *Cache) Drop() {
	if c == nil {
		return
	}
	c.mu.Lock()
	var free []Memory
	for _, e := range c.entries {
		c.held -= e.held - int64(len(e.Mem.Bytes()))
		free = append(free, e.Mem)
	}
	free = append(free, c.spare...)
	c.entries, c.spare, c.tokens = nil, nil, 0
	c.giveUpLocked(free)
	c.mu.Unlock()
	c.release(free)
}
