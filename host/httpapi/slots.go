package httpapi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
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
	NRemain        int         `json:"n_remain"`
	StateSize      int64       `json:"state_size"`
	NPromptTokens  int         `json:"n_prompt_tokens"`
	Holder         string      `json:"holder"` // who put the slot's sequence there: none, rpc, http
	Params         slotParams  `json:"params"`
	NextToken      []nextToken `json:"next_token"`
	// Checkpoints are the slot's context checkpoints (not llama-server's);
	// absent where the backend takes none.
	Checkpoints *slotCheckpoints `json:"checkpoints,omitempty"`
}

type slotCheckpoints struct {
	N     int   `json:"n"`
	Bytes int64 `json:"bytes"`
}

// slotParams are the sampling parameters of the slot's last completion
// (the engine's defaults for a slot that ran none), llama-server's names.
type slotParams struct {
	iface.SamplerParams
	NPredict int `json:"n_predict"`
}

type nextToken struct {
	HasNextToken bool `json:"has_next_token"`
	HasNewLine   bool `json:"has_new_line"`
	NRemain      int  `json:"n_remain"`
	NDecoded     int  `json:"n_decoded"`
}

// listSlots answers from the slot table, so it never waits for a busy slot.
// The task fields describe the slot's last HTTP completion (id_task -1: none).
func (a *api) listSlots(w http.ResponseWriter, r *http.Request) {
	b, info := a.s.Backend()
	var ckpts []iface.SlotCheckpoints
	if b != nil {
		ctx, cancel := context.WithTimeout(r.Context(), promptCacheAsk)
		if now, err := b.Info(ctx); err == nil && now.Checkpoints != nil {
			ckpts = now.Checkpoints.Slots
		}
		cancel()
	}
	views := a.s.Slots()
	out := make([]slotStatus, len(views))
	a.mu.Lock()
	defer a.mu.Unlock()
	defaults := slotParams{SamplerParams: a.s.Tunables().Sampler(), NPredict: a.s.Tunables().NPredict()}
	for i, v := range views {
		ss := slotStatus{ID: i, IDTask: -1, NCtx: info.SlotCtx(), IsProcessing: v.Processing,
			IsTransferring: v.Transferring, NPast: v.NPast, StateSize: v.StateSize, Holder: v.Holder.String(), Params: defaults}
		nt := nextToken{NRemain: -1}
		if t, ok := a.tasks[i]; ok {
			ss.IDTask, ss.NPromptTokens, ss.Params = t.id, t.nPrompt, t.params
			nt.NRemain, nt.NDecoded = t.nRemain, t.nDecoded
		}
		ss.NRemain = nt.NRemain
		ss.NextToken = []nextToken{nt}
		if i < len(ckpts) {
			ss.Checkpoints = &slotCheckpoints{N: ckpts[i].Held, Bytes: ckpts[i].Bytes}
		}
		out[i] = ss
	}
	run.WriteJSON(w, http.StatusOK, out)
}

// pathSlot reads {id} like the RPC keys are read and returns the slot's
// view; a bad or unknown id is §8's 400 {"error":"invalid slot ID"}.
func (a *api) pathSlot(w http.ResponseWriter, r *http.Request) (int, host.SlotView, bool) {
	slot, err := host.ParseSlotKey(r.PathValue("id"))
	views := a.s.Slots()
	if err != nil || slot < 0 || slot >= len(views) {
		writeError(w, http.StatusBadRequest, iface.ErrNoSlot.Error())
		return 0, host.SlotView{}, false
	}
	return slot, views[slot], true
}

// stateMeta is STATE_META over HTTP, with the model identity the
// coordinator's cross-model guard reads.
func (a *api) stateMeta(w http.ResponseWriter, r *http.Request) {
	slot, v, ok := a.pathSlot(w, r)
	if !ok {
		return
	}
	_, info := a.s.Backend()
	m := transport.NewMeta().Add("slot_id", slot).Add("n_past", v.NPast).Add("state_size", v.StateSize).
		Add("is_processing", v.Processing).Add("is_transferring", v.Transferring).AddFields(info.Model)
	if err := m.Err(); err != nil {
		writeError(w, http.StatusInternalServerError, "state meta unavailable: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(m.Bytes(), '\n'))
}

// slotAction runs POST /slots/{id}?action=…; only erase exists here (state
// moves over Hydra RPC, not through llama-server's save/restore files).
func (a *api) slotAction(w http.ResponseWriter, r *http.Request) {
	slot, _, ok := a.pathSlot(w, r)
	if !ok {
		return
	}
	if action := r.URL.Query().Get("action"); action != "erase" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid action %q: only erase is supported", action))
		return
	}
	lease, err := a.s.TakeSlot(slot)
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	defer lease.Release()
	nErased := 0
	if views := a.s.Slots(); slot < len(views) { // a backend restart may have shrunk the table
		nErased = views[slot].NPast // held now: no operation changes it
	}
	b, _, err := lease.Backend()
	if err == nil {
		err = b.ClearSlot(r.Context(), slot)
	}
	if err != nil {
		writeError(w, statusOf(err), a.clientMessage(r.Context(), "erasing the slot", err))
		return
	}
	a.mu.Lock()
	delete(a.tasks, slot)
	a.mu.Unlock()
	run.WriteJSON(w, http.StatusOK, struct {
		IDSlot  int `json:"id_slot"`
		NErased int `json:"n_erased"`
	}{slot, nErased})
}

// pickSlot returns how a completion takes its slot: the one it names
// (id_slot), or the free slot whose cache holds the longest start of its
// prompt when that is at least the similarity threshold of it, else an empty
// slot, else the slot HTTP used least recently. A slot holding a Hydra RPC
// client's sequence is never taken for a completion that did not name it.
// With KV cells split between the slots, an empty or least recently used slot
// next to a busy one goes first: llama.cpp evaluates only sequences of
// consecutive ids in one micro-batch, so each gap between decoding slots
// costs a step another pass over the weights. In a KV cache the slots share,
// a slot is taken only where the prompt's need cells fit once idle HTTP
// sequences are evicted (host.PlanRoom; need 0: not known), and those are
// evicted when it is taken; else the completion waits for one to free.
func (a *api) pickSlot(ctx context.Context, slot int, toks []int32, need int) func() (*host.SlotLease, error) {
	if slot >= 0 {
		return func() (*host.SlotLease, error) { return a.takeNamed(ctx, slot, need) }
	}
	return func() (*host.SlotLease, error) { return a.takeIdle(ctx, toks, need) }
}

// errNoRoom is why a completion waits while its slot would be free: the
// cells of the shared KV cache are held by sequences it may not evict.
var errNoRoom = fmt.Errorf("%w: the KV cache the slots share is held by Hydra RPC sequences and running completions", iface.ErrBusy)

// takeNamed takes the slot a completion named, saying so when that
// overwrites an RPC client's sequence.
func (a *api) takeNamed(ctx context.Context, slot, need int) (*host.SlotLease, error) {
	views := a.s.Slots()
	_, info := a.s.Backend()
	if _, ok := host.PlanRoom(views, info, slot, need); need > 0 && slot < len(views) && !ok {
		return nil, errNoRoom
	}
	l, err := a.s.TakeSlot(slot)
	if err == nil && slot < len(views) && views[slot].Holder == host.HolderRPC && views[slot].NPast > 0 {
		tracing.Logger(ctx, a.log).Warn("a completion naming id_slot takes a slot holding a Hydra RPC sequence", "slot", slot, "n_past", views[slot].NPast)
		a.s.Stats().CountSlotEviction(host.HolderRPC)
	}
	if err == nil && need > 0 {
		a.s.MakeRoom(ctx, slot, need, false)
	}
	return l, err
}

// slotPick is what takeIdle found for the slot it took.
type slotPick struct {
	lcp    int // tokens its cache shares with the prompt, when reused
	evicts int // tokens of an HTTP sequence it drops
}

// The classes of free slot a completion may take, best first.
const (
	rankPrefix  = iota // its cache holds enough of the prompt
	rankEmpty          // it holds nothing
	rankHTTP           // it holds an earlier completion's sequence
	rankUnknown        // it holds a sequence of no known holder
)

// slotRank orders free slots (lower first): by class, then next to a busy
// slot before not, then by within (below 2^54).
func slotRank(class int, nearBusy bool, within int64) int64 {
	r := int64(class) << 56
	if !nearBusy {
		r |= 1 << 55
	}
	return r | within
}

// nearBusy reports whether a slot next to slot is processing or transferring.
func nearBusy(all []host.SlotView, slot int) bool {
	busy := func(i int) bool { return i >= 0 && i < len(all) && (all[i].Processing || all[i].Transferring) }
	return busy(slot-1) || busy(slot+1)
}

// takeIdle takes the best free slot for a prompt of toks (nil: unknown)
// that needs need cells (0: unknown).
func (a *api) takeIdle(ctx context.Context, toks []int32, need int) (*host.SlotLease, error) {
	a.mu.Lock()
	tasks := maps.Clone(a.tasks)
	a.mu.Unlock()
	_, info := a.s.Backend()
	pack := info.SplitKV()
	picks := map[int]slotPick{}
	noRoom := false
	l, err := a.s.TakeIdleSlot(func(slot int, all []host.SlotView) (int64, bool) {
		v := all[slot]
		if v.NPast > 0 && v.Holder == host.HolderRPC {
			return 0, false
		}
		if _, ok := host.PlanRoom(all, info, slot, need); need > 0 && !ok {
			noRoom = true
			return 0, false
		}
		near := pack && nearBusy(all, slot)
		t, ok := tasks[slot]
		if v.NPast == 0 {
			return slotRank(rankEmpty, near, 0), true
		}
		if !ok || v.Holder != host.HolderHTTP {
			return slotRank(rankUnknown, near, 0), true
		}
		if n := iface.CommonPrefix(t.tokens, toks); a.similarity > 0 && n > 0 && float64(n) >= a.similarity*float64(len(toks)) {
			picks[slot] = slotPick{lcp: n}
			return slotRank(rankPrefix, true, 1<<40-int64(n)), true
		}
		picks[slot] = slotPick{evicts: v.NPast}
		return slotRank(rankHTTP, near, max(t.processed.UnixMilli(), 0)), true
	})
	switch {
	case err == nil:
		a.notePick(ctx, l.Slot(), picks[l.Slot()])
		if need > 0 {
			a.s.MakeRoom(ctx, l.Slot(), need, false)
		}
	case noRoom && errors.Is(err, iface.ErrBusy):
		err = errNoRoom
	}
	return l, err
}

// notePick logs and counts a slot whose cache a completion reuses or whose
// HTTP sequence it drops.
func (a *api) notePick(ctx context.Context, slot int, p slotPick) {
	switch {
	case p.lcp > 0:
		tracing.Logger(ctx, a.log).Debug("reusing a slot's cache for a completion", "slot", slot, "shared_tokens", p.lcp)
	case p.evicts > 0:
		tracing.Logger(ctx, a.log).Debug("a completion takes a slot holding an earlier completion's sequence", "slot", slot, "n_past", p.evicts)
		a.s.Stats().CountSlotEviction(host.HolderHTTP)
	}
}

// rememberTokens keeps the sequence a completion left in slot, for picking
// the slot of a later prompt that starts like it.
func (a *api) rememberTokens(slot int, id int64, toks []int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t, ok := a.tasks[slot]; ok && t.id == id {
		t.tokens = toks
		a.tasks[slot] = t
	}
}

// beginTask records a completion on slot for /slots and returns its id.
func (a *api) beginTask(slot, nPrompt, nRemain int, params slotParams) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next++ // ids start at 1: 0 is no task's
	id := a.next
	a.tasks[slot] = slotTask{id: id, nPrompt: nPrompt, nRemain: nRemain, processed: time.Now(), params: params}
	return id
}

// endTask records how the completion id on slot ended, unless a later one
// took its place.
func (a *api) endTask(slot int, id int64, nDecoded, nPredict int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t, ok := a.tasks[slot]; ok && t.id == id {
		t.nDecoded, t.nRemain, t.processed = nDecoded, max(nPredict-nDecoded, 0), time.Now()
		a.tasks[slot] = t
	}
}
