//go:build linux

package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	pipeCap    = 1 << 20   // the host's pipeSize
	pipeSeg    = 512 << 10 // a segment with more than one pipe: half a pipe
	consumeBuf = 16 << 20  // the llama plugin's restore ring, read into in turn
	relaySlots = 4         // -relay: the host's ring at depth 4 and 2 MiB chunks
	relaySlot  = 2 << 20
)

func parsePipeVariant(v variant) (variant, error) {
	parts := strings.Split(v.name, "-")
	if _, err := fmt.Sscanf(parts[1], "%d", &v.pipes); err != nil || v.pipes < 1 || v.pipes > 8 || parts[1] != fmt.Sprint(v.pipes) {
		return v, fmt.Errorf("variant %q: want pipe-N, N from 1 to 8", v.name)
	}
	v.msgs = v.pipes > 1
	for _, p := range parts[2:] {
		switch {
		case v.pipes == 1:
			return v, fmt.Errorf("variant %q: unknown suffix %q", v.name, p)
		case p == "nomsg":
			v.msgs = false
		case p == "relay":
			v.relay = true
		default:
			return v, fmt.Errorf("variant %q: unknown suffix %q", v.name, p)
		}
	}
	if v.relay && !v.msgs {
		return v, fmt.Errorf("variant %q: a relay needs to be told of the segments", v.name)
	}
	return v, nil
}

// pipeReceiver splices each transfer into the pipes while a consumer
// goroutine reads them, and returns once the consumer has every byte.
func (v variant) pipeReceiver() (receiver, error) {
	type pipe struct{ r, w int }
	pipes := make([]pipe, v.pipes)
	for i := range pipes {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return nil, err
		}
		if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, pipeCap); err != nil {
			return nil, err
		}
		pipes[i] = pipe{p[0], p[1]}
	}
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, consumeBuf)
	slot, segs := len(buf), make(chan int64, 2*v.pipes)
	var ctrl [2]int
	if v.relay {
		if buf, err = shmMap(relaySlots * relaySlot); err != nil {
			return nil, err
		}
		if ctrl, err = drainedCtrl(); err != nil {
			return nil, err
		}
		slot = relaySlot
	}
	// consume reads size bytes: from the one pipe as they come, or segment
	// by segment from the pipes in turn (after each segment's datagram, or
	// for a relay its word on the channel).
	consume := func(size int64) error {
		off, msg, slotMsg := 0, make([]byte, 8), make([]byte, 16)
		for k, rem := 0, size; rem > 0; k++ {
			seg := rem
			if v.pipes > 1 {
				seg = min(rem, pipeSeg)
			}
			if v.msgs {
				var n int64
				if v.relay {
					n = <-segs
				} else if _, err := unix.Read(sp[1], msg); err != nil {
					return err
				} else {
					n = int64(binary.LittleEndian.Uint64(msg))
				}
				if n != seg {
					return fmt.Errorf("segment %d: told %d bytes, want %d", k, n, seg)
				}
			}
			fd := pipes[k%v.pipes].r
			for seg > 0 {
				if off == len(buf) {
					off = 0
				}
				end := min(len(buf), (off/slot+1)*slot) // the end of the slot
				n, err := unix.Read(fd, buf[off:off+int(min(seg, int64(end-off)))])
				switch {
				case err == unix.EINTR:
					continue
				case err != nil:
					return err
				case n == 0:
					return io.ErrUnexpectedEOF
				}
				off += n
				seg -= int64(n)
				rem -= int64(n)
				if v.relay && (off%slot == 0 || rem == 0) {
					if _, err := unix.Write(ctrl[0], slotMsg); err != nil {
						return err
					}
				}
			}
		}
		return nil
	}
	msg := make([]byte, 8)
	return func(c net.Conn, size int64) error {
		raw, err := rawConn(c, "pipe variants")
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- consume(size) }()
		var sent int64
		for sent < size {
			k := 0
			limit := min(size-sent, pipeCap/2)
			if v.pipes > 1 {
				k = int(sent/pipeSeg) % v.pipes
				limit = min(limit, pipeSeg-sent%pipeSeg)
			}
			pfd := pipes[k].w
			var n int64
			var serr error
			if err := raw.Read(func(fd uintptr) bool {
				for {
					m, err := unix.Splice(int(fd), nil, pfd, nil, int(limit), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MORE)
					switch {
					case err == unix.EINTR:
						continue
					case err == unix.EAGAIN:
						// A full pipe: wait on this thread for room. Else
						// the socket is empty: wait in the poller.
						p := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLOUT}}
						if k, _ := unix.Poll(p, 0); k == 0 {
							unix.Poll(p, -1)
							continue
						}
						return false
					case err != nil:
						serr = err
					case m == 0:
						serr = io.ErrUnexpectedEOF
					}
					n = m
					return true
				}
			}); err != nil {
				return err
			}
			if serr != nil {
				return serr
			}
			sent += n
			if v.msgs && (sent%pipeSeg == 0 || sent == size) {
				seg := sent % pipeSeg
				if seg == 0 {
					seg = pipeSeg
				}
				if v.relay {
					segs <- seg
					continue
				}
				binary.LittleEndian.PutUint64(msg, uint64(seg))
				if _, err := unix.Write(sp[0], msg); err != nil {
					return err
				}
			}
		}
		return <-done
	}, nil
}
