// Package ringwarm keeps the next bytes of a ring buffer in the reading
// core's cache while a socket reader waits, so the kernel's copy into them
// lands in cached memory (iface/shm_warm_linux.go; recv-bench -warmN), and
// holds the non-blocking read loop such a reader runs (Fill).
package ringwarm

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Warmer loads the bytes of a ring ahead of a write position.
type Warmer struct {
	mem   []byte
	ahead int
	pos   int  // bytes loaded past the write position at
	at    int  // the write position pos counts from (an offset into mem)
	sink  byte // keeps the loads
}

// New is a Warmer of mem that keeps ahead bytes loaded.
func New(mem []byte, ahead int) *Warmer {
	return &Warmer{mem: mem, ahead: min(ahead, len(mem))}
}

// Touch loads one byte a cache line of up to step more bytes ahead of the
// write position at (an offset into the ring, wrapping at its end); false
// once ahead bytes past at are loaded. Moving at forward by n keeps what
// was loaded beyond it.
func (w *Warmer) Touch(at, step int) bool {
	if at != w.at {
		w.pos = max(w.pos-(at-w.at+len(w.mem))%len(w.mem), 0)
		w.at = at
	}
	if w.pos >= w.ahead {
		return false
	}
	end := min(w.pos+step, w.ahead)
	for p := w.pos; p < end; p += 64 {
		w.sink += w.mem[(at+p)%len(w.mem)]
	}
	w.pos = end
	return true
}

// Fill reads the non-blocking socket fd into buf[*got:] until buf is full,
// as a RawConn.Read callback does: it returns what this call read, and done
// false when the caller should wait for the socket to become readable and
// call again. When the socket is empty, empty(*got) says whether to wait
// (a Warmer's Touch returning false: the ring ahead is loaded) or to read
// again at once, or fails the fill. The peer's close is io.ErrUnexpectedEOF.
func Fill(fd uintptr, buf []byte, got *int, empty func(got int) (wait bool, err error)) (moved int, done bool, err error) {
	for *got < len(buf) {
		n, err := unix.Read(int(fd), buf[*got:])
		switch {
		case n > 0:
			*got += n
			moved += n
		case err == unix.EINTR:
		case err == unix.EAGAIN:
			wait, eerr := empty(*got)
			if eerr != nil {
				return moved, true, eerr
			}
			if wait {
				return moved, false, nil
			}
		case err != nil:
			return moved, true, os.NewSyscallError("read", err)
		default:
			return moved, true, io.ErrUnexpectedEOF
		}
	}
	return moved, true, nil
}
