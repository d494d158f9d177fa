//go:build unix

package host

import (
	"syscall"
	"testing"
)

func hardNofileLimit(t *testing.T) uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	return uint64(rl.Max)
}

// TestGoRaisesNoFileLimit: the Go runtime raises the soft RLIMIT_NOFILE to
// (one below) the hard limit at start, which is why FitConnLimit does not.
func TestGoRaisesNoFileLimit(t *testing.T) {
	soft, ok := nofileLimit()
	if !ok {
		t.Skip("no RLIMIT_NOFILE here")
	}
	hard := hardNofileLimit(t)
	if soft+1 < hard {
		t.Fatalf("soft RLIMIT_NOFILE %d, hard %d: the runtime did not raise it", soft, hard)
	}
}
