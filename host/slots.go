package host

import (
	"fmt"
	"sync"

	"github.com/hydra-engine/hydra-engine/iface"
)

// slotUse says what holds a slot.
type slotUse int

const (
	slotIdle slotUse = iota
	slotProcessing
	slotTransferring
)

// slotState is the host's view of a slot. n_past and state size are cached
// after every operation so STATE_META answers while the slot is busy without
// calling into the backend concurrently with the operation that holds it.
type slotState struct {
	use       slotUse
	nPast     int
	stateSize int64
}

// slotTable serialises operations per slot: one at a time, others get BUSY.
type slotTable struct {
	mu    sync.Mutex
	slots []slotState
}

func newSlotTable(n int) *slotTable { return &slotTable{slots: make([]slotState, n)} }

// reset empties the table for n slots (a backend was (re)loaded).
func (t *slotTable) reset(n int) {
	t.mu.Lock()
	t.slots = make([]slotState, n)
	t.mu.Unlock()
}

func (t *slotTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.slots)
}

// acquire marks slot as used, failing with ErrNoSlot or ErrBusy.
func (t *slotTable) acquire(slot int, use slotUse) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot < 0 || slot >= len(t.slots) {
		return iface.ErrNoSlot
	}
	if t.slots[slot].use != slotIdle {
		what := "processing"
		if t.slots[slot].use == slotTransferring {
			what = "transferring"
		}
		return fmt.Errorf("%w: slot %d is %s", iface.ErrBusy, slot, what)
	}
	t.slots[slot].use = use
	return nil
}

// release frees slot; a non-nil info refreshes the cached sequence figures.
func (t *slotTable) release(slot int, info *iface.SlotInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot < 0 || slot >= len(t.slots) {
		return // the table was reset under us (backend restart)
	}
	t.slots[slot].use = slotIdle
	if info != nil {
		t.slots[slot].nPast, t.slots[slot].stateSize = info.NPast, info.StateSize
	}
}

// releaseOnce returns a release of slot that acts only on its first call, so
// a handler can free the slot early and still defer the release.
func (t *slotTable) releaseOnce(slot int) func(*iface.SlotInfo) {
	var once sync.Once
	return func(info *iface.SlotInfo) { once.Do(func() { t.release(slot, info) }) }
}

// update refreshes the cached figures of a held slot.
func (t *slotTable) update(slot int, info iface.SlotInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot >= 0 && slot < len(t.slots) {
		t.slots[slot].nPast, t.slots[slot].stateSize = info.NPast, info.StateSize
	}
}

// get returns a copy of the slot's state.
func (t *slotTable) get(slot int) (slotState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot < 0 || slot >= len(t.slots) {
		return slotState{}, iface.ErrNoSlot
	}
	return t.slots[slot], nil
}

// busyCount counts slots in use.
func (t *slotTable) busyCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, s := range t.slots {
		if s.use != slotIdle {
			n++
		}
	}
	return n
}
