// Package sched is the llama plugin's scheduler in plain Go: the jobs, each
// step's batch of decoders' tokens and prompt chunks, the sampling of its
// rows, cancellation, the speculative step's plan and the replay of
// rejected drafts, and the context lock the steps share with everyone
// else. It reaches llama.cpp only through the interfaces it declares
// (Context, Vocab, Sampler, Drafter, Slots, Prompts), so it is tested
// without it (schedtest).
package sched

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Lock is the llama_context's lock. The scheduler takes it for one step
// after another; anyone else (a prefill or decode registering, a state
// transfer between its waits) is let in before the next step, so that they
// wait for one step at most instead of queueing behind several.
type Lock struct {
	mu      sync.Mutex
	waiting atomic.Int32 // callers other than the scheduler blocked in Lock
}

// Lock takes the lock for work outside the scheduler.
func (l *Lock) Lock() {
	l.waiting.Add(1)
	l.mu.Lock()
	l.waiting.Add(-1)
}

// Unlock lets the lock go, whoever took it.
func (l *Lock) Unlock() { l.mu.Unlock() }

// stepYield bounds how long the scheduler lets waiters go first: past it a
// waiter that has not been scheduled yet waits for the next step. Tests
// lengthen it.
var stepYield = time.Millisecond

// StepLock is the scheduler's Lock: callers waiting in Lock go first.
func (l *Lock) StepLock() {
	if l.waiting.Load() > 0 {
		deadline := time.Now().Add(stepYield)
		for l.waiting.Load() > 0 && time.Now().Before(deadline) {
			runtime.Gosched()
		}
	}
	l.mu.Lock()
}
