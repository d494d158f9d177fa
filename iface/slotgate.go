package iface

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// cancelledTail bounds how long a slot operation waits in the plugin for the
// previous one on the same slot to end; past it the slot is reported busy.
const cancelledTail = 30 * time.Second

// slotGate runs a backend's slot operations one at a time per slot in the
// plugin process. The host already serialises them; the gate covers the tail
// of a cancelled call: the host's side of a gRPC call returns as soon as it
// cancels, while the plugin's handler runs until it notices, so without the
// gate the host's next operation on that slot could find it busy. The zero
// value is ready to use.
type slotGate struct {
	mu   sync.Mutex
	held map[int]chan struct{} // closed when the slot's operation ends
}

// enter waits until slot is free, then holds it until the returned func runs.
func (g *slotGate) enter(ctx context.Context, slot int) (func(), error) {
	timer := time.NewTimer(cancelledTail)
	defer timer.Stop()
	for {
		g.mu.Lock()
		prev, busy := g.held[slot]
		if !busy {
			if g.held == nil {
				g.held = map[int]chan struct{}{}
			}
			done := make(chan struct{})
			g.held[slot] = done
			g.mu.Unlock()
			return func() {
				g.mu.Lock()
				delete(g.held, slot)
				g.mu.Unlock()
				close(done)
			}, nil
		}
		g.mu.Unlock()
		select {
		case <-prev:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			return nil, fmt.Errorf("%w: slot %d is still running an earlier operation", ErrBusy, slot)
		}
	}
}

// EnterSlot waits for the slot's previous operation in this plugin to end
// (see slotGate) and holds the slot until leave is called. The adapter's own
// slot calls use it; a data plane that calls Impl itself must too.
func (s *GRPCServer) EnterSlot(ctx context.Context, slot int) (leave func(), err error) {
	return s.slots.enter(ctx, slot)
}
