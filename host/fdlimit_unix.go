//go:build unix

package host

import "syscall"

// nofileLimit is the process's soft RLIMIT_NOFILE.
func nofileLimit() (uint64, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, false
	}
	return uint64(rl.Cur), true
}
