//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/hydra-engine/hydra-engine/iface"
	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// The pipe variant of a shm STATE_PUT. When the state comes from a socket
// (SocketSource) and the plugin reads pipes (DataPlaneResponse.pipe_put), the
// host passes the read end of a pipe in place of the ring and splices the
// client's socket into it: page references move, no byte is copied by the
// host, and the plugin's read(2) is the only copy, straight into its own
// destination, where with the ring the host's socket read is a copy on one
// core that sets the pace. With one pipe the
// control socket carries only the host's END(total) or ABORT, after the last
// byte; with several (splicePipes) also a FILLED(k, n) for each run of
// bytes the host put in pipe k.

// pipeSet is the pipes a spliced restore fills in turn, host side.
type pipeSet struct {
	w    []*os.File // the pipes' write ends, in the poller (non-blocking)
	size int        // a pipe's capacity
}

// pipeTransfer is one piped restore on the host side.
type pipeTransfer struct {
	pipeSet
	id   uint64
	ctrl *ctrlConn
}

// pipeSize is the capacity a transfer's pipe asks for: the default
// /proc/sys/fs/pipe-max-size, which an unprivileged process may not exceed.
// It does not follow state_chunk_size: a restore through a pipe has no chunks
// (the host splices whatever the socket holds), and a small pipe only adds
// wake-ups.
const pipeSize = 1 << 20

// newPipe returns a non-blocking pipe of pipeSize where the kernel allows it
// (a user over fs.pipe-user-pages-soft keeps the default), and its capacity.
func newPipe() (r, w, size int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return -1, -1, 0, fmt.Errorf("pipe2: %w", err)
	}
	size, err = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, pipeSize)
	if err != nil {
		size, err = unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0)
	}
	if err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return -1, -1, 0, fmt.Errorf("sizing the transfer pipe: %w", err)
	}
	return p[0], p[1], size, nil
}

// newPipeSet makes n pipes: their read ends, and the set of write ends.
func newPipeSet(n int) (rs []int, ps pipeSet, err error) {
	for range n {
		pr, pw, size, err := newPipe()
		if err != nil {
			closeFDs(rs)
			ps.closePipes()
			return nil, pipeSet{}, err
		}
		rs = append(rs, pr)
		ps.w = append(ps.w, os.NewFile(uintptr(pw), "hydra-state-pipe"))
		if ps.size == 0 || size < ps.size {
			ps.size = size
		}
	}
	return rs, ps, nil
}

// beginPipe sets up a piped restore through n pipes and hands their read
// ends and a control socket to the plugin.
func (h *Host) beginPipe(n int) (*pipeTransfer, error) {
	rs, ps, err := newPipeSet(n)
	if err != nil {
		return nil, err
	}
	defer closeFDs(rs) // the plugin has its copies once handed off
	t := &pipeTransfer{pipeSet: ps}
	if t.id, t.ctrl, err = h.handOff(rs, n, 0); err != nil {
		t.closePipes()
		return nil, err
	}
	return t, nil
}

func (ps *pipeSet) closePipes() {
	for _, w := range ps.w {
		w.Close()
	}
}

// unblock makes a feeder waiting for room in a pipe give up (its reader
// returned, or the transfer was cancelled).
func (ps *pipeSet) unblock() {
	for _, w := range ps.w {
		w.SetWriteDeadline(time.Unix(1, 0))
	}
}

// closeFDs closes raw descriptors not (or no longer) owned by an os.File.
func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func (t *pipeTransfer) close() {
	t.closePipes()
	t.ctrl.close()
}

// statePutPipe is statePutShm through pipes fed by splice from src.
// The plugin sums the bytes it reads for sum, where given.
func (c *Client) statePutPipe(ctx context.Context, slot int, tokens []int32, src SocketSource, size int64, sum *SumReader) (int64, error) {
	t, err := c.host.beginPipe(max(1, c.pipes))
	if err != nil {
		return 0, err
	}
	defer t.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A plugin that returned, or a cancelled transfer, must not leave the
	// feeder waiting for room in a pipe nobody reads.
	defer context.AfterFunc(ctx, t.unblock)()
	resc := make(chan shmResult, 1)
	var md metadata.MD
	req := &backendv1.StatePutShmRequest{
		Slot: int64(slot), Tokens: tokens, Size: size,
		Transfer: &backendv1.ShmTransfer{Id: t.id, ChunkSize: int64(t.size), Depth: int64(len(t.w)), CtrlVersion: ctrlVersion, Pipe: true},
	}
	if sum != nil {
		req.Sum, req.SumSeed = true, sum.CRC
	}
	go func() {
		resp, err := c.rpc.StatePutShm(ctx, req, grpc.Trailer(&md))
		t.unblock()
		resc <- shmResult{resp.GetConsumed(), err}
	}()
	sent, rerr, pluginDone := t.feed(ctx, src, size, func(k int, n int64) error {
		return t.ctrl.send(msgFilled, uint32(k), uint64(n))
	})
	endPut(t.ctrl, sent, rerr, pluginDone)
	t.closePipes() // after the message: the plugin's read sees the end only then
	res := <-resc
	if sum != nil {
		pipeSum(sum, md, sent)
	}
	return putResult(res, rerr, pluginDone)
}

// pipeSum takes the plugin's sum of a piped restore into sum: the bytes it
// read from the pipes, which must be the sent the host spliced into them;
// any other count (the plugin stopped reading, or did not say) loses the
// bytes it left for the sum.
func pipeSum(sum *SumReader, md metadata.MD, sent int64) {
	var crc uint32
	var n int64
	v := md.Get(sumMetaKey)
	if len(v) != 1 {
		sum.Lost = true
		return
	}
	if _, err := fmt.Sscanf(v[0], "%x:%d", &crc, &n); err != nil || n != sent {
		sum.Lost = true
		return
	}
	sum.CRC, sum.N = crc, sum.N+n
}

// pipeSumMeta is a piped restore's sum as the plugin returns it.
func pipeSumMeta(crc uint32, n int64) metadata.MD {
	return metadata.Pairs(sumMetaKey, fmt.Sprintf("%08x:%d", crc, n))
}

// pipeCursor tracks where the next bytes of a piped restore go. With one
// pipe they all go to it and the plugin reads them as they come. With more,
// segments of half a pipe go to the pipes in turn, and the plugin learns of
// each pipe's bytes from a FILLED message: when a segment is complete, and
// before the host waits for room in a full pipe (the plugin must then empty
// it: a pipe holds a page reference a socket buffer, so small writes by the
// client can fill it with far fewer bytes than a segment).
type pipeCursor struct {
	t       *pipeSet
	tell    func(k int, n int64) error
	k       int   // the pipe being filled
	pending int64 // bytes in it the plugin has not been told of
	segLeft int64 // room left in the segment
}

func (ps *pipeSet) cursor(tell func(k int, n int64) error) *pipeCursor {
	return &pipeCursor{t: ps, tell: tell, segLeft: int64(ps.size / 2)}
}

// limit caps a write of want bytes to the current segment.
func (c *pipeCursor) limit(want int64) int64 {
	if len(c.t.w) == 1 {
		return want
	}
	return min(want, c.segLeft)
}

// wrote records n bytes put in the current pipe, moving to the next pipe at
// the end of a segment.
func (c *pipeCursor) wrote(n int) error {
	if len(c.t.w) == 1 {
		return nil
	}
	c.pending += int64(n)
	if c.segLeft -= int64(n); c.segLeft > 0 {
		return nil
	}
	if err := c.announce(); err != nil {
		return err
	}
	c.k = (c.k + 1) % len(c.t.w)
	c.segLeft = int64(c.t.size / 2)
	return nil
}

// announce tells the reader of the current pipe's pending bytes.
func (c *pipeCursor) announce() error {
	if c.pending == 0 {
		return nil
	}
	if err := c.tell(c.k, c.pending); err != nil {
		return err
	}
	c.pending = 0
	return nil
}

// feed moves size bytes of src into the pipes: what src buffered by writing
// it, the rest by splicing, at most half a pipe a call. A splice holds the
// pipe's lock while it takes the socket's data, and the plugin's read needs
// it too: an uncapped splice, which goes on while the client keeps sending,
// starves the reader. rerr is src failing or ending early (or the transfer
// being cancelled); pluginDone the reader no longer reading. With more than
// one pipe, tell says pipe k holds n more bytes (an error: the reader is gone).
func (t *pipeSet) feed(ctx context.Context, src SocketSource, size int64, tell func(k int, n int64) error) (sent int64, rerr error, pluginDone bool) {
	short := func(err error) error {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("state reader ended after %d of %d bytes: %w", sent, size, io.ErrUnexpectedEOF)
		}
		return err
	}
	cur := t.cursor(tell)
	clock := traceOf(ctx)
	fds, err := t.fds()
	if err != nil {
		return 0, err, false
	}
	if b := min(int64(src.Buffered()), size); b > 0 {
		buf := make([]byte, b)
		m, err := io.ReadFull(src, buf)
		sent += int64(m)
		if err != nil {
			return sent, short(err), false
		}
		if cur.write(fds, buf, clock) != nil {
			return sent, ctx.Err(), true
		}
	}
	for sent < size {
		s := spliceOnce(src, fds[cur.k], cur.limit(min(size-sent, int64(t.size/2))))
		sent += int64(s.moved)
		if s.moved > 0 && cur.wrote(s.moved) != nil {
			return sent, ctx.Err(), true
		}
		switch {
		case s.gone:
			return sent, ctx.Err(), true
		case s.err != nil:
			return sent, short(s.err), false
		case s.full:
			if cur.waitRoom(clock) != nil {
				return sent, ctx.Err(), true
			}
		}
	}
	if cur.announce() != nil { // the last segment's bytes
		return sent, ctx.Err(), true
	}
	return sent, nil, false
}

// fds are the pipes' write ends as raw descriptors, for splice and write
// (not Fd(): that would make them blocking; t.w stays open while feed runs).
func (t *pipeSet) fds() ([]int, error) {
	fds := make([]int, len(t.w))
	for i, w := range t.w {
		raw, err := w.SyscallConn()
		if err != nil {
			return nil, err
		}
		raw.Control(func(fd uintptr) { fds[i] = int(fd) })
	}
	return fds, nil
}

// write puts buf, bytes the source held in memory, into the pipes without
// waiting in the write (with several pipes the plugin reads one only once
// told of its bytes). An error: the reader is gone.
func (c *pipeCursor) write(fds []int, buf []byte, clock waitClock) error {
	for len(buf) > 0 {
		w, werr := unix.Write(fds[c.k], buf[:c.limit(int64(len(buf)))])
		switch {
		case werr == unix.EAGAIN:
			if err := c.waitRoom(clock); err != nil {
				return err
			}
			continue
		case werr == unix.EINTR:
			continue
		case werr != nil:
			return werr
		}
		buf = buf[w:]
		if err := c.wrote(w); err != nil {
			return err
		}
	}
	return nil
}

// spliced is what one spliceOnce did: bytes moved, the pipe found full, the
// plugin gone (EPIPE), or the socket's error.
type spliced struct {
	moved      int
	full, gone bool
	err        error
}

// spliceOnce splices up to want bytes from src's socket into the pipe pfd,
// waiting for the socket when it is empty. EAGAIN means a full pipe or an
// empty socket. Only this loop writes to the pipe, so once it was seen with
// room it keeps it, and EAGAIN then means the socket (the plugin may have
// emptied the pipe between the splice and the look: waiting on the socket
// then could wait for bytes that have long arrived).
func spliceOnce(src SocketSource, pfd int, want int64) (s spliced) {
	room := false
	s.err = src.ReadSocket(func(sfd uintptr) (int, bool, error) {
		for {
			n, err := unix.Splice(int(sfd), nil, pfd, nil, int(want),
				unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MORE)
			switch {
			case err == unix.EINTR:
				continue
			case err == unix.EAGAIN && room:
				return 0, false, nil // the socket: wait for it
			case err == unix.EAGAIN:
				if s.full = pipeFull(pfd); s.full {
					return 0, true, nil
				}
				room = true
				continue
			case err == unix.EPIPE: // the plugin closed the pipe
				s.gone = true
				return 0, true, nil
			case err != nil:
				return 0, true, os.NewSyscallError("splice", err)
			case n == 0:
				return 0, true, io.ErrUnexpectedEOF // the client closed its end
			}
			s.moved = int(n)
			return s.moved, true, nil
		}
	})
	return s
}

// waitRoom waits in the poller until the current pipe has room, having told
// its reader of the bytes it holds first (the reader must empty it, see
// pipeCursor). An error: the reader is gone (a control socket the plugin
// closed) or the transfer was cancelled.
func (c *pipeCursor) waitRoom(clock waitClock) error {
	if err := c.announce(); err != nil {
		return err
	}
	raw, err := c.t.w[c.k].SyscallConn()
	if err != nil {
		return err
	}
	waited := clock.now()
	err = raw.Write(func(fd uintptr) bool { return !pipeFull(int(fd)) })
	clock.since(waited)
	return err
}

// pipeFull reports whether a write to the pipe would block now (a pipe
// without reader is not full: the write fails at once).
func pipeFull(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 0
	}
}

// Plugin side.

// openPipes makes the pipe fds of a transfer readers in the poller.
func openPipes(fds []int) ([]*os.File, error) {
	for _, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			return nil, fmt.Errorf("%w: the shm transfer's descriptor is not a pipe", iface.ErrBadRequest)
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			return nil, err
		}
	}
	pipes := make([]*os.File, len(fds))
	for i, fd := range fds {
		pipes[i] = os.NewFile(uintptr(fd), "hydra-state-pipe")
	}
	return pipes, nil
}

// pipeReader reads a piped restore: exactly remain bytes from the pipes (one
// as the bytes come, or several in the order the host's FILLED messages
// give), then the host's END (io.EOF) or ABORT.
type pipeReader struct {
	t      *pluginTransfer
	remain int64
	total  int64
	sum    bool // sum what is read into crc (StatePutShmRequest.sum)
	crc    uint32
	k      int   // the pipe being read
	told   int64 // with several pipes: bytes pipe k holds for us, not read yet
	err    error
}

func (r *pipeReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.remain == 0 {
		if r.err = r.end(); r.err == nil {
			r.err = io.EOF
		}
		return 0, r.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	want := min(int64(len(p)), r.remain)
	multi := len(r.t.pipes) > 1
	if multi {
		if r.told == 0 {
			if r.err = r.next(); r.err != nil {
				return 0, r.err
			}
		}
		want = min(want, r.told)
	}
	n, err := r.t.pipes[r.k].Read(p[:want])
	if r.sum {
		r.crc = crc32.Update(r.crc, castagnoli, p[:n])
	}
	r.remain -= int64(n)
	r.total += int64(n)
	if multi {
		r.told -= int64(n)
	}
	switch {
	case err == io.EOF: // closed early: the control socket says why
		if r.err = r.end(); r.err == nil {
			r.err = fmt.Errorf("shm data plane: the state pipe closed after %d bytes: %w", r.total, io.ErrUnexpectedEOF)
		}
	case err != nil:
		r.err = fmt.Errorf("shm data plane: reading the state pipe: %w: %w", err, io.ErrUnexpectedEOF)
	}
	if n > 0 {
		return n, nil // the error, if any, comes with the next Read
	}
	return 0, r.err
}

// next takes the host's word of where the next bytes are: FILLED(k, n), pipe
// k holds n more.
func (r *pipeReader) next() error {
	kind, k, n, err := r.t.ctrl.recv()
	if err := hostStopped(kind, err); err != nil {
		return err
	}
	switch {
	case kind == msgEnd:
		return fmt.Errorf("shm data plane: host ended after %d bytes, %d short: %w", n, r.remain, io.ErrUnexpectedEOF)
	case kind != msgFilled:
		return fmt.Errorf("shm data plane: unexpected message %d from the host", kind)
	case int(k) >= len(r.t.pipes) || n == 0 || n > uint64(r.remain):
		return fmt.Errorf("shm data plane: host announced %d bytes in pipe %d of %d, %d to come", n, k, len(r.t.pipes), r.remain)
	}
	r.k, r.told = int(k), int64(n)
	return nil
}

// end takes the host's closing message.
func (r *pipeReader) end() error {
	kind, _, n, err := r.t.ctrl.recv()
	if err := hostStopped(kind, err); err != nil {
		return err
	}
	switch {
	case kind != msgEnd:
		return fmt.Errorf("shm data plane: unexpected message %d from the host", kind)
	case r.remain != 0 || n != uint64(r.total):
		return fmt.Errorf("shm data plane: host ended after %d bytes, %d short: %w", n, r.remain, io.ErrUnexpectedEOF)
	}
	return nil
}

// drain reads to the end so the host's feeding completes.
func (r *pipeReader) drain() error {
	buf := make([]byte, 64<<10)
	for {
		if _, err := r.Read(buf); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}
