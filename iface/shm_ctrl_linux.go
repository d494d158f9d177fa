//go:build linux

package iface

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The shm data plane's control socket: one SOCK_SEQPACKET pair per transfer
// carrying 16-byte messages between host and plugin.

// Control message kinds; a message is [u32 kind][u32 buffer][u64 n].
const (
	msgFilled uint32 = 1 // buffer k holds n bytes
	msgFree   uint32 = 2 // buffer k may be refilled
	msgEnd    uint32 = 3 // no more buffers; n = bytes in all
	msgAbort  uint32 = 4 // the sender gives up
)

const ctrlMsgSize = 16

// ctrlConn is one transfer's control socket. FILLED and FREE messages are
// posted, and sent in batches of up to batch: the peer, when it waits, wakes
// once a batch instead of once a buffer (a wake-up across processes costs
// more than the 16-byte message). A side flushes what it holds before it
// waits itself, so holding messages never deadlocks the pair; the messages
// and their order are those of an unbatched sender.
type ctrlConn struct {
	c      *net.UnixConn
	raw    syscall.RawConn
	batch  int
	held   [][ctrlMsgSize]byte
	unread *ctrlMsg // a message poll took and unpoll put back
	rbuf   [ctrlMsgSize]byte
}

// ctrlBatch is how many messages a side holds back on a ring of depth
// buffers: half the ring, so the peer always has the other half to work on.
func ctrlBatch(depth int) int { return max(1, depth/2) }

func newCtrlConn(fd int, depth int) (*ctrlConn, error) {
	f := os.NewFile(uintptr(fd), "hydra-shm-ctrl")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("shm control socket is a %T", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, err
	}
	return &ctrlConn{c: uc, raw: raw, batch: ctrlBatch(depth)}, nil
}

// post queues a FILLED or FREE message, sending the queue once it holds a
// batch.
func (c *ctrlConn) post(kind, k uint32, n uint64) error {
	var m [ctrlMsgSize]byte
	binary.LittleEndian.PutUint32(m[0:], kind)
	binary.LittleEndian.PutUint32(m[4:], k)
	binary.LittleEndian.PutUint64(m[8:], n)
	c.held = append(c.held, m)
	if len(c.held) >= c.batch {
		return c.flush()
	}
	return nil
}

// send sends a message now, after any held ones (END and ABORT).
func (c *ctrlConn) send(kind, k uint32, n uint64) error {
	if err := c.post(kind, k, n); err != nil {
		return err
	}
	return c.flush()
}

// flush sends the held messages, in order.
func (c *ctrlConn) flush() error {
	for i := range c.held {
		if _, err := c.c.Write(c.held[i][:]); err != nil {
			c.held = append(c.held[:0], c.held[i:]...)
			return err
		}
	}
	c.held = c.held[:0]
	return nil
}

// ctrlMsg is a decoded control message.
type ctrlMsg struct {
	kind, k uint32
	n       uint64
}

// poll returns a message that has already arrived, without waiting: ok is
// false when there is none.
func (c *ctrlConn) poll() (m ctrlMsg, ok bool, err error) {
	if c.unread != nil {
		m, c.unread = *c.unread, nil
		return m, true, nil
	}
	var n int
	var rerr error
	if err := c.raw.Read(func(fd uintptr) bool {
		n, _, _, _, rerr = unix.Recvmsg(int(fd), c.rbuf[:], nil, unix.MSG_DONTWAIT)
		return true
	}); err != nil {
		return m, false, err
	}
	switch {
	case rerr == unix.EAGAIN:
		return m, false, nil
	case rerr != nil:
		return m, false, rerr
	case n == 0:
		return m, false, io.EOF // the peer closed its end
	}
	m, err = c.decode(n)
	return m, err == nil, err
}

// unpoll puts back a message poll returned, for the next poll or recv.
func (c *ctrlConn) unpoll(m ctrlMsg) { c.unread = &m }

func (c *ctrlConn) decode(n int) (ctrlMsg, error) {
	if n != ctrlMsgSize {
		return ctrlMsg{}, fmt.Errorf("shm control message of %d bytes", n)
	}
	return ctrlMsg{binary.LittleEndian.Uint32(c.rbuf[0:]), binary.LittleEndian.Uint32(c.rbuf[4:]), binary.LittleEndian.Uint64(c.rbuf[8:])}, nil
}

// recv returns the next message. Messages still held are sent first if it
// would have to wait.
func (c *ctrlConn) recv() (kind, k uint32, n uint64, err error) {
	if len(c.held) > 0 || c.unread != nil {
		// A message may already be there: take it without sending ours.
		m, ok, err := c.poll()
		if err != nil {
			return 0, 0, 0, err
		}
		if ok {
			return m.kind, m.k, m.n, nil
		}
		if err := c.flush(); err != nil {
			return 0, 0, 0, err
		}
	}
	r, err := c.c.Read(c.rbuf[:])
	if err != nil {
		return 0, 0, 0, err
	}
	m, err := c.decode(r)
	return m.kind, m.k, m.n, err
}

func (c *ctrlConn) close() { c.c.Close() }
