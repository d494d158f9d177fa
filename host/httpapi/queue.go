package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
)

// A completion that finds no slot for it waits in a queue, as with Ollama
// and llama-server, instead of being refused: slots are handed to the
// waiters in arrival order as they free up. Only a full queue is refused
// (503 with Retry-After). A slot holding a sequence a Hydra RPC client put
// there is never given to a completion that did not name it (id_slot).

// queuePerSlot is how many completions may wait per slot: enough for the
// bursts of a coordinator's fan-out, few enough that a waiter is served in
// some tens of completions.
const queuePerSlot = 8

// errQueueFull refuses a completion when the queue is full.
var errQueueFull = errors.New("all slots are busy and the queue of waiting requests is full")

// slotQueue is the completions waiting for a slot.
type slotQueue struct {
	s   *host.Server
	max int

	mu      sync.Mutex
	waiters []*waiter
	serving bool // a goroutine hands freed slots to the waiters
}

type waiter struct {
	pick func() (*host.SlotLease, error) // tries to take the slot it needs; ErrBusy: none now
	got  chan takeResult                 // 1-buffered
}

type takeResult struct {
	lease *host.SlotLease
	err   error
}

func newSlotQueue(s *host.Server, nSlots int) *slotQueue {
	return &slotQueue{s: s, max: queuePerSlot * max(nSlots, 1)}
}

// take returns a slot from pick: at once when pick finds one after the
// waiters ahead had theirs, else after waiting its turn; ctx ending gives up
// the turn. A waiter whose slot is not free does not hold back one whose is.
// The wait is a span of its own (tracing.Queue).
func (q *slotQueue) take(ctx context.Context, pick func() (*host.SlotLease, error)) (l *host.SlotLease, err error) {
	var span tracing.Queue
	if tracing.Recording(ctx) {
		start := time.Now()
		defer func() {
			span.Slot = -1
			if l != nil {
				span.Slot = l.Slot()
			}
			span.Record(ctx, start, time.Now(), err)
		}()
	}
	q.mu.Lock()
	q.grantLocked()
	if l, err = pick(); !errors.Is(err, iface.ErrBusy) {
		q.mu.Unlock()
		return l, err
	}
	span.Ahead, span.Waited = len(q.waiters), true
	if len(q.waiters) >= q.max {
		q.mu.Unlock()
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: "unavailable_error", Code: "queue_full",
			Msg: fmt.Sprintf("%v (%d waiting)", errQueueFull, q.max)}
	}
	w := &waiter{pick: pick, got: make(chan takeResult, 1)}
	q.waiters = append(q.waiters, w)
	if !q.serving {
		q.serving = true
		go q.serve()
	}
	q.mu.Unlock()
	select {
	case r := <-w.got:
		return r.lease, r.err
	case <-ctx.Done():
		q.leave(w)
		return nil, ctx.Err()
	}
}

// leave takes w out of the queue; a slot it was handed meanwhile goes back.
func (q *slotQueue) leave(w *waiter) {
	q.mu.Lock()
	q.waiters = slices.DeleteFunc(q.waiters, func(x *waiter) bool { return x == w })
	q.mu.Unlock()
	select {
	case r := <-w.got:
		if r.lease != nil {
			r.lease.Release()
		}
	default:
	}
}

// serve hands slots to the waiters, in order, each time one frees up, until
// no one waits.
func (q *slotQueue) serve() {
	for {
		freed := q.s.SlotFreed() // before trying: a release after it closes it
		q.mu.Lock()
		q.grantLocked()
		if len(q.waiters) == 0 {
			q.serving = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		<-freed
	}
}

// grantLocked gives each waiter, in order, the slot it can have now; q.mu
// is held.
func (q *slotQueue) grantLocked() {
	q.waiters = slices.DeleteFunc(q.waiters, func(w *waiter) bool {
		l, err := w.pick()
		if errors.Is(err, iface.ErrBusy) {
			return false
		}
		w.got <- takeResult{l, err}
		return true
	})
}

// waiting is how many completions wait for a slot.
func (q *slotQueue) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}
