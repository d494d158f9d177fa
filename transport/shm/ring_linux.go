//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/iface"
	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// The shared-memory data plane. Per transfer the host creates (or reuses) a
// ring: one memfd of depth chunk-sized buffers, mapped by both processes, and
// a SOCK_SEQPACKET socketpair for 16-byte control messages. It passes the
// memfd and one end of the pair to the plugin over a long-lived Unix socket
// (SCM_RIGHTS; the plugin inherits it as fd HYDRA_SHM_FD), tagged with a
// transfer id that the gRPC call then names. State bytes are written once
// into the ring by the producer and once from the ring into the socket (or
// the reverse), never through gRPC.

// EnvFD names the environment variable carrying the plugin's end of the
// fd-passing socket.
const EnvFD = "HYDRA_SHM_FD"

// errShmAborted is the peer giving up on a transfer.
var errShmAborted = errors.New("shm data plane: transfer aborted by the other side")

// ring is depth buffers of chunk bytes in one shared mapping.
type ring struct {
	fd           int
	mem          []byte
	chunk, depth int
}

func (r *ring) buf(k int) []byte { return r.mem[k*r.chunk : (k+1)*r.chunk : (k+1)*r.chunk] }

func (r *ring) size() int { return r.chunk * r.depth }

func checkGeometry(chunk, depth int64) error {
	if chunk <= 0 || depth <= 0 || depth > 64 || chunk > 1<<30 || chunk*depth > 4<<30 {
		return fmt.Errorf("%w: shm ring of %d × %d bytes", iface.ErrBadRequest, depth, chunk)
	}
	return nil
}

// newRing creates a ring backed by a fresh memfd, its pages populated.
func newRing(chunk, depth int) (*ring, error) {
	fd, err := unix.MemfdCreate("hydra-state-ring", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(chunk*depth)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sizing the shm ring: %w", err)
	}
	r, err := mapRing(fd, chunk, depth)
	if err != nil {
		unix.Close(fd)
	}
	return r, err
}

// mapRing maps an existing ring memfd. MAP_POPULATE builds the page tables at
// once instead of faulting on every page of every chunk.
func mapRing(fd, chunk, depth int) (*ring, error) {
	mem, err := unix.Mmap(fd, 0, chunk*depth, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mapping the shm ring: %w", err)
	}
	return &ring{fd: fd, mem: mem, chunk: chunk, depth: depth}, nil
}

func (r *ring) close() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}

// seqpacketPair returns a connected SOCK_SEQPACKET pair.
func seqpacketPair() (a, b int, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("socketpair: %w", err)
	}
	return fds[0], fds[1], nil
}

// Host is the host's side of the shared-memory plane of one plugin.
type Host struct {
	conn   *net.UnixConn // sends (id, memfd, ctrl) to the plugin
	sendMu sync.Mutex
	nextID atomic.Uint64

	poolMu sync.Mutex
	pool   []*ring // idle rings, reused while their geometry fits
	closed bool
}

// maxIdleRings bounds the rings kept for reuse (concurrent transfers each
// hold one while they run).
const maxIdleRings = 4

// NewHost creates the fd-passing socket; the returned file is the
// plugin's end: pass it as the first of exec.Cmd.ExtraFiles (fd 3) with
// EnvFD=3 in the plugin's environment, then close it once the plugin runs.
func NewHost() (*Host, *os.File, error) {
	a, b, err := seqpacketPair()
	if err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(a), "hydra-shm-host")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(b)
		return nil, nil, err
	}
	return &Host{conn: c.(*net.UnixConn)}, os.NewFile(uintptr(b), "hydra-shm-plugin"), nil
}

// Close releases the socket and the idle rings.
func (h *Host) Close() error {
	h.poolMu.Lock()
	h.closed = true
	for _, r := range h.pool {
		r.close()
	}
	h.pool = nil
	h.poolMu.Unlock()
	return h.conn.Close()
}

// hostTransfer is one transfer in flight on the host side.
type hostTransfer struct {
	h      *Host
	id     uint64
	ring   *ring
	ctrl   *ctrlConn
	shared bool // the ring is a SharedRing: its owner's, neither reused nor unmapped here
}

func (h *Host) ring(chunk, depth int) (*ring, error) {
	h.poolMu.Lock()
	for i, r := range h.pool {
		if r.chunk == chunk && r.depth == depth {
			h.pool = append(h.pool[:i], h.pool[i+1:]...)
			h.poolMu.Unlock()
			return r, nil
		}
	}
	h.poolMu.Unlock()
	return newRing(chunk, depth)
}

// begin sets up a transfer and hands its ring and control socket to the
// plugin.
func (h *Host) begin(chunk, depth int) (*hostTransfer, error) {
	r, err := h.ring(chunk, depth)
	if err != nil {
		return nil, err
	}
	id, ctrl, err := h.handOff([]int{r.fd}, depth, chunk)
	if err != nil {
		r.close()
		return nil, err
	}
	return &hostTransfer{h: h, id: id, ring: r, ctrl: ctrl}, nil
}

// beginShared sets up a transfer on a ring another party owns and hands it
// to the plugin.
func (h *Host) beginShared(sr SharedRing) (*hostTransfer, error) {
	if err := checkGeometry(int64(sr.Chunk), int64(sr.Depth)); err != nil {
		return nil, err
	}
	if len(sr.Mem) < sr.Chunk*sr.Depth {
		return nil, fmt.Errorf("shm data plane: a shared ring of %d × %d bytes in a %d-byte mapping", sr.Depth, sr.Chunk, len(sr.Mem))
	}
	id, ctrl, err := h.handOff([]int{int(sr.File.Fd())}, sr.Depth, sr.Chunk)
	if err != nil {
		return nil, err
	}
	r := &ring{fd: -1, mem: sr.Mem[:sr.Chunk*sr.Depth], chunk: sr.Chunk, depth: sr.Depth}
	return &hostTransfer{h: h, id: id, ring: r, ctrl: ctrl, shared: true}, nil
}

// handOff gives the plugin what a transfer needs: datafds (the ring's memfd,
// or a piped restore's read ends, which the caller keeps) and one end of a
// fresh control socket, tagged with a new transfer id, over the fd-passing
// socket. It returns the id and the host's end of the control socket, for a
// ring of depth buffers of chunk bytes (0 for pipes).
func (h *Host) handOff(datafds []int, depth, chunk int) (uint64, *ctrlConn, error) {
	a, b, err := seqpacketPair()
	if err != nil {
		return 0, nil, err
	}
	defer unix.Close(b) // the plugin has its copy once the message is sent
	ctrl, err := newCtrlConn(a, depth, chunk)
	if err != nil {
		return 0, nil, err
	}
	id := h.nextID.Add(1)
	var idb [8]byte
	binary.LittleEndian.PutUint64(idb[:], id)
	h.sendMu.Lock()
	_, _, err = h.conn.WriteMsgUnix(idb[:], unix.UnixRights(append(datafds[:len(datafds):len(datafds)], b)...), nil)
	h.sendMu.Unlock()
	if err != nil {
		ctrl.close()
		return 0, nil, fmt.Errorf("passing transfer %d to the plugin: %w", id, err)
	}
	return id, ctrl, nil
}

// failed wakes a host waiting on the control socket once the transfer's call
// failed: a plugin that failed before it took the ring and control socket
// (they then wait unread in its receiver) sends nothing more. After a call
// that succeeded every message the host needs is already there.
func (t *hostTransfer) failed(err error) {
	if err != nil {
		t.ctrl.c.SetReadDeadline(time.Unix(1, 0))
	}
}

// finish closes the control socket and keeps the ring for reuse when the
// plugin is known to be done with it (the transfer's RPC returned cleanly).
func (t *hostTransfer) finish(reuse bool) {
	t.ctrl.close()
	if t.shared {
		return
	}
	h := t.h
	h.poolMu.Lock()
	if reuse && !h.closed && len(h.pool) < maxIdleRings {
		h.pool = append(h.pool, t.ring)
		h.poolMu.Unlock()
		return
	}
	h.poolMu.Unlock()
	t.ring.close()
}

// receiver is the plugin's side of the fd-passing socket: it collects the
// rings the host sends, by transfer id, for the gRPC calls that name them.
type receiver struct {
	conn    *net.UnixConn
	mu      sync.Mutex
	pending map[uint64]*shmPending
	err     error // set when the socket fails; later takes fail with it
}

type shmPending struct {
	ready   chan struct{}
	datafds []int // the ring's memfd or the pipes' read ends; nil until they arrive
	ctrlfd  int
	arrived time.Time
}

func (p *shmPending) closeFDs() {
	closeFDs(p.datafds)
	unix.Close(p.ctrlfd)
}

// receiverFromEnv returns the receiver for the socket the host passed, or
// nil when the plugin was started without one (gRPC data plane only).
func receiverFromEnv() *receiver {
	v := os.Getenv(EnvFD)
	if v == "" {
		return nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil
	}
	unix.CloseOnExec(fd)
	r, err := newReceiver(fd)
	if err != nil {
		return nil
	}
	return r
}

func newReceiver(fd int) (*receiver, error) {
	f := os.NewFile(uintptr(fd), "hydra-shm-plugin")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	r := &receiver{conn: c.(*net.UnixConn), pending: map[uint64]*shmPending{}}
	go r.run()
	return r, nil
}

func (r *receiver) run() {
	var idb [8]byte
	oob := make([]byte, unix.CmsgSpace((maxPipes+1)*4))
	for {
		n, oobn, _, _, err := r.conn.ReadMsgUnix(idb[:], oob)
		if err == nil && n != 8 {
			err = fmt.Errorf("shm handoff of %d bytes", n)
		}
		var fds []int
		if err == nil {
			fds, err = parseRights(oob[:oobn])
		}
		if err != nil {
			r.mu.Lock()
			r.err = fmt.Errorf("shm data plane socket: %w", err)
			for id, p := range r.pending {
				if p.datafds == nil {
					close(p.ready)
					delete(r.pending, id)
				}
			}
			r.mu.Unlock()
			return
		}
		r.deliver(binary.LittleEndian.Uint64(idb[:]), fds[:len(fds)-1], fds[len(fds)-1])
	}
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		f, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, err
		}
		fds = append(fds, f...)
	}
	if len(fds) < 2 || len(fds) > maxPipes+1 {
		closeFDs(fds)
		return nil, fmt.Errorf("shm handoff carried %d descriptors, want 2 to %d", len(fds), maxPipes+1)
	}
	for _, fd := range fds {
		unix.CloseOnExec(fd)
	}
	return fds, nil
}

// staleHandoff is how long fds wait for the call that names them.
const staleHandoff = time.Minute

func (r *receiver) deliver(id uint64, datafds []int, ctrlfd int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for oid, p := range r.pending { // a call that never came: drop its fds
		if p.datafds != nil && now.Sub(p.arrived) > staleHandoff {
			p.closeFDs()
			delete(r.pending, oid)
		}
	}
	p, ok := r.pending[id]
	if !ok {
		p = &shmPending{ready: make(chan struct{})}
		r.pending[id] = p
	}
	p.datafds, p.ctrlfd, p.arrived = datafds, ctrlfd, now
	close(p.ready)
}

// take waits for transfer id's fds.
func (r *receiver) take(ctx context.Context, id uint64) (datafds []int, ctrlfd int, err error) {
	r.mu.Lock()
	p, ok := r.pending[id]
	if !ok {
		if r.err != nil {
			r.mu.Unlock()
			return nil, -1, r.err
		}
		p = &shmPending{ready: make(chan struct{}), ctrlfd: -1}
		r.pending[id] = p
	}
	r.mu.Unlock()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case <-p.ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = fmt.Errorf("shm transfer %d: the host's ring never arrived", id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pending, id)
	if err == nil && p.datafds == nil {
		err = r.err
	}
	if err != nil {
		if p.datafds != nil {
			p.closeFDs()
		}
		return nil, -1, err
	}
	return p.datafds, p.ctrlfd, nil
}

// pluginTransfer is one transfer in flight on the plugin side: a ring, or
// for a piped restore its pipes (ring nil).
type pluginTransfer struct {
	ring  *ring
	pipes []*os.File
	ctrl  *ctrlConn
	stop  func() bool
}

// open takes the ring (or pipe) and control socket the host sent for tr.
func (r *receiver) open(ctx context.Context, tr *backendv1.ShmTransfer) (*pluginTransfer, error) {
	id, chunk, depth := tr.GetId(), tr.GetChunkSize(), tr.GetDepth()
	if err := checkGeometry(chunk, depth); err != nil {
		return nil, err
	}
	datafds, ctrlfd, err := r.take(ctx, id)
	if err != nil {
		return nil, err
	}
	ctrl, err := newCtrlConn(ctrlfd, int(depth), int(chunk))
	if err != nil {
		closeFDs(datafds)
		return nil, err
	}
	t := &pluginTransfer{ctrl: ctrl}
	switch {
	case tr.GetPipe() && int64(len(datafds)) == depth:
		t.pipes, err = openPipes(datafds)
	case tr.GetPipe():
		err = fmt.Errorf("%w: the host sent %d pipes for a restore from %d", iface.ErrBadRequest, len(datafds), depth)
	case len(datafds) != 1:
		err = fmt.Errorf("%w: the host sent %d descriptors for a ring", iface.ErrBadRequest, len(datafds))
	default:
		t.ring, err = mapMemfd(datafds[0], chunk, depth)
	}
	if err != nil {
		closeFDs(datafds)
		ctrl.close()
		return nil, err
	}
	// Cancelling the call unblocks a producer or consumer waiting on the host.
	t.stop = context.AfterFunc(ctx, func() {
		ctrl.c.SetDeadline(time.Unix(1, 0))
		for _, p := range t.pipes {
			p.SetReadDeadline(time.Unix(1, 0))
		}
	})
	return t, nil
}

// mapMemfd maps the ring memfd the host sent and closes the descriptor (the
// mapping keeps the memory).
func mapMemfd(memfd int, chunk, depth int64) (*ring, error) {
	var st unix.Stat_t
	if err := unix.Fstat(memfd, &st); err != nil || st.Size < chunk*depth {
		return nil, fmt.Errorf("%w: shm ring smaller than %d × %d", iface.ErrBadRequest, depth, chunk)
	}
	rg, err := mapRing(memfd, int(chunk), int(depth))
	if err != nil {
		return nil, err
	}
	unix.Close(memfd)
	rg.fd = -1
	return rg, nil
}

func (t *pluginTransfer) close() {
	t.stop()
	t.ctrl.close()
	if t.ring != nil {
		t.ring.close()
	}
	for _, p := range t.pipes {
		p.Close()
	}
}

// shmWriter fills the ring's buffers in order and hands each full one to the
// host; it waits for a free buffer when depth of them are in flight.
type shmWriter struct {
	t        *pluginTransfer
	seq      int // index of the buffer being filled, modulo depth
	fill     int // bytes in it
	inflight int
	total    int64
	err      error
}

var _ RegionWriter = (*shmWriter)(nil)

// Region is the whole ring: every buffer Buffer returns lies inside it.
func (w *shmWriter) Region() []byte { return w.t.ring.mem }

func (w *shmWriter) Buffer() ([]byte, error) {
	if w.err != nil {
		return nil, w.err
	}
	if w.fill == 0 {
		for w.inflight == w.t.ring.depth {
			if w.err = w.awaitFree(); w.err != nil {
				return nil, w.err
			}
		}
	}
	return w.t.ring.buf(w.seq % w.t.ring.depth)[w.fill:], nil
}

func (w *shmWriter) awaitFree() error {
	kind, _, _, err := w.t.ctrl.recv()
	switch {
	case err != nil:
		return fmt.Errorf("shm data plane: host gone: %w", err)
	case kind == msgAbort:
		return errShmAborted
	case kind != msgFree:
		return fmt.Errorf("shm data plane: unexpected message %d from the host", kind)
	}
	w.inflight--
	return nil
}

func (w *shmWriter) Commit(n int) error {
	if w.err != nil {
		return w.err
	}
	if n < 0 || w.fill+n > w.t.ring.chunk {
		w.err = fmt.Errorf("shm data plane: commit of %d bytes overflows the buffer", n)
		return w.err
	}
	w.fill += n
	w.total += int64(n)
	if w.fill == w.t.ring.chunk {
		return w.flush()
	}
	return nil
}

// flush hands the current buffer, if it holds anything, to the host.
func (w *shmWriter) flush() error {
	if w.err != nil || w.fill == 0 {
		return w.err
	}
	if err := w.t.ctrl.post(msgFilled, uint32(w.seq%w.t.ring.depth), uint64(w.fill)); err != nil {
		w.err = fmt.Errorf("shm data plane: host gone: %w", err)
		return w.err
	}
	w.inflight++
	w.seq++
	w.fill = 0
	return nil
}

func (w *shmWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		b, err := w.Buffer()
		if err != nil {
			return written, err
		}
		m := copy(b, p)
		if err := w.Commit(m); err != nil {
			return written, err
		}
		p, written = p[m:], written+m
	}
	return written, nil
}

// shmReader yields the buffers the host fills, freeing each once read.
type shmReader struct {
	t      *pluginTransfer
	cur    []byte
	k      uint32
	held   bool
	remain int64 // bytes still announced
	done   bool
	err    error
}

func (r *shmReader) Read(p []byte) (int, error) {
	piece, err := r.Next()
	n := copy(p, piece)
	r.cur = piece[n:] // the rest is read next time, from the same buffer
	return n, err
}

var _ RegionReader = (*shmReader)(nil)

// Region is the ring's mapping, where every piece Next returns lies.
func (r *shmReader) Region() []byte { return r.t.ring.mem }

// Next hands out the rest of the current ring buffer in place; the host gets
// it back (FREE) when the following piece is asked for.
func (r *shmReader) Next() ([]byte, error) {
	if r.err != nil {
		return nil, r.err
	}
	for len(r.cur) == 0 {
		if r.done {
			return nil, io.EOF
		}
		if r.err = r.next(); r.err != nil {
			return nil, r.err
		}
	}
	p := r.cur
	r.cur = nil
	return p, nil
}

// next frees the buffer just consumed and waits for the next one.
func (r *shmReader) next() error {
	if r.held {
		r.held = false
		if err := r.t.ctrl.post(msgFree, r.k, 0); err != nil {
			return fmt.Errorf("shm data plane: host gone: %w", err)
		}
	}
	kind, k, n, err := r.t.ctrl.recv()
	if err := hostStopped(kind, err); err != nil {
		return err
	}
	switch {
	case kind == msgEnd:
		if r.remain != 0 {
			return fmt.Errorf("shm data plane: host ended %d bytes short: %w", r.remain, io.ErrUnexpectedEOF)
		}
		r.done = true
		return nil
	case kind != msgFilled || int(k) >= r.t.ring.depth || n > uint64(r.t.ring.chunk) || int64(n) > r.remain:
		return fmt.Errorf("shm data plane: bad message (%d, %d, %d) from the host", kind, k, n)
	}
	r.cur, r.k, r.held = r.t.ring.buf(int(k))[:n], k, true
	r.remain -= int64(n)
	return nil
}

// hostStopped is the error of a restore whose control read failed (the host
// is gone) or brought ABORT; nil for any other message. Both read as a state
// cut short.
func hostStopped(kind uint32, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("shm data plane: host gone: %w: %w", err, io.ErrUnexpectedEOF)
	case kind == msgAbort:
		return fmt.Errorf("%w: %w", errShmAborted, io.ErrUnexpectedEOF)
	}
	return nil
}

// drain reads to the end so the host's feeding loop completes.
func (r *shmReader) drain() error {
	for r.err == nil && !r.done {
		r.cur = nil
		r.err = r.next()
	}
	if r.err != nil {
		return r.err
	}
	return nil
}
