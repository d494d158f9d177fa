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

// The slot surface of HTTP and other front ends (host/httpapi): they take
// slots from the same table as the Hydra RPC ops, as processing, so the two
// never run on one slot at once.

// SlotView is the host's cached view of a slot: what holds it, and the
// sequence figures cached after its last operation.
type SlotView struct {
	Processing   bool // held by PREFILL, DECODE or a front end's completion
	Transferring bool // held by STATE_GET or STATE_PUT
	NPast        int
	StateSize    int64
}

// Slots returns a view of every slot, taken at one instant; it never waits
// for a busy slot.
func (s *Server) Slots() []SlotView {
	t := s.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]SlotView, len(t.slots))
	for i, st := range t.slots {
		out[i] = st.view()
	}
	return out
}

func (st slotState) view() SlotView {
	return SlotView{Processing: st.use == slotProcessing, Transferring: st.use == slotTransferring,
		NPast: st.nPast, StateSize: st.stateSize}
}

// AcquireSlot takes slot as processing; it fails with iface.ErrNoSlot or
// iface.ErrBusy. ReleaseSlot gives it back.
func (s *Server) AcquireSlot(slot int) error { return s.slots.acquire(slot, slotProcessing) }

// AcquireIdleSlot takes the idle slot that rank scores lowest (ties: the
// lowest slot id) as processing, or fails with iface.ErrBusy when none is
// idle. rank is called with the table locked: it must not call back into s.
func (s *Server) AcquireIdleSlot(rank func(slot int, v SlotView) int64) (int, error) {
	t := s.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	best, bestRank := -1, int64(0)
	for i, st := range t.slots {
		if st.use != slotIdle {
			continue
		}
		if r := rank(i, st.view()); best < 0 || r < bestRank {
			best, bestRank = i, r
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%w: all %d slots are busy", iface.ErrBusy, len(t.slots))
	}
	t.slots[best].use = slotProcessing
	return best, nil
}

// ReleaseSlot gives back a slot taken with AcquireSlot or AcquireIdleSlot,
// first refreshing its cached n_past and state size from the backend (they
// stay as they were if the backend cannot say).
func (s *Server) ReleaseSlot(slot int) {
	b, _ := s.Backend()
	var after *iface.SlotInfo
	if si, err := b.Slot(s.ctx, slot); err == nil {
		after = &si
	}
	s.slots.release(slot, after)
}

// ParseSlotKey reads a slot id as the Hydra RPC keys are read (the C++
// engine's std::stoi), for front ends that name slots the same way.
func ParseSlotKey(key string) (int, error) { return parseSlotKey(key) }
