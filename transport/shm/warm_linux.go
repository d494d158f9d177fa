//go:build linux

package shm

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// A restore the host reads from the client's socket into the ring (a Unix
// socket at a chunk size the plugin takes no pipes for) loads the ring's next
// putWarm bytes into the reading core's cache while the socket is empty, so
// the kernel's copy lands in cached memory as a raw reader's does; the why and
// the measurements are in docs/design/data-plane.md.
const putWarm = 1 << 20

// warmer loads the bytes of a ring ahead of a write position.
type warmer struct {
	mem   []byte
	ahead int
	pos   int  // bytes loaded past the write position at
	at    int  // the write position pos counts from (an offset into mem)
	sink  byte // keeps the loads
}

// New is a warmer of mem that keeps ahead bytes loaded.
func newWarmer(mem []byte, ahead int) *warmer {
	return &warmer{mem: mem, ahead: min(ahead, len(mem))}
}

// touch loads one byte a cache line of up to step more bytes ahead of the
// write position at (an offset into the ring, wrapping at its end); false
// once ahead bytes past at are loaded. Moving at forward by n keeps what
// was loaded beyond it.
func (w *warmer) touch(at, step int) bool {
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
// (a warmer's touch returning false: the ring ahead is loaded) or to read
// again at once, or fails the fill. The peer's close is io.ErrUnexpectedEOF.
func fillSocket(fd uintptr, buf []byte, got *int, empty func(got int) (wait bool, err error)) (moved int, done bool, err error) {
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

// fillWarm fills buf, at bytes into w's ring (ringwarm), from src: bytes src holds in
// memory first, then non-blocking reads of its socket, warming the bytes
// ahead whenever the socket is empty and waiting on it once they are warm.
// It returns the bytes it filled, with io.ErrUnexpectedEOF if the peer closed
// first.
func fillWarm(src SocketSource, buf []byte, w *warmer, at int) (int, error) {
	got := 0
	for got < len(buf) && src.Buffered() > 0 {
		n, err := src.Read(buf[got:min(len(buf), got+src.Buffered())])
		got += n
		if err != nil {
			return got, err
		}
	}
	if got == len(buf) {
		return got, nil
	}
	touch := func(got int) (bool, error) { return !w.touch(at+got, 16<<10), nil }
	err := src.ReadSocket(func(fd uintptr) (int, bool, error) { return fillSocket(fd, buf, &got, touch) })
	return got, err
}
