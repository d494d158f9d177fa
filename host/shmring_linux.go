package host

import (
	"errors"
	"fmt"
	"os"
	"syscall"
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
