package transport

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// withUmask runs the test under umask mask, the worst case for a socket
// created by bind(2) being mask 0 (mode 0777). The umask is process-wide:
// these tests do not run in parallel with others.
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

// TestUnixSocketModeSetBeforeBind: the socket file is born 0600 under
// umask 000, before any chmod, because its mode is set between socket(2)
// and bind(2).
func TestUnixSocketModeSetBeforeBind(t *testing.T) {
	withUmask(t, 0)
	path := filepath.Join(t.TempDir(), "s.sock")
	lc := net.ListenConfig{Control: restrictSocketMode}
	l, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != socketMode {
		t.Fatalf("socket file created with mode %#o, want %#o", got, socketMode)
	}
}

// TestListenUnixNoModeWindow: under umask 000, a watcher that stats the
// socket's path as fast as it can, while Listen creates and closes the
// socket many times, never sees a mode wider than 0600 (with a chmod after
// bind it sees 0777 within a few hundred rounds).
func TestListenUnixNoModeWindow(t *testing.T) {
	withUmask(t, 0)
	path := filepath.Join(t.TempDir(), "s.sock")
	var stop atomic.Bool
	var seen, wide atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var st syscall.Stat_t
		for !stop.Load() {
			if syscall.Lstat(path, &st) != nil {
				continue
			}
			seen.Add(1)
			if st.Mode&0o777 != socketMode {
				wide.Add(1)
			}
		}
	}()
	rounds := 0
	for start := time.Now(); rounds < 3000 && time.Since(start) < 3*time.Second; rounds++ {
		l, err := Listen("unix://" + path)
		if err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("round %d: %v", rounds, err)
		}
		l.Close()
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d Listen rounds, the socket seen %d times", rounds, seen.Load())
	if n := wide.Load(); n > 0 {
		t.Fatalf("the socket was seen %d times with a mode wider than %#o", n, socketMode)
	}
	if seen.Load() == 0 {
		t.Fatal("the watcher never saw the socket: the test proves nothing")
	}
}
