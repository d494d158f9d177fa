package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

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

// dialClient dials url for the benchmark's client; with blocking, a Unix
// socket's writes are blockingConn's.
func dialClient(ctx context.Context, url string, blocking bool) (*transport.Client, error) {
	if !blocking || !strings.HasPrefix(url, "unix://") {
		return transport.DialClient(ctx, url)
	}
	conn, err := transport.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	bc, err := newBlockingConn(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return transport.NewClient(bc), nil
}

func newBlockingConn(conn net.Conn) (blockingConn, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return blockingConn{}, fmt.Errorf("a %T, not a Unix socket", conn)
	}
	raw, err := uc.SyscallConn()
	return blockingConn{uc, raw}, err
}
