package iface

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// TestCancelledStateGetTail: the host's StateGet returns as soon as its
// writer fails, while the plugin's handler is still in the backend; the
// host's next operation on the slot waits for that tail instead of finding
// the slot busy (the backend refuses overlapping calls, as the mock and the
// llama plugin do).
func TestCancelledStateGetTail(t *testing.T) {
	var inside atomic.Int32
	enter := func() error {
		if inside.Add(1) != 1 {
			inside.Add(-1)
			return ErrBusy
		}
		return nil
	}
	impl := &fakeBackend{
		stateGet: func(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
			if err := enter(); err != nil {
				return 0, err
			}
			defer inside.Add(-1)
			_, err := w.Write(randomBytes(chunk))
			if err != nil {
				return 0, err
			}
			// A backend notices the cancellation only between chunks.
			<-ctx.Done()
			time.Sleep(200 * time.Millisecond)
			return 0, ctx.Err()
		},
		clearSlot: func(context.Context, int) error {
			if err := enter(); err != nil {
				return err
			}
			inside.Add(-1)
			return nil
		},
	}
	c := TestBackend(t, impl)
	ctx := context.Background()
	if _, err := c.StateGet(ctx, 0, 1024, &failingWriter{failAt: 1, err: errors.New("client gone")}); err == nil {
		t.Fatal("StateGet into a failing writer succeeded")
	}
	if err := c.ClearSlot(ctx, 0); err != nil {
		t.Fatalf("ClearSlot right after a cancelled StateGet: %v", err)
	}
}

// TestSlotGateBounded: an operation that never ends makes the next one on its
// slot busy after cancelledTail, not wait forever; other slots are free.
func TestSlotGateBounded(t *testing.T) {
	var g slotGate
	leave, err := g.enter(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	other, err := g.enter(context.Background(), 2)
	if err != nil {
		t.Fatalf("another slot: %v", err)
	}
	other()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := g.enter(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("held slot under a deadline: %v", err)
	}
}
