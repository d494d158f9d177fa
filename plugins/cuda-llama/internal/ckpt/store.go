package ckpt

import (
	"slices"
	"sync"
)

// Store is every slot's checkpoints under one byte budget. Its methods are
// safe for concurrent use; the plugin calls the changing ones under its
// context lock, and the counters are read from anywhere.
type Store struct {
	rules  Rules
	budget int64 // bytes; < 0: none

	mu     sync.Mutex
	slots  []List
	bytes  int64
	serial uint64 // orders checkpoints by age across slots
	age    map[*Checkpoint]uint64
	stats  Stats
}

// Stats are the store's counters, for /metrics and /slots.
type Stats struct {
	Held        int   // checkpoints held now
	Bytes       int64 // their host memory
	Taken       uint64
	Restored    uint64
	Dropped     uint64 // by the count, the spacing or the budget
	TokensSaved uint64 // prompt tokens restores spared evaluating
	// OverBudget counts checkpoints not taken: larger than the whole budget.
	OverBudget uint64
}

// NewStore keeps checkpoints for n slots by the rules, within budget bytes
// (< 0: no byte limit, only the count per slot).
func NewStore(r Rules, n int, budget int64) *Store {
	return &Store{rules: r, budget: budget, slots: make([]List, n), age: map[*Checkpoint]uint64{}}
}

// Rules are the store's rules.
func (s *Store) Rules() Rules { return s.rules }

// Budget is the byte budget; < 0: none.
func (s *Store) Budget() int64 { return s.budget }

// Enabled reports whether checkpoints are taken at all.
func (s *Store) Enabled() bool { return s != nil && s.rules.Max > 0 }

// Newest is the NTokens of slot i's newest checkpoint; -1 for none.
func (s *Store) Newest(i int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[i].Newest()
}

// Add keeps c, taken from slot i's memory, as its newest checkpoint,
// dropping what the rules and the budget say (the oldest checkpoints of any
// slot first: dropping one never touches a slot's sequence). False when c
// alone exceeds the budget.
func (s *Store) Add(i int, c *Checkpoint) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.keepLocked(i, c) {
		return false
	}
	s.stats.Taken++
	return true
}

// Put keeps a checkpoint taken elsewhere as slot i's, as Add does, without
// counting it as taken: one a prompt cache entry or a STATE_PUT carried.
func (s *Store) Put(i int, c *Checkpoint) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keepLocked(i, c)
}

// keepLocked adds c to slot i's list and drops what the rules and the
// budget say; false where c alone exceeds the budget. Needs s.mu.
func (s *Store) keepLocked(i int, c *Checkpoint) bool {
	if s.budget >= 0 && c.Size() > s.budget {
		s.stats.OverBudget++
		return false
	}
	s.forget(s.slots[i].Add(s.rules, c))
	s.serial++
	s.age[c] = s.serial
	s.bytes += c.Size()
	for s.budget >= 0 && s.bytes > s.budget {
		s.dropOldest(c)
	}
	return true
}

// dropOldest drops the oldest checkpoint held other than keep. Needs s.mu.
func (s *Store) dropOldest(keep *Checkpoint) {
	var oldest *Checkpoint
	at := -1
	for i := range s.slots {
		for _, c := range s.slots[i].All() {
			if c != keep && (oldest == nil || s.age[c] < s.age[oldest]) {
				oldest, at = c, i
			}
		}
	}
	if oldest == nil {
		return
	}
	s.slots[at].Remove(oldest)
	s.forget([]*Checkpoint{oldest})
}

// forget accounts for checkpoints dropped. Needs s.mu.
func (s *Store) forget(cps []*Checkpoint) {
	for _, c := range cps {
		s.bytes -= c.Size()
		delete(s.age, c)
		s.stats.Dropped++
	}
}

// Find chooses where a prompt of n tokens resumes on slot i (Rules.Find)
// and drops the checkpoints that end past that point.
func (s *Store) Find(i, n, prefix, memMin int) Resume {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.rules.Find(s.slots[i].All(), n, prefix, memMin)
	for _, c := range s.slots[i].After(res.PosNext) {
		s.bytes -= c.Size()
		delete(s.age, c)
	}
	return res
}

// Serves is the tokens of a prompt of n tokens that slot i would keep
// through a checkpoint (Find), changing nothing; 0 for none.
func (s *Store) Serves(i, n, prefix, memMin int) int {
	if !s.Enabled() {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	res := s.rules.Find(s.slots[i].All(), n, prefix, memMin)
	if res.Restore == nil {
		return 0
	}
	return res.Keep
}

// Restored counts a restore that spared evaluating tokens.
func (s *Store) Restored(tokens int) {
	s.mu.Lock()
	s.stats.Restored++
	s.stats.TokensSaved += uint64(max(tokens, 0))
	s.mu.Unlock()
}

// CutTo drops slot i's checkpoints that hold position pos or later, but
// except: its sequence was cut to its first pos tokens, and what follows
// differs from what those checkpoints saw. A restored checkpoint of a
// sliding window (except) may hold position pos: its restore always cuts
// its last position. A nil store has none.
func (s *Store) CutTo(i, pos int, except *Checkpoint) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.slots[i].After(pos - 1) {
		if c == except {
			s.slots[i].cps = append(s.slots[i].cps, c) // the newest kept
			continue
		}
		s.bytes -= c.Size()
		delete(s.age, c)
	}
}

// Clear drops slot i's checkpoints: its sequence was emptied, replaced or
// moved. A nil store has none.
func (s *Store) Clear(i int) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.slots[i].Clear() {
		s.bytes -= c.Size()
		delete(s.age, c)
	}
}

// Slot is slot i's checkpoints held and their bytes.
func (s *Store) Slot(i int) (n int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[i].Len(), s.slots[i].Bytes()
}

// Stats are the counters now.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Bytes = s.bytes
	for i := range s.slots {
		st.Held += s.slots[i].Len()
	}
	return st
}

// All is slot i's checkpoints, oldest first, as they are now (a copy).
func (s *Store) All(i int) []*Checkpoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.slots[i].All())
}
