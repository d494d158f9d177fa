//go:build !unix

package host

// nofileLimit: no RLIMIT_NOFILE here.
func nofileLimit() (uint64, bool) { return 0, false }
