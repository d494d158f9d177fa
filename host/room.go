package host

import (
	"context"
	"slices"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Room in a KV cache the slots share (iface.BackendInfo.KVUnified): a
// sequence that does not fit the cells the other slots hold first evicts
// idle sequences a front end's completion left (HolderHTTP), least recently
// used first. A Hydra RPC client's sequence is the coordinator's and is
// never evicted, nor is a busy slot's.

// PlanRoom returns the slots to evict, least recently used first, so that a
// sequence of need cells fits in slot's place, and whether it fits then;
// when evicting every idle HTTP sequence still leaves too few (RPC
// sequences or busy slots hold the rest), evict names them all and ok is
// false. Slot's own sequence does not count: need is what the slot will
// hold. With cells of its own per slot, only the slot's size bounds need.
// all is every slot's view (Slots, or TakeIdleSlot's argument).
func PlanRoom(all []SlotView, info iface.BackendInfo, slot, need int) (evict []int, ok bool) {
	if info.SplitKV() || info.NCtx <= 0 {
		return nil, info.SlotCtx() <= 0 || need <= info.SlotCtx()
	}
	free := info.NCtx
	var idle []int
	for i, v := range all {
		if i == slot {
			continue
		}
		free -= v.NPast
		if v.NPast > 0 && v.Holder == HolderHTTP && !v.Processing && !v.Transferring {
			idle = append(idle, i)
		}
	}
	slices.SortStableFunc(idle, func(a, b int) int { return all[a].LastUse.Compare(all[b].LastUse) })
	for _, i := range idle {
		if need <= free {
			break
		}
		evict = append(evict, i)
		free += all[i].NPast
	}
	return evict, need <= free
}

// Evict empties the idle HTTP sequences of slots (PlanRoom's plan) and
// returns the cells it freed. A slot taken or changed since the plan is
// left alone; the backend's own check of the next prompt decides.
func (s *Server) Evict(ctx context.Context, slots []int) int {
	freed := 0
	for _, i := range slots {
		l, err := s.slots.acquire(i, slotProcessing)
		if err != nil {
			continue // busy now, or the table was reset
		}
		st, _ := s.slots.get(i)
		if st.holder != HolderHTTP || st.nPast == 0 {
			l.release(nil)
			continue
		}
		b, _, err := s.backendFor(l)
		if err == nil {
			err = b.ClearSlot(ctx, i)
		}
		if err != nil {
			tracing.Logger(ctx, s.log).Warn("evicting an idle sequence from the shared KV cache", "slot", i, "error", err)
			l.release(nil)
			continue
		}
		l.release(&iface.SlotInfo{Slot: i})
		s.stats.CountKVEviction(st.nPast)
		tracing.Logger(ctx, s.log).Debug("evicted an idle HTTP sequence to make room in the shared KV cache", "slot", i, "cells", st.nPast)
		freed += st.nPast
	}
	return freed
}

// MakeRoom evicts what PlanRoom plans for a sequence of need cells in slot,
// when that makes it fit or, with partial, as far as it goes, and returns
// the cells freed.
func (s *Server) MakeRoom(ctx context.Context, slot, need int, partial bool) int {
	_, info := s.Backend()
	evict, ok := PlanRoom(s.Slots(), info, slot, need)
	if len(evict) == 0 || !(ok || partial) {
		return 0
	}
	return s.Evict(ctx, evict)
}
