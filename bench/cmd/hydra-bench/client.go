package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/transport"
)

// blockingConn is a Unix-socket client connection whose writes are blocking
// write(2)s, as a C# or Python client's sends are: the thread sleeps in the
// kernel until the socket has room and the receiver's reads wake it, where
// a Go client parks on the runtime's poller and is woken through epoll. Reads
// stay Go's. A write is not bounded by the connection's deadline (the
// benchmark's transfer timeout does not interrupt it).
type blockingConn struct {
	*net.UnixConn
	raw syscall.RawConn
}

func (c blockingConn) Write(p []byte) (int, error) {
	n := 0
	var werr error
	err := c.raw.Control(func(fd uintptr) {
		if werr = unix.SetNonblock(int(fd), false); werr != nil {
			return
		}
		defer func() {
			if err := unix.SetNonblock(int(fd), true); err != nil && werr == nil {
				werr = err
			}
		}()
		for n < len(p) {
			k, err := unix.Write(int(fd), p[n:])
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				werr = err
				return
			}
			n += k
		}
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		err = &net.OpError{Op: "write", Net: "unix", Addr: c.RemoteAddr(), Err: err}
	}
	return n, err
}

// clientOpts is how the benchmark's client treats its Unix sockets, to the
// raw servers and the engine alike.
type clientOpts struct {
	blocking bool // --client-sends blocking: writes are blockingConn's
	sockbuf  int  // --client-sockbuf: SO_SNDBUF/SO_RCVBUF asked for (0: the kernel's default)
}

// dialClient dials url for the benchmark's client, a Unix socket as o says.
func dialClient(ctx context.Context, url string, o clientOpts) (*transport.Client, error) {
	if !strings.HasPrefix(url, "unix://") || (!o.blocking && o.sockbuf == 0) {
		return transport.DialClient(ctx, url)
	}
	conn, err := transport.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	c, err := unixClientConn(conn, o)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return transport.NewClient(c), nil
}

// unixClientConn is conn with o's socket buffers and, with o.blocking, its
// writes blockingConn's.
func unixClientConn(conn net.Conn, o clientOpts) (net.Conn, error) {
	if o.sockbuf > 0 {
		uc, ok := conn.(*net.UnixConn)
		if !ok {
			return nil, fmt.Errorf("a %T, not a Unix socket", conn)
		}
		if err := host.SetSocketBuffers(uc, o.sockbuf); err != nil {
			return nil, err
		}
	}
	if !o.blocking {
		return conn, nil
	}
	return newBlockingConn(conn)
}

// sendBuffer is the SO_SNDBUF getsockopt reports for a Unix socket of this
// host asked for want bytes (0: none asked). The kernel doubles a request for
// its bookkeeping and caps it at net.core.wmem_max, so the table says what
// the client really had.
func sendBuffer(want int) (int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if want > 0 {
		if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, want); err != nil {
			return 0, err
		}
	}
	return unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF)
}

func newBlockingConn(conn net.Conn) (blockingConn, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return blockingConn{}, fmt.Errorf("a %T, not a Unix socket", conn)
	}
	raw, err := uc.SyscallConn()
	return blockingConn{uc, raw}, err
}
