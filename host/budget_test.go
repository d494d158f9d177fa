package host

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestBudgetRefusesMoreThanItHoldsAtOnce(t *testing.T) {
	b := newPayloadBudget(100)
	start := time.Now()
	err := b.acquire(context.Background(), nil, 101)
	if !errors.Is(err, ErrOverBudget) || time.Since(start) > time.Second {
		t.Fatalf("101 of 100 bytes: %v after %v", err, time.Since(start))
	}
}

func TestBudgetWaitsForARelease(t *testing.T) {
	b := newPayloadBudget(100)
	if err := b.acquire(context.Background(), nil, 60); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.acquire(context.Background(), nil, 60) }()
	select {
	case err := <-got:
		t.Fatalf("second 60 bytes admitted while the first held them: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.release(60)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if u := b.inUse(); u != 60 {
		t.Fatalf("in use %d, want 60", u)
	}
}

func TestBudgetWaitEnds(t *testing.T) {
	b := newPayloadBudget(100)
	b.acquire(context.Background(), nil, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.acquire(ctx, nil, 1); !errors.Is(err, ErrBudgetBusy) {
		t.Fatalf("after the wait: %v, want ErrBudgetBusy", err)
	}
	stop := make(chan struct{})
	close(stop)
	if err := b.acquire(context.Background(), stop, 1); !errors.Is(err, ErrBudgetBusy) {
		t.Fatalf("while stopping: %v, want ErrBudgetBusy", err)
	}
}

// TestBudgetReturnsMemoryAfterABurst: memory goes back to the OS once a
// budget used beyond a quarter drains, at most once per interval.
func TestBudgetReturnsMemoryAfterABurst(t *testing.T) {
	b := newPayloadBudget(100)
	var returned atomic.Int32
	b.freeOS = func() { returned.Add(1) }
	b.every = 200 * time.Millisecond
	burst := func(n uint64) {
		if err := b.acquire(context.Background(), nil, n); err != nil {
			t.Fatal(err)
		}
		b.release(n)
	}
	burst(10) // a small request: nothing to return
	time.Sleep(50 * time.Millisecond)
	if n := returned.Load(); n != 0 {
		t.Fatalf("%d returns after a small request", n)
	}
	burst(50)
	waitFor(t, func() bool { return returned.Load() == 1 })
	burst(50) // within the interval: one more return, at its end
	burst(50)
	time.Sleep(50 * time.Millisecond)
	if n := returned.Load(); n != 1 {
		t.Fatalf("%d returns within the interval, want 1", n)
	}
	waitFor(t, func() bool { return returned.Load() == 2 })
}

func waitFor(t *testing.T, cond func() bool) {
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 5 s")

}

// TestBudgetKeepsAShareForSmallPayloads: uploads larger than ReservedPayload
// fill at most 7/8 of the budget together, so a small payload is admitted at
// once beside them; one that only the reserve would fit fails at once.
func TestBudgetKeepsAShareForSmallPayloads(t *testing.T) {
	b := newPayloadBudget(256 << 20)
	for i := range 14 { // 14 × 16 MiB = 224 MiB, the bulk share
		if err := b.acquire(context.Background(), nil, 16<<20); err != nil {
			t.Fatalf("upload %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := b.acquire(ctx, nil, 16<<20); !errors.Is(err, ErrBudgetBusy) {
		t.Fatalf("a 15th upload beyond the bulk share: %v", err)
	}
	start := time.Now()
	if err := b.acquire(context.Background(), nil, 200<<10); err != nil || time.Since(start) > 50*time.Millisecond {
		t.Fatalf("a 200 KB payload beside them: %v after %v", err, time.Since(start))
	}
	if err := newPayloadBudget(8<<20).acquire(context.Background(), nil, 7<<20+1); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("a payload only the reserve would fit: %v", err)
	}
}
