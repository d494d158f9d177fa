//go:build linux

package iface

import (
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// socketPollWait is how long fillFromSocket waits in poll(2) on its own
// thread for a dry socket before it hands the wait to Go's netpoller, under
// the source's deadline: long enough that a transfer in flight never leaves
// the thread (loopback refills a socket within microseconds), short enough
// that the source's deadline and a Close from elsewhere (which waits for the
// callback to return) are honoured within it.
var socketPollWait = 50 * time.Millisecond

// fillFromSocket fills buf from src: first the bytes src buffered, then the
// socket itself within one ReadSocket call, by non-blocking reads that wait
// in poll(2) on this thread when the socket runs dry. A ring slot so filled
// costs no per-read deadline and no netpoller park and wake-up of the
// goroutine, which on the H200 (recv-bench, ring-4x2048 against -poll, TCP
// loopback) moved 0.87–0.89 of a raw read loop against 0.93–0.95
// (docs/benchmarks/README.md, 23). It returns the bytes it put in buf; it
// reads nothing past buf, so what follows in the stream stays there.
func fillFromSocket(src SocketSource, buf []byte) (int, error) {
	got := 0
	if b := src.Buffered(); b > 0 {
		n, err := io.ReadFull(src, buf[:min(b, len(buf))])
		got += n
		if err != nil {
			return got, err
		}
	}
	if got == len(buf) {
		return got, nil
	}
	wait := int(socketPollWait / time.Millisecond)
	err := src.ReadSocket(func(fd uintptr) (int, bool, error) {
		moved := 0
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for got < len(buf) {
			n, err := unix.Read(int(fd), buf[got:])
			switch {
			case err == unix.EINTR:
			case err == unix.EAGAIN:
				k, perr := unix.Poll(pfd, wait)
				switch {
				case perr == unix.EINTR:
				case perr != nil:
					return moved, true, os.NewSyscallError("poll", perr)
				case k == 0:
					return moved, false, nil // idle: the netpoller waits, under the deadline
				}
			case err != nil:
				return moved, true, os.NewSyscallError("read", err)
			case n == 0:
				return moved, true, io.ErrUnexpectedEOF // the client closed its end
			default:
				got += n
				moved += n
			}
		}
		return moved, true, nil
	})
	return got, err
}
