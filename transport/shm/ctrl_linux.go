//go:build linux

package shm

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The shm data plane's control socket: one SOCK_SEQPACKET pair per transfer.
// Each datagram carries one or more 16-byte messages.

// Control message kinds; a message is [u32 kind][u32 buffer][u64 n].
const (
	msgFilled uint32 = 1 // buffer k holds n bytes
	msgFree   uint32 = 2 // buffer k may be refilled
	msgEnd    uint32 = 3 // no more buffers; n = bytes in all
	msgAbort  uint32 = 4 // the sender gives up
)

const ctrlMsgSize = 16

// ctrlVersion is the control socket format both sides speak: up to
// ctrlMaxBatch messages per datagram. A peer that announces another
// (DataPlaneResponse, ShmTransfer) is refused, and the host falls back to
// gRPC streams.
const ctrlVersion = 1

// ctrlMaxBatch bounds the messages of one datagram: half the deepest ring
// (64) plus an END or ABORT, with room to spare. A datagram longer than the
// receive buffer would be cut short, so both sides rely on it.
const ctrlMaxBatch = 64

// ctrlConn is one transfer's control socket. FILLED and FREE messages are
// posted, and sent in batches of up to batch messages in one datagram: the peer, when it waits, wakes once a
// batch instead of once a buffer, and each side makes one system call a
// batch (a wake-up across processes costs more than the 16-byte message). A
// side flushes what it holds before it waits itself, so holding messages
// never deadlocks the pair; the messages and their order are those of an
// unbatched sender.
type ctrlConn struct {
	c     *net.UnixConn
	raw   syscall.RawConn
	batch int
	held  []byte    // posted messages not yet sent
	queue []ctrlMsg // received messages; queue[head:] not yet taken, in order
	head  int
	rbuf  [ctrlMaxBatch * ctrlMsgSize]byte
}

// ctrlBatchBytes is the most ring bytes a batch holds back: a message a
// buffer costs the peer a wake-up a buffer at small chunks, while at large
// ones held buffers would tell the peer of the state a whole buffer late.
const ctrlBatchBytes = 1 << 20

// ctrlBatch is how many messages a side holds back on a ring of depth
// buffers of chunk bytes: up to half the ring, so the peer always has the
// other half to work on, and no more than ctrlBatchBytes of buffers.
func ctrlBatch(depth, chunk int) int {
	n := max(1, depth/2)
	if chunk > 0 {
		n = min(n, max(1, ctrlBatchBytes/chunk))
	}
	return min(n, ctrlMaxBatch-1)
}

// newCtrlConn wraps fd for a ring of depth buffers of chunk bytes.
func newCtrlConn(fd int, depth, chunk int) (*ctrlConn, error) {
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
	return &ctrlConn{c: uc, raw: raw, batch: ctrlBatch(depth, chunk)}, nil
}

// post queues a FILLED or FREE message, sending the queue once it holds a
// batch.
func (c *ctrlConn) post(kind, k uint32, n uint64) error {
	c.held = appendMsg(c.held, kind, k, n)
	if len(c.held) >= c.batch*ctrlMsgSize {
		return c.flush()
	}
	return nil
}

// appendMsg appends one encoded message to b.
func appendMsg(b []byte, kind, k uint32, n uint64) []byte {
	b = binary.LittleEndian.AppendUint32(b, kind)
	b = binary.LittleEndian.AppendUint32(b, k)
	return binary.LittleEndian.AppendUint64(b, n)
}

// send sends a message now, after any held ones (END and ABORT).
func (c *ctrlConn) send(kind, k uint32, n uint64) error {
	if err := c.post(kind, k, n); err != nil {
		return err
	}
	return c.flush()
}

// flush sends the held messages, in order, in one datagram.
func (c *ctrlConn) flush() error {
	if len(c.held) == 0 {
		return nil
	}
	if _, err := c.c.Write(c.held); err != nil {
		return err
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
	if c.queued() {
		return c.pop(), true, nil
	}
	n, rerr, err := c.recvNow()
	if err == nil && rerr == nil && n == 0 {
		// The end, or a message sent just before it (see recv): look again.
		n, rerr, err = c.recvNow()
	}
	if err != nil {
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
	if err := c.decode(n); err != nil {
		return m, false, err
	}
	return c.pop(), true, nil
}

// recvNow is one non-blocking read of a datagram into rbuf: its length and
// the read's error (EAGAIN: none there), or the connection's error.
func (c *ctrlConn) recvNow() (n int, rerr, err error) {
	err = c.raw.Read(func(fd uintptr) bool {
		n, _, _, _, rerr = unix.Recvmsg(int(fd), c.rbuf[:], nil, unix.MSG_DONTWAIT)
		return true
	})
	return n, rerr, err
}

// unpoll puts back the message poll just returned, for the next poll or recv.
func (c *ctrlConn) unpoll(m ctrlMsg) {
	c.head--
	c.queue[c.head] = m
}

func (c *ctrlConn) queued() bool { return c.head < len(c.queue) }

func (c *ctrlConn) pop() ctrlMsg {
	m := c.queue[c.head]
	c.head++
	return m
}

// decode queues the messages of a datagram of n bytes.
func (c *ctrlConn) decode(n int) error {
	if n == 0 || n%ctrlMsgSize != 0 || n > len(c.rbuf) {
		return fmt.Errorf("shm control datagram of %d bytes", n)
	}
	if !c.queued() {
		c.queue, c.head = c.queue[:0], 0
	}
	for b := c.rbuf[:n]; len(b) > 0; b = b[ctrlMsgSize:] {
		c.queue = append(c.queue, ctrlMsg{binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint64(b[8:])})
	}
	return nil
}

// recv returns the next message. Messages still held are sent first if it
// would have to wait.
func (c *ctrlConn) recv() (kind, k uint32, n uint64, err error) {
	if !c.queued() && len(c.held) > 0 {
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
	if !c.queued() {
		r, err := c.c.Read(c.rbuf[:])
		if err == io.EOF {
			// Linux reports the peer's close to a non-blocking read that
			// found the queue empty even when the peer's last message landed
			// between that look and the close (af_unix.c,
			// __unix_dgram_recvmsg): a plugin that sends END and closes at
			// once lost its END about once in 20,000 STATE_GETs. The message
			// is queued by the time the close shows, so one more look finds it.
			m, ok, perr := c.poll()
			switch {
			case ok:
				return m.kind, m.k, m.n, nil
			case perr != nil:
				return 0, 0, 0, perr
			}
		}
		if err != nil {
			return 0, 0, 0, err
		}
		if err := c.decode(r); err != nil {
			return 0, 0, 0, err
		}
	}
	m := c.pop()
	return m.kind, m.k, m.n, nil
}

func (c *ctrlConn) close() { c.c.Close() }
