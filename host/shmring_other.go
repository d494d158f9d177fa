//go:build unix && !linux

package host

import "syscall"

// populated maps a ring shared; this system has no MAP_POPULATE, so its
// pages fault in under the first copies.
const populated = syscall.MAP_SHARED
