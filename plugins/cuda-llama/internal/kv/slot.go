package kv

import (
	"fmt"
	"sync"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Slot is one sequence. mu guards the fields and is held briefly, so a
// slot's report answers while an operation runs; busy turns a second
// concurrent operation on the slot into ErrBusy should a caller break the
// one-op-per-slot rule. tokens and logits describe what the memory holds:
// the logits are the next-token distribution after the last token, nil when
// the slot is empty or a restore left them to the first decode.
type Slot struct {
	mu        sync.Mutex
	busy      bool
	tokens    []int32 // append-only below len: snapshots share the array
	logits    []float32
	stateSize int64
	// Claim is the cells an operation under way holds for the slot beyond
	// its tokens: a prompt's rest, a decode's next token, a restore's cells.
	// It is changed under the context's lock, which every Cells method
	// needs too.
	Claim int
}

// NewSlot is an empty slot whose empty state takes size bytes.
func NewSlot(size int64) *Slot { return &Slot{stateSize: size} }

// Acquire marks slot i busy, or says it is.
func (s *Slot) Acquire(i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy {
		return fmt.Errorf("%w: slot %d", iface.ErrBusy, i)
	}
	s.busy = true
	return nil
}

// Release ends the operation Acquire began.
func (s *Slot) Release() {
	s.mu.Lock()
	s.busy = false
	s.mu.Unlock()
}

// Snapshot is the slot's tokens, logits and state size at once.
func (s *Slot) Snapshot() ([]int32, []float32, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[:len(s.tokens):len(s.tokens)], s.logits, s.stateSize
}

// Set replaces what the slot holds.
func (s *Slot) Set(tokens []int32, logits []float32, size int64) {
	s.mu.Lock()
	s.tokens, s.logits, s.stateSize = tokens, logits, size
	s.mu.Unlock()
}

// Seq is the slot's tokens, capped so that appends cannot clobber them.
func (s *Slot) Seq() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[:len(s.tokens):len(s.tokens)]
}

// Append adds evaluated tokens; the logits no longer follow the last token
// until the caller sets them.
func (s *Slot) Append(t []int32) {
	s.mu.Lock()
	s.tokens = append(s.tokens, t...)
	s.mu.Unlock()
}

// Truncate keeps the first n tokens; the logits are dropped (recomputed by
// the next decode).
func (s *Slot) Truncate(n int) {
	s.mu.Lock()
	s.tokens, s.logits = s.tokens[:n:n], nil
	s.mu.Unlock()
}

// SetLogits sets the logits after the last token.
func (s *Slot) SetLogits(l []float32) {
	s.mu.Lock()
	s.logits = l
	s.mu.Unlock()
}

// Logits is the logits after the last token; nil where unknown.
func (s *Slot) Logits() []float32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logits
}

// StateSize is the bytes of the slot's state as last measured.
func (s *Slot) StateSize() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stateSize
}

// SetStateSize records the slot's state size after it changed.
func (s *Slot) SetStateSize(n int64) {
	s.mu.Lock()
	s.stateSize = n
	s.mu.Unlock()
}

// held is the cells the slot holds and claims.
func (s *Slot) held() int { return len(s.Seq()) + s.Claim }
