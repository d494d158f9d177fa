package host

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
	owner     uint64 // the holding lease's generation; 0 when idle
	nPast     int
	stateSize int64
	holder    SlotHolder // who put the slot's sequence there
	lastUse   time.Time  // when the last operation on the slot ended
	// source is where the slot's state came from, as the blob that restored
	// it named it (STATE_PUT); nil for a sequence evaluated here.
	source *StateSource
}

// SlotHolder says which side put a slot's sequence there: a Hydra RPC
// client's sequence (PREFILL, STATE_PUT, DECODE) is never evicted by the
// HTTP side, which may reuse only empty slots and its own.
type SlotHolder int

const (
	HolderNone SlotHolder = iota // empty
	HolderRPC
	HolderHTTP
)

func (h SlotHolder) String() string {
	return [...]string{"none", "rpc", "http"}[h]
}

// errSlotsSuspended refuses acquisitions while a backend is being swapped.
var errSlotsSuspended = errors.New("backend is being replaced; retry")

// slotTable serialises operations per slot: one at a time, others get BUSY.
// Every acquisition gets a generation of its own, never reused, and only the
// lease holding that generation may release or update the slot: a request
// that outlives a reset of the table (a backend restart) cannot free or
// overwrite a slot that a newer request holds.
type slotTable struct {
	mu        sync.Mutex
	slots     []slotState
	gen       uint64        // the last generation handed out
	suspended bool          // between suspend and reset: acquisitions fail
	freed     chan struct{} // closed and replaced whenever a slot is released
	// draining counts whole-engine operations waiting for every slot
	// (holdAll); acquisitions fail meanwhile, so the wait ends.
	draining int
	epoch    uint64 // counts resets and suspends: a hold of every slot taken before one is void
}

func newSlotTable(n int) *slotTable {
	return &slotTable{slots: make([]slotState, n), freed: make(chan struct{})}
}

// notifyLocked wakes the waiters for a free slot; t.mu is held.
func (t *slotTable) notifyLocked() {
	close(t.freed)
	t.freed = make(chan struct{})
}

// reset empties the table for n slots (a backend was (re)loaded) and lets
// acquisitions in again. Every lease taken before it is void.
func (t *slotTable) reset(n int) {
	t.mu.Lock()
	t.epoch++
	t.slots = make([]slotState, n)
	t.suspended = false
	t.notifyLocked()
	t.mu.Unlock()
}

// suspend empties every slot at once and refuses acquisitions until the next
// reset. Every lease taken before it is void.
func (t *slotTable) suspend() {
	t.mu.Lock()
	t.epoch++
	t.slots = make([]slotState, len(t.slots))
	t.suspended = true
	t.mu.Unlock()
}

// suspendIfIdle suspends the table (as suspend) when no slot is held, and
// reports whether it did.
func (t *slotTable) suspendIfIdle() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, st := range t.slots {
		if st.use != slotIdle {
			return false
		}
	}
	t.epoch++
	t.slots = make([]slotState, len(t.slots))
	t.suspended = true
	return true
}

// errDraining says why a slot is refused while a whole-engine operation
// waits for every slot or runs.
const errDraining = "a whole-engine operation (SWAP_QUANT) holds every slot"

// holdAll waits until no slot is held, refusing new acquisitions from the
// moment it is called, then holds every slot until the function it returns
// is called: a whole-engine operation runs with nothing else at work, and
// work that arrives meanwhile waits for it (a completion in its queue) or is
// told BUSY (an RPC op), instead of failing the operation. ctx ending first
// is ErrBusy naming the slots still at work.
func (t *slotTable) holdAll(ctx context.Context) (release func(), err error) {
	t.mu.Lock()
	t.draining++
	for {
		busy := []int{}
		for i, st := range t.slots {
			if st.use != slotIdle {
				busy = append(busy, i)
			}
		}
		if len(busy) == 0 && !t.suspended {
			break
		}
		freed := t.freed
		t.mu.Unlock()
		select {
		case <-freed:
			t.mu.Lock()
		case <-ctx.Done():
			t.mu.Lock()
			t.draining--
			t.notifyLocked()
			t.mu.Unlock()
			return nil, fmt.Errorf("%w: slots %v still at work when the wait for every slot ended (%v)", iface.ErrBusy, busy, context.Cause(ctx))
		}
	}
	epoch := t.epoch
	for i := range t.slots {
		t.slots[i].use = slotProcessing
	}
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			t.draining--
			if t.epoch == epoch { // else a reset or suspend replaced the slots meanwhile
				for i := range t.slots {
					t.slots[i].use = slotIdle
				}
			}
			t.notifyLocked()
		})
	}, nil
}

// slotLease is one acquisition of a slot. Its release acts once, and only
// while the slot is still held by this lease.
type slotLease struct {
	t      *slotTable
	slot   int
	gen    uint64
	holder SlotHolder // who the sequence left behind belongs to
	prev   SlotHolder // who put the sequence the slot held when taken (HolderNone: empty)
	// source is the slot's state's source once released with an info:
	// the restoring blob's (STATE_PUT), else none, unless keepSource (a
	// DECODE, which continues the sequence there) keeps the slot's.
	source     *StateSource
	keepSource bool
	once       sync.Once
}

// acquire marks slot as used, failing with ErrNoSlot or ErrBusy.
func (t *slotTable) acquire(slot int, use slotUse) (*slotLease, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot < 0 || slot >= len(t.slots) {
		return nil, iface.ErrNoSlot
	}
	if t.suspended {
		return nil, errSlotsSuspended
	}
	if t.draining > 0 {
		return nil, fmt.Errorf("%w: slot %d: %s", iface.ErrBusy, slot, errDraining)
	}
	if t.slots[slot].use != slotIdle {
		what := "processing"
		if t.slots[slot].use == slotTransferring {
			what = "transferring"
		}
		return nil, fmt.Errorf("%w: slot %d is %s", iface.ErrBusy, slot, what)
	}
	return t.take(slot, use), nil
}

// take marks slot as held by a new lease; t.mu is held.
func (t *slotTable) take(slot int, use slotUse) *slotLease {
	t.gen++
	st := &t.slots[slot]
	prev := st.holder
	if st.nPast == 0 {
		prev = HolderNone
	}
	st.use, st.owner = use, t.gen
	return &slotLease{t: t, slot: slot, gen: t.gen, holder: HolderRPC, prev: prev}
}

// heldLocked reports whether l still holds its slot; t.mu is held.
func (l *slotLease) heldLocked() bool {
	return l.slot < len(l.t.slots) && l.t.slots[l.slot].owner == l.gen
}

// held reports whether l still holds its slot (no reset came in between).
func (l *slotLease) held() bool {
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	return l.heldLocked()
}

// release frees the slot, on the first call only and only if l still holds
// it; a non-nil info refreshes the cached sequence figures.
func (l *slotLease) release(info *iface.SlotInfo) {
	l.once.Do(func() {
		l.t.mu.Lock()
		defer l.t.mu.Unlock()
		if !l.heldLocked() {
			return // the table was reset under us (backend restart)
		}
		st := &l.t.slots[l.slot]
		st.use, st.owner, st.lastUse = slotIdle, 0, time.Now()
		if info != nil {
			st.nPast, st.stateSize = info.NPast, info.StateSize
			st.holder = HolderNone
			if info.NPast > 0 {
				st.holder = l.holder
			}
			if !l.keepSource || info.NPast == 0 {
				st.source = l.source
			}
		}
		l.t.notifyLocked()
	})
}

// update refreshes the cached figures of the slot l holds.
func (l *slotLease) update(info iface.SlotInfo) {
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	if l.heldLocked() {
		l.t.slots[l.slot].nPast, l.t.slots[l.slot].stateSize = info.NPast, info.StateSize
	}
}

// update refreshes the cached figures of an idle slot (the server's refresh
// after a load); a held slot's figures are its holder's to set. A sequence
// the backend held before this server (none after a load or a restart; a
// backend reused by a test) has no known holder: HTTP takes it last.
func (t *slotTable) update(slot int, info iface.SlotInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slot >= 0 && slot < len(t.slots) && t.slots[slot].use == slotIdle {
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

// errBackendReplaced fails a request whose backend was swapped between the
// moment it took its slot and the moment it asked for the backend.
var errBackendReplaced = errors.New("backend was replaced while the request waited; retry")

// backendFor returns the backend a request holding l may use: the one in
// place when it took its slot. Reading the backend and then checking the
// lease is enough, because the table is suspended (voiding l) before any
// backend is swapped in (SuspendSlots).
func (s *Server) backendFor(l *slotLease) (iface.Backend, iface.BackendInfo, error) {
	b, info := s.Backend()
	if !l.held() {
		return nil, info, errBackendReplaced
	}
	return b, info, nil
}

// SuspendSlots empties every slot at once and refuses new acquisitions until
// the next SetBackend. A supervisor calls it as soon as a backend is lost and
// before swapping one in: STATE_META and the HTTP slots then report every
// slot empty, requests that took a slot before cannot release or update it
// in the new table, and none of them can reach the new backend.
func (s *Server) SuspendSlots() { s.slots.suspend() }

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
	Holder       SlotHolder
	LastUse      time.Time // when the last operation on it ended (zero: none yet)
}

// SlotFreed is closed the next time a slot is released (or the backend is
// replaced): a front end waiting for a slot waits on it, then tries again.
func (s *Server) SlotFreed() <-chan struct{} {
	s.slots.mu.Lock()
	defer s.slots.mu.Unlock()
	return s.slots.freed
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
		NPast: st.nPast, StateSize: st.stateSize, Holder: st.holder, LastUse: st.lastUse}
}

// SlotLease is a front end's hold on a slot, taken as processing with
// TakeSlot or TakeIdleSlot. Release gives it back; a lease outlived by a
// backend restart releases nothing, so it can never free a slot that a
// request to the new backend holds.
type SlotLease struct {
	s *Server
	l *slotLease
}

// Slot is the slot held.
func (sl *SlotLease) Slot() int { return sl.l.slot }

// Found says who put the sequence the slot held when it was taken
// (HolderNone: it was empty). A completion lets the backend save only an
// earlier completion's sequence into its prompt cache.
func (sl *SlotLease) Found() SlotHolder { return sl.l.prev }

// Backend returns the backend the holder may use, or an error once the
// backend was replaced since the slot was taken.
func (sl *SlotLease) Backend() (iface.Backend, iface.BackendInfo, error) {
	return sl.s.backendFor(sl.l)
}

// Release gives the slot back, first refreshing its cached n_past and state
// size from the backend (they stay as they were if the backend cannot say),
// and returns what the backend said of the slot (ok false: nothing). Only
// the first call acts.
func (sl *SlotLease) Release() (iface.SlotInfo, bool) {
	var after *iface.SlotInfo
	if b, _, err := sl.Backend(); err == nil {
		if si, err := b.Slot(sl.s.ctx, sl.l.slot); err == nil {
			after = &si
		}
	}
	sl.l.release(after)
	if after == nil {
		return iface.SlotInfo{}, false
	}
	return *after, true
}

// TakeSlot takes slot as processing; it fails with iface.ErrNoSlot or
// iface.ErrBusy (or an error while the backend is being replaced).
func (s *Server) TakeSlot(slot int) (*SlotLease, error) {
	l, err := s.slots.acquire(slot, slotProcessing)
	if err != nil {
		return nil, err
	}
	l.holder = HolderHTTP
	return &SlotLease{s: s, l: l}, nil
}

// TakeIdleSlot takes the idle slot that rank scores lowest (ties: the lowest
// slot id) as processing, among those rank accepts (ok), or fails with
// iface.ErrBusy when none is idle and accepted. rank sees every slot's view
// (all[slot] is the one it scores) and is called with the table locked: it
// must not call back into s.
func (s *Server) TakeIdleSlot(rank func(slot int, all []SlotView) (score int64, ok bool)) (*SlotLease, error) {
	t := s.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.suspended {
		return nil, errSlotsSuspended
	}
	if t.draining > 0 {
		return nil, fmt.Errorf("%w: %s", iface.ErrBusy, errDraining)
	}
	all := make([]SlotView, len(t.slots))
	for i, st := range t.slots {
		all[i] = st.view()
	}
	best, bestRank := -1, int64(0)
	for i, st := range t.slots {
		if st.use != slotIdle {
			continue
		}
		if r, ok := rank(i, all); ok && (best < 0 || r < bestRank) {
			best, bestRank = i, r
		}
	}
	if best < 0 {
		return nil, fmt.Errorf("%w: no slot is free for it (%d slots)", iface.ErrBusy, len(t.slots))
	}
	l := t.take(best, slotProcessing)
	l.holder = HolderHTTP
	return &SlotLease{s: s, l: l}, nil
}

// ParseSlotKey reads a slot id as the Hydra RPC keys are read (the C++
// engine's std::stoi), for front ends that name slots the same way.
func ParseSlotKey(key string) (int, error) { return parseSlotKey(key) }
