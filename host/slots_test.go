package host

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// TestStaleLeaseCannotFreeNewHolder: a lease taken before the table was
// reset (a backend restart) neither frees nor updates the slot that a lease
// taken afterwards holds, and cannot reach the new backend.
func TestStaleLeaseCannotFreeNewHolder(t *testing.T) {
	s := NewServer(&stateBackend{}, iface.BackendInfo{NSlots: 2}, nil, Config{})
	old, err := s.slots.acquire(1, slotTransferring)
	if err != nil {
		t.Fatal(err)
	}
	s.SuspendSlots()
	if _, err := s.slots.acquire(1, slotProcessing); !errors.Is(err, errSlotsSuspended) {
		t.Fatalf("acquire while suspended: %v", err)
	}
	if _, _, err := s.backendFor(old); !errors.Is(err, errBackendReplaced) {
		t.Fatalf("a suspended lease reached the backend: %v", err)
	}
	s.SetBackend(&stateBackend{}, iface.BackendInfo{NSlots: 2})
	cur, err := s.slots.acquire(1, slotTransferring)
	if err != nil {
		t.Fatalf("slot 1 after the reset: %v", err)
	}
	old.update(iface.SlotInfo{NPast: 99})
	old.release(&iface.SlotInfo{NPast: 99})
	if st, _ := s.slots.get(1); st.use != slotTransferring || st.nPast == 99 {
		t.Fatalf("a stale lease changed the new holder's slot: %+v", st)
	}
	if _, err := s.slots.acquire(1, slotTransferring); !errors.Is(err, iface.ErrBusy) {
		t.Fatalf("second acquisition of a held slot: %v", err)
	}
	cur.release(&iface.SlotInfo{NPast: 3})
	cur.release(nil) // a second release is a no-op
	if st, _ := s.slots.get(1); st.use != slotIdle || st.nPast != 3 {
		t.Fatalf("after the holder's release: %+v", st)
	}
}

// TestSuspendEmptiesSlotsAtOnce: once a backend is lost every slot reads
// empty and idle, whatever it held or cached.
func TestSuspendEmptiesSlotsAtOnce(t *testing.T) {
	s := NewServer(&stateBackend{}, iface.BackendInfo{NSlots: 2}, nil, Config{})
	if _, err := s.TakeSlot(0); err != nil {
		t.Fatal(err)
	}
	if v := s.Slots(); v[1].NPast != 2 || !v[0].Processing {
		t.Fatalf("before: %+v", v)
	}
	s.SuspendSlots()
	for i, v := range s.Slots() {
		if v != (SlotView{}) {
			t.Errorf("slot %d after the suspend: %+v", i, v)
		}
	}
	if _, err := s.TakeIdleSlot(func(int, []SlotView) (int64, bool) { return 0, true }); !errors.Is(err, errSlotsSuspended) {
		t.Fatalf("TakeIdleSlot while suspended: %v", err)
	}
}

// downStub is a backend that is not there (DownBackend).
type downStub struct{ stateBackend }

func (downStub) Down() error { return errors.New("mock: backend is restarting after a crash") }

// TestInfoWhileBackendDown: INFO answers ERROR with the reason and no backend
// details while the backend is down, and the full description otherwise.
func TestInfoWhileBackendDown(t *testing.T) {
	info := iface.BackendInfo{Name: "mock", Version: "9", NSlots: 1, NCtx: 77,
		Model: iface.ModelIdentity{Alias: "m", Hash: "h"}}
	for _, tc := range []struct {
		b    iface.Backend
		want transport.Status
	}{{&stateBackend{}, transport.StatusOK}, {&downStub{}, transport.StatusError}} {
		s := NewServer(tc.b, info, nil, Config{})
		var out bytes.Buffer
		rp := &replier{w: bufio.NewWriter(&out)}
		if err := s.handleInfo(&request{ctx: t.Context(), payload: &io.LimitedReader{}}, rp); err != nil {
			t.Fatal(err)
		}
		rp.w.Flush()
		h, _ := transport.ParseResponseHeader(out.Bytes())
		var m map[string]any
		if err := json.Unmarshal(out.Bytes()[transport.ResponseHeaderSize:], &m); err != nil || h.Status != tc.want {
			t.Fatalf("%T: %v %s %v", tc.b, h.Status, out.Bytes()[transport.ResponseHeaderSize:], err)
		}
		_, hasCtx := m["n_ctx"]
		if down := tc.want != transport.StatusOK; down != (m["backend_available"] == false) || down == hasCtx ||
			down != (fmt.Sprint(m["error"]) != "<nil>") {
			t.Fatalf("%T: INFO meta %v", tc.b, m)
		}
	}
}

// TestHoldAllWaitsForWork: a whole-engine hold waits for the slot at work,
// refuses new acquisitions from its start (so the wait ends), holds every
// slot, and lets them go; a hold whose wait ends first takes nothing.
func TestHoldAllWaitsForWork(t *testing.T) {
	tab := newSlotTable(3)
	busy, err := tab.acquire(1, slotProcessing)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		release, err := tab.holdAll(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- release
	}()
	waitFor(t, func() bool { tab.mu.Lock(); defer tab.mu.Unlock(); return tab.draining == 1 })
	if _, err := tab.acquire(0, slotProcessing); !errors.Is(err, iface.ErrBusy) {
		t.Fatalf("an acquisition while the hold waits: %v", err)
	}
	select {
	case <-got:
		t.Fatal("the hold took every slot while slot 1 was at work")
	case <-time.After(50 * time.Millisecond):
	}
	busy.release(nil)
	release := <-got
	for i := range 3 {
		if st, _ := tab.get(i); st.use == slotIdle {
			t.Fatalf("slot %d idle under the hold", i)
		}
	}
	release()
	if l, err := tab.acquire(2, slotProcessing); err != nil {
		t.Fatalf("after the hold: %v", err)
	} else {
		l.release(nil)
	}

	busy, _ = tab.acquire(0, slotProcessing)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := tab.holdAll(ctx); !errors.Is(err, iface.ErrBusy) || !strings.Contains(err.Error(), "slots [0]") {
		t.Fatalf("a hold whose wait ends: %v", err)
	}
	if l, err := tab.acquire(1, slotProcessing); err != nil {
		t.Fatalf("after a hold gave up: %v", err)
	} else {
		l.release(nil)
	}
	busy.release(nil)
}

// TestLeaseFound: a front end's lease says who put the sequence the slot
// held when it was taken (the prompt cache saves only an earlier
// completion's), none for an empty slot.
func TestLeaseFound(t *testing.T) {
	s := NewServer(&stateBackend{}, iface.BackendInfo{NSlots: 1}, nil, Config{})
	l, err := s.TakeSlot(0)
	if err != nil || l.Found() != HolderNone {
		t.Fatalf("an empty slot: %v, found %v", err, l.Found())
	}
	l.l.release(&iface.SlotInfo{NPast: 5}) // a completion's sequence left behind
	l, err = s.TakeIdleSlot(func(int, []SlotView) (int64, bool) { return 0, true })
	if err != nil || l.Found() != HolderHTTP {
		t.Fatalf("after a completion: %v, found %v", err, l.Found())
	}
	l.l.release(&iface.SlotInfo{NPast: 0})
	rpc, err := s.slots.acquire(0, slotProcessing) // a PREFILL
	if err != nil {
		t.Fatal(err)
	}
	rpc.release(&iface.SlotInfo{NPast: 7})
	if l, err = s.TakeSlot(0); err != nil || l.Found() != HolderRPC {
		t.Fatalf("after an RPC PREFILL: %v, found %v", err, l.Found())
	}
	l.l.release(&iface.SlotInfo{})
	if l, err = s.TakeSlot(0); err != nil || l.Found() != HolderNone {
		t.Fatalf("after the slot was emptied: %v, found %v", err, l.Found())
	}
}
