//go:build unix && !linux

package host

import (
	"os"
	"syscall"
	"time"
)

// populated maps a ring shared; this system has no MAP_POPULATE, so its
// pages fault in under the first copies.
const populated = syscall.MAP_SHARED

// reserve sizes f to n bytes (no fallocate here: the pages come as they
// are written).
func reserve(f *os.File, n int64) error { return f.Truncate(n) }

// futexWait sleeps a moment (no shared futex here): the caller looks again.
func futexWait(_ *uint32, _ uint32, d time.Duration) { time.Sleep(min(d, time.Millisecond)) }

// futexWake does nothing: waiters look again after their sleep.
func futexWake(*uint32) {}
