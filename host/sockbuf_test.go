package host

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// sndbuf reads SO_SNDBUF of c's socket.
func sndbuf(t *testing.T, c net.Conn) int {
	t.Helper()
	sc, err := netConn(c).(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := sc.Control(func(fd uintptr) { v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// acceptedPair returns the server side of a fresh connection on network.
func acceptedPair(t *testing.T, network, addr string) net.Conn {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cc, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

func TestSocketBuffers(t *testing.T) {
	sock := func() net.Conn { return acceptedPair(t, "unix", filepath.Join(t.TempDir(), "s")) }

	// The default: 4 MiB asked on Unix sockets; Linux grants min(ask,
	// wmem_max) and reports twice that.
	c := sock()
	before := sndbuf(t, c)
	if err := setSockBuf(c, sockBufSize(c, 0)); err != nil {
		t.Fatal(err)
	}
	got := sndbuf(t, c)
	if b, err := os.ReadFile("/proc/sys/net/core/wmem_max"); err == nil {
		max, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		if want := 2 * min(DefaultUnixSocketBuffer, max); got != want {
			t.Errorf("Unix SO_SNDBUF after the default: %d, want %d (wmem_max %d)", got, want, max)
		}
	} else if got < before {
		t.Errorf("Unix SO_SNDBUF shrank from %d to %d", before, got)
	}

	// -1 leaves the kernel's default alone.
	c = sock()
	before = sndbuf(t, c)
	if err := setSockBuf(c, sockBufSize(c, -1)); err != nil {
		t.Fatal(err)
	}
	if got := sndbuf(t, c); got != before {
		t.Errorf("SocketBuffer -1 changed SO_SNDBUF from %d to %d", before, got)
	}

	// TCP keeps its autotuning unless a size is given.
	tc := acceptedPair(t, "tcp", "127.0.0.1:0")
	if n := sockBufSize(tc, 0); n != 0 {
		t.Errorf("default TCP buffer ask is %d, want 0 (autotuning)", n)
	}
	if n := sockBufSize(tc, 1<<20); n != 1<<20 {
		t.Errorf("explicit TCP buffer ask is %d, want %d", n, 1<<20)
	}
	if err := setSockBuf(tc, 64<<10); err != nil {
		t.Fatal(err)
	}
	if got := sndbuf(t, tc); got != 128<<10 { // wmem_max is never below 64 KiB in practice
		t.Errorf("TCP SO_SNDBUF after asking 64 KiB: %d, want %d", got, 128<<10)
	}
}

func TestParseSysctlInt(t *testing.T) {
	if n, err := parseSysctlInt("212992\n"); n != 212992 || err != nil {
		t.Fatalf("212992: %d, %v", n, err)
	}
	for _, bad := range []string{"", "x", "0", "-5", "1 2"} {
		if _, err := parseSysctlInt(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	// On Linux the real file reads as a positive count.
	if _, err := os.Stat(wmemDefault); err == nil {
		if n, err := UnixClientSendBuffer(); n <= 0 || err != nil {
			t.Fatalf("UnixClientSendBuffer: %d, %v", n, err)
		}
	}
}
