// Package kv is the KV cache's accounting and the rules that edit a
// sequence's memory: the cells each slot holds and claims, what a prompt
// keeps of its slot's sequence (the common prefix, chunks moved into
// place), where a sequence may be cut, and how a full slot shifts its
// context. It reaches llama.cpp only through Memory, so it is tested
// without it (kvtest).
package kv

import (
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Cells is the context's KV cells and the slots that share them: NCtx in
// all, of which one slot may hold SlotCtx (all of them when the slots share
// one stream, Unified; an equal share each otherwise). Every method needs
// the context's lock, under which the slots' claims change.
type Cells struct {
	NCtx, SlotCtx int
	Unified       bool
	Slots         []*Slot
	// Parked is the cells a sequence that left its slot holds while it is
	// saved; Reclaim, when set, waits for that save and frees them, for a
	// slot that needs them (Fits, Room): a save in the background never
	// refuses what a save in line would have let in.
	Parked  int
	Reclaim func()
}

// Free is how many cells no slot holds or claims and none are parked.
func (c *Cells) Free() int {
	used := c.Parked
	for _, s := range c.Slots {
		used += s.held()
	}
	return c.NCtx - used
}

// reclaimFor frees the parked cells when need more cells than are free
// would fit with them.
func (c *Cells) reclaimFor(need int) {
	if c.Parked > 0 && c.Reclaim != nil && need > c.Free() {
		c.Reclaim()
	}
}

// CheckPrompt refuses a prompt of n tokens that no slot can hold.
func (c *Cells) CheckPrompt(n int) error {
	if n > c.SlotCtx {
		return fmt.Errorf("%w: prompt has %d tokens, %s", iface.ErrBadRequest, n, c.Text())
	}
	return nil
}

// Fits checks that slot i can take need more cells: within its own share
// and among the free ones.
func (c *Cells) Fits(i, need int) error {
	if have := c.Slots[i].held(); have+need > c.SlotCtx {
		return fmt.Errorf("%w: slot %d needs %d cells, %s", iface.ErrBadRequest, i, have+need, c.Text())
	}
	c.reclaimFor(need)
	if free := c.Free(); need > free {
		return fmt.Errorf("%w: needs %d KV cells, %d free (shared by all slots, n_ctx %d): clear a slot first",
			iface.ErrNoRoom, need, free, c.NCtx)
	}
	return nil
}

// Text says how many cells a slot holds and why, for errors.
func (c *Cells) Text() string {
	if c.Unified {
		return fmt.Sprintf("n_ctx is %d", c.SlotCtx)
	}
	return fmt.Sprintf("a slot holds %d (n_ctx %d split across %d slots)", c.SlotCtx, c.NCtx, len(c.Slots))
}

// Room is whether a decoding slot takes another token.
type Room int

const (
	RoomOK        Room = iota
	RoomShift          // the slot is full and shifts its context first
	RoomSlotFull       // the slot holds its share and cannot shift
	RoomCacheFull      // the cells all slots share are taken
)

// Room says whether slot i takes one more token. shift says that a full
// slot may shift its context (context_shift, on a memory that can), which
// needs more than the nKeep tokens it keeps and one more.
func (c *Cells) Room(i int, shift bool, nKeep int) Room {
	n := c.Slots[i].held()
	if n+1 > c.SlotCtx {
		if shift && n > nKeep+1 {
			return RoomShift
		}
		return RoomSlotFull
	}
	c.reclaimFor(1)
	if c.Free() < 1 {
		return RoomCacheFull
	}
	return RoomOK
}
