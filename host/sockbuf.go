package host

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// DefaultUnixSocketBuffer is the send and receive buffer asked for on
// accepted Unix-socket connections. The kernel's default (net.core.wmem_default,
// ~208 KiB) makes a 2 MiB chunk ten blocking writes, each a park and wake of
// the connection's goroutine; with 4 MiB the host writes a chunk in one go and
// the plugin keeps filling meanwhile (measured: 4× fewer context switches per
// STATE_GET, see docs/benchmarks). TCP is left to the kernel's autotuning,
// which already grows to net.ipv4.tcp_wmem's maximum; setting SO_SNDBUF would
// switch that off.
const DefaultUnixSocketBuffer = 4 << 20

// SetSocketBuffers does to c what the engine does to every connection it
// accepts, want being Config.SocketBuffer (0: the defaults). A benchmark's raw
// baseline calls it so both sides of a ratio run on the same socket settings.
func SetSocketBuffers(c net.Conn, want int) error {
	return setSockBuf(c, sockBufSize(c, want))
}

// sockBufSize is the buffer to ask for on c, 0 for the kernel's own choice.
// want is Config.SocketBuffer: 0 the defaults above, < 0 the kernel's
// everywhere, > 0 that size on every connection.
func sockBufSize(c net.Conn, want int) int {
	switch {
	case want < 0:
		return 0
	case want > 0:
		return want
	}
	if _, ok := netConn(c).(*net.UnixConn); ok {
		return DefaultUnixSocketBuffer
	}
	return 0
}

// netConn is the socket under a TLS connection.
func netConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}

// setSockBuf asks for size-byte send and receive buffers on c. The kernel
// caps the request at net.core.wmem_max / rmem_max (and doubles it for its
// bookkeeping), so this is best effort; the error is only logged.
func setSockBuf(c net.Conn, size int) error {
	type bufferer interface {
		SetWriteBuffer(int) error
		SetReadBuffer(int) error
	}
	b, ok := netConn(c).(bufferer)
	if !ok || size <= 0 {
		return nil
	}
	if err := b.SetWriteBuffer(size); err != nil {
		return err
	}
	return b.SetReadBuffer(size)
}

// wmemDefault is where Linux keeps the send buffer a new socket gets
// unless its owner sets SO_SNDBUF.
const wmemDefault = "/proc/sys/net/core/wmem_default"

// UnixClientSendBuffer is the send buffer a Unix-socket client of this
// machine has when it sets none (net.core.wmem_default): on a Unix stream
// socket all a sender may have in flight. With the kernel's usual ~208 KiB a
// STATE_PUT's sender stalls whenever the engine falls ~50 µs behind, so the
// engine hints at raising it (docs/operators.md).
func UnixClientSendBuffer() (int, error) {
	b, err := os.ReadFile(wmemDefault)
	if err != nil {
		return 0, err
	}
	return parseSysctlInt(string(b))
}

func parseSysctlInt(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s: want a positive byte count, got %q", wmemDefault, strings.TrimSpace(s))
	}
	return n, nil
}
