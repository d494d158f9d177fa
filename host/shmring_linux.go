package host

import (
	"errors"
	"fmt"
	"math"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// populated maps a ring shared and builds its page tables at once.
const populated = syscall.MAP_SHARED | syscall.MAP_POPULATE

// reserve sizes f to n bytes with its pages allocated, so that a full
// shared-memory file system refuses the export here rather than with a
// SIGBUS under a later copy; a file system without fallocate gets the size
// alone.
func reserve(f *os.File, n int64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, n)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		err = f.Truncate(n)
	}
	if err != nil {
		return fmt.Errorf("allocating the export's %d bytes: %w", n, err)
	}
	return nil
}

// futexWait sleeps while the 32-bit word at p holds val, at most d, or until
// futexWake: the word lies in a mapping both engines share, so either
// process wakes the other (a shared futex, keyed by the file's page).
func futexWait(p *uint32, val uint32, d time.Duration) {
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on the word at p.
func futexWake(p *uint32) {
	_, _, _ = syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWakeOp, math.MaxInt32, 0, 0, 0)
}

const futexWaitOp, futexWakeOp = 0, 1 // FUTEX_WAIT, FUTEX_WAKE, not private: across processes
