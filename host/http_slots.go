package host

import (
	"fmt"
	"net/http"

	"github.com/hydra-engine/hydra-engine/iface"
)

// slotStatus is one element of /slots: llama-server's fields that mean
// something here, plus the host's view (n_past, state size, transferring).
type slotStatus struct {
	ID             int         `json:"id"`
	IDTask         int64       `json:"id_task"`
	NCtx           int         `json:"n_ctx"`
	Speculative    bool        `json:"speculative"`
	IsProcessing   bool        `json:"is_processing"`
	IsTransferring bool        `json:"is_transferring"`
	NPast          int         `json:"n_past"`
	StateSize      int64       `json:"state_size"`
	NPromptTokens  int         `json:"n_prompt_tokens"`
	NextToken      []nextToken `json:"next_token"`
}

type nextToken struct {
	HasNextToken bool `json:"has_next_token"`
	HasNewLine   bool `json:"has_new_line"`
	NRemain      int  `json:"n_remain"`
	NDecoded     int  `json:"n_decoded"`
}

// listSlots answers from the slot table, so it never waits for a busy slot.
// The task fields describe the slot's last HTTP completion (id_task -1: none).
func (a *httpAPI) listSlots(w http.ResponseWriter, r *http.Request) {
	_, info := a.s.Backend()
	n := a.s.slots.count()
	out := make([]slotStatus, 0, n)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range n {
		st, err := a.s.slots.get(i)
		if err != nil {
			break // the table shrank under us (backend reload)
		}
		ss := slotStatus{ID: i, IDTask: -1, NCtx: info.NCtx, IsProcessing: st.use == slotProcessing,
			IsTransferring: st.use == slotTransferring, NPast: st.nPast, StateSize: st.stateSize}
		nt := nextToken{NRemain: -1}
		if t, ok := a.tasks[i]; ok {
			ss.IDTask, ss.NPromptTokens = t.id, t.nPrompt
			nt.NRemain, nt.NDecoded = t.nRemain, t.nDecoded
		}
		ss.NextToken = []nextToken{nt}
		out = append(out, ss)
	}
	writeHTTPJSON(w, http.StatusOK, out)
}

// pathSlot reads {id} like the RPC keys are read; a bad or unknown id is
// §8's 400 {"error":"invalid slot ID"}.
func (a *httpAPI) pathSlot(w http.ResponseWriter, r *http.Request) (int, bool) {
	slot, err := parseSlotKey(r.PathValue("id"))
	if err == nil {
		_, err = a.s.slots.get(slot)
	}
	if err != nil {
		writeHTTPError(w, http.StatusBadRequest, iface.ErrNoSlot.Error())
		return 0, false
	}
	return slot, true
}

// stateMeta is STATE_META over HTTP, with the model identity the
// coordinator's cross-model guard reads.
func (a *httpAPI) stateMeta(w http.ResponseWriter, r *http.Request) {
	slot, ok := a.pathSlot(w, r)
	if !ok {
		return
	}
	st, err := a.s.slots.get(slot)
	if err != nil {
		writeHTTPError(w, http.StatusServiceUnavailable, "state meta unavailable")
		return
	}
	_, info := a.s.Backend()
	m := newMeta().add("slot_id", slot).add("n_past", st.nPast).add("state_size", st.stateSize).
		add("is_processing", st.use == slotProcessing).add("is_transferring", st.use == slotTransferring).
		identity(info.Model)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(m.bytes(), '\n'))
}

// slotAction runs POST /slots/{id}?action=…; only erase exists here (state
// moves over Hydra RPC, not through llama-server's save/restore files).
func (a *httpAPI) slotAction(w http.ResponseWriter, r *http.Request) {
	slot, ok := a.pathSlot(w, r)
	if !ok {
		return
	}
	if action := r.URL.Query().Get("action"); action != "erase" {
		writeHTTPError(w, http.StatusBadRequest, fmt.Sprintf("invalid action %q: only erase is supported", action))
		return
	}
	if err := a.s.slots.acquire(slot, slotProcessing); err != nil {
		writeHTTPError(w, httpStatusOf(err), err.Error())
		return
	}
	b, _ := a.s.Backend()
	after := &iface.SlotInfo{Slot: slot}
	defer func() { a.s.slots.release(slot, after) }()
	st, _ := a.s.slots.get(slot)
	if err := b.ClearSlot(r.Context(), slot); err != nil {
		if si, serr := b.Slot(a.s.ctx, slot); serr == nil {
			after = &si
		} else {
			after = nil
		}
		writeHTTPError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if si, err := b.Slot(a.s.ctx, slot); err == nil {
		after = &si
	}
	a.mu.Lock()
	delete(a.tasks, slot)
	a.mu.Unlock()
	writeHTTPJSON(w, http.StatusOK, struct {
		IDSlot  int `json:"id_slot"`
		NErased int `json:"n_erased"`
	}{slot, st.nPast})
}

// acquireIdle takes an idle slot for a completion that named none, as
// processing. It prefers an empty slot, then the one HTTP used least
// recently, and only then a slot HTTP never used: those hold sequences put
// there over Hydra RPC, which the coordinator may still want.
func (a *httpAPI) acquireIdle() (int, error) {
	a.mu.Lock()
	used := make(map[int]int64, len(a.tasks))
	for i, t := range a.tasks {
		used[i] = t.processed.UnixNano()
	}
	a.mu.Unlock()
	t := a.s.slots
	t.mu.Lock()
	defer t.mu.Unlock()
	best, bestRank := -1, [2]int64{}
	for i, st := range t.slots {
		if st.use != slotIdle {
			continue
		}
		var rank [2]int64 // lower wins: class, then last use
		switch last, ok := used[i]; {
		case st.nPast == 0:
			rank = [2]int64{0, 0}
		case ok:
			rank = [2]int64{1, last}
		default:
			rank = [2]int64{2, 0}
		}
		if best < 0 || rank[0] < bestRank[0] || (rank[0] == bestRank[0] && rank[1] < bestRank[1]) {
			best, bestRank = i, rank
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%w: all %d slots are busy", iface.ErrBusy, len(t.slots))
	}
	t.slots[best].use = slotProcessing
	return best, nil
}
