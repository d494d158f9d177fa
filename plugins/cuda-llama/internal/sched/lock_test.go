package sched

import (
	"testing"
	"time"
)

// TestWaiterBeforeStep: a caller blocked in Lock while a step holds the
// lock takes it before the scheduler's next step does.
func TestWaiterBeforeStep(t *testing.T) {
	defer func(d time.Duration) { stepYield = d }(stepYield)
	stepYield = 10 * time.Second // the order under test, not the deadline
	var l Lock
	l.StepLock() // a step runs
	order := make(chan string, 2)
	go func() {
		l.Lock()
		order <- "caller"
		l.Unlock()
	}()
	for l.waiting.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	stepped := make(chan struct{})
	go func() {
		l.StepLock()
		order <- "step"
		l.Unlock()
		close(stepped)
	}()
	l.Unlock() // the step ends
	<-stepped
	if first := <-order; first != "caller" {
		t.Fatalf("%s took the lock first, want the caller", first)
	}
}

// TestStepYieldBounded: a waiter that does not get the lock in time does
// not hold the scheduler past stepYield.
func TestStepYieldBounded(t *testing.T) {
	var l Lock
	l.waiting.Add(1) // a waiter that never gets scheduled
	start := time.Now()
	l.StepLock()
	l.Unlock()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the step waited %v for a waiter", d)
	}
}
