//go:build unix && !linux

package host

import (
	"os"
	"syscall"
)

// populated maps a ring shared; this system has no MAP_POPULATE, so its
// pages fault in under the first copies.
const populated = syscall.MAP_SHARED

// reserve sizes f to n bytes (no fallocate here: the pages come as they
// are written).
func reserve(f *os.File, n int64) error { return f.Truncate(n) }
