package host

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// Request payloads read into memory (every op's but STATE_PUT's, which
// streams, and HTTP bodies) take their announced length from one budget of
// Config.PayloadBudget bytes before a byte is read, so what clients can make
// the engine buffer is bounded by configuration. Payloads of at most
// SmallPayload bytes, the size of a connection's own read buffer, are read
// without asking: their worst case is a fixed share per connection, and
// control requests keep being served while large ones fill the budget.
const (
	SmallPayload = 64 << 10
	// BudgetWait is how long a request waits for the budget before it is
	// refused as busy.
	BudgetWait = 5 * time.Second
)

// A share of the budget, 1/reserveFraction of it, is kept for payloads of at
// most ReservedPayload bytes (PREFILLs, chat bodies): uploads larger than
// that, however many trickle in at the minimum rate, never take the whole
// budget, so small requests are admitted beside them.
const (
	ReservedPayload = 1 << 20
	reserveFraction = 8
)

// ErrBudgetBusy: the payload budget stayed short for BudgetWait.
var ErrBudgetBusy = errors.New("engine busy: request payloads in memory fill the payload budget, retry later")

// ErrOverBudget: the payload is larger than the whole budget.
var ErrOverBudget = errors.New("payload exceeds the payload budget")

// After a burst the runtime keeps the freed heap for a while; once the
// budget drains after having been used beyond freeOSFraction of it, the
// memory is returned to the OS, at most once per freeOSInterval so a busy
// engine does not force a collection after every request.
const (
	freeOSFraction = 4 // a quarter of the budget
	freeOSInterval = 10 * time.Second
)

// payloadBudget counts the bytes of buffered request payloads.
type payloadBudget struct {
	size uint64

	mu      sync.Mutex
	used    uint64
	freed   chan struct{} // closed and replaced on every release
	high    bool          // used went beyond size/freeOSFraction since the last return
	lastRet time.Time
	pending bool // a return to the OS is scheduled
	freeOS  func()
	every   time.Duration // the least time between two returns
}

func newPayloadBudget(size uint64) *payloadBudget {
	if size == 0 {
		size = DefaultPayloadBudget
	}
	return &payloadBudget{size: size, freed: make(chan struct{}), freeOS: debug.FreeOSMemory, every: freeOSInterval}
}

// limit is how much of the budget payloads of n bytes may take together.
func (b *payloadBudget) limit(n uint64) uint64 {
	if n > ReservedPayload {
		return b.size - b.size/reserveFraction
	}
	return b.size
}

// acquire takes n bytes, waiting while the budget is short until ctx ends
// or stop closes (ErrBudgetBusy). n beyond what its size may take fails at
// once.
func (b *payloadBudget) acquire(ctx context.Context, stop <-chan struct{}, n uint64) error {
	limit := b.limit(n)
	if n > limit {
		return fmt.Errorf("%w: %d bytes, budget %d (of which payloads over %d bytes may take %d)", ErrOverBudget, n, b.size, ReservedPayload, limit)
	}
	for {
		b.mu.Lock()
		if b.used+n <= limit {
			b.used += n
			if b.used > b.size/freeOSFraction {
				b.high = true
			}
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ErrBudgetBusy
		case <-stop:
			return ErrBudgetBusy
		}
	}
}

// release gives n bytes back and wakes the waiters.
func (b *payloadBudget) release(n uint64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	if b.used == 0 && b.high && !b.pending {
		b.high, b.pending = false, true
		wait := max(b.every-time.Since(b.lastRet), 0)
		time.AfterFunc(wait, b.returnMemory)
	}
}

// returnMemory returns the freed heap to the OS. A burst that drains while
// it runs schedules the next return.
func (b *payloadBudget) returnMemory() {
	b.mu.Lock()
	b.lastRet, b.pending = time.Now(), false
	b.mu.Unlock()
	b.freeOS()
}

// inUse is the number of bytes taken.
func (b *payloadBudget) inUse() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// AdmitPayload takes n bytes of the payload budget for a payload about to be
// read into memory, waiting up to BudgetWait (or until ctx ends) while the
// budget is short, and returns the function that gives them back. Payloads
// of at most SmallPayload bytes are admitted at once. The error is
// ErrOverBudget when n exceeds the whole budget, ErrBudgetBusy when the
// wait ran out.
func (s *Server) AdmitPayload(ctx context.Context, n uint64) (release func(), err error) {
	if n <= SmallPayload {
		return func() {}, nil
	}
	b := s.budget
	ctx, cancel := context.WithTimeout(ctx, BudgetWait)
	defer cancel()
	if err := b.acquire(ctx, s.stopping, n); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { b.release(n) }) }, nil
}

// PayloadBudgetSize is the payload budget's size in bytes.
func (s *Server) PayloadBudgetSize() uint64 { return s.budget.size }

// PayloadBudgetInUse is the number of payload budget bytes taken now.
func (s *Server) PayloadBudgetInUse() uint64 { return s.budget.inUse() }
