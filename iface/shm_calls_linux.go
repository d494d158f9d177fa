//go:build linux

package iface

import (
	"context"
	"errors"
	"fmt"
	"io"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
	"github.com/hydra-engine/hydra-engine/internal/ringwarm"
)

// Host side: GRPCClient over the shared-memory plane.

// UseShm routes StateGet and StatePut through h with depth buffers in flight
// (1 = serial: the plugin fills a chunk only once the host has sent the
// previous one; 0 = auto, RingDepth). Call it before the client is used
// concurrently.
func (c *GRPCClient) UseShm(h *ShmHost, depth int) {
	c.shm, c.shmDepth = h, max(depth, 0)
}

// DataPlane asks the plugin whether it serves the shared-memory calls, and
// which control socket format it reads. Call it before UseShm.
func (c *GRPCClient) DataPlane(ctx context.Context) (shm bool, err error) {
	resp, err := c.client.DataPlane(ctx, &backendv1.DataPlaneRequest{})
	if err != nil {
		if errors.Is(fromStatus(err), ErrNotImplemented) {
			return false, nil // an older plugin: gRPC streams only
		}
		return false, fromStatus(err)
	}
	c.shmPeerCtrl, c.shmPipe, c.shmPipeMax = resp.GetCtrlVersion(), resp.GetPipePut(), resp.GetPipePutMaxChunk()
	c.shmPipes = int(min(max(resp.GetPipePutMaxPipes(), 1), MaxSplicePipes))
	return resp.GetShm(), nil
}

// SplicesPuts reports whether restores from sockets may go through a pipe:
// the plugin takes them (DataPlane) and NoSplice is off.
func (c *GRPCClient) SplicesPuts() bool { return c.shm != nil && c.shmPipe && !c.NoSplice }

// SplicePutMaxChunk is the largest state_chunk_size at which the plugin
// takes spliced restores, 0 for any (DataPlane).
func (c *GRPCClient) SplicePutMaxChunk() int64 { return c.shmPipeMax }

// splicesAt reports whether a restore from a socket whose ring would have
// chunk-byte buffers goes through a pipe instead.
func (c *GRPCClient) splicesAt(chunk int) bool {
	return c.SplicesPuts() && (c.shmPipeMax <= 0 || int64(chunk) <= c.shmPipeMax)
}

type shmResult struct {
	n   int64
	err error
}

func (c *GRPCClient) stateGetShm(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
	t, err := c.shm.begin(chunk, RingDepth(c.shmDepth, chunk, 0), c.shmPeerCtrl)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resc := make(chan shmResult, 1)
	go func() {
		resp, err := c.client.StateGetShm(ctx, &backendv1.StateGetShmRequest{
			Slot:     int64(slot),
			Transfer: shmTransfer(t),
		})
		t.failed(err)
		resc <- shmResult{resp.GetWritten(), err}
	}()
	var written int64
	var werr, cerr error // cerr: why the control loop stopped short of END
	ended := false
	clock := traceOf(ctx)
loop:
	for {
		waited := clock.now()
		kind, k, n, err := t.ctrl.recv()
		clock.since(waited)
		if err != nil {
			cerr = err
			break // the plugin closed its end: its result says why
		}
		switch kind {
		case msgFilled:
			if int(k) >= t.ring.depth || n > uint64(t.ring.chunk) {
				werr = fmt.Errorf("shm data plane: bad buffer (%d, %d) from the plugin", k, n)
				break loop
			}
			// Buffers the plugin has already filled after this one, next in
			// the mapping, go out in the same write: one syscall, and one
			// wake-up of the client, for several small chunks.
			last, end := k, uint64(k)*uint64(t.ring.chunk)+n
			for n == uint64(t.ring.chunk) && int(last)+1 < t.ring.depth {
				m, ok, err := t.ctrl.poll()
				if err != nil || !ok {
					break // an error shows again at the next recv
				}
				if m.kind != msgFilled || m.k != last+1 || m.n > uint64(t.ring.chunk) {
					t.ctrl.unpoll(m)
					break
				}
				last, n, end = m.k, m.n, end+m.n
			}
			m, err := w.Write(t.ring.mem[uint64(k)*uint64(t.ring.chunk) : end])
			written += int64(m)
			if err != nil {
				werr = err
				break loop
			}
			for j := k; j <= last; j++ {
				if err := t.ctrl.post(msgFree, j, 0); err != nil {
					break loop // the plugin is gone; its result says why
				}
			}
		case msgEnd:
			ended = uint64(written) == n
			if !ended {
				werr = fmt.Errorf("shm data plane: plugin announced %d bytes, sent %d", n, written)
			}
			break loop
		default: // msgAbort: the plugin failed; its result says why
			cerr = fmt.Errorf("control message %d", kind)
			break loop
		}
	}
	if werr != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		cancel()
	}
	res := <-resc
	t.finish(werr == nil && res.err == nil && ended)
	switch {
	case werr != nil:
		return written, werr
	case res.err != nil:
		return written, fromStatus(res.err)
	case !ended:
		// Say what ended the control loop. Once seen when a read raced the
		// plugin's END and close (ctrlConn.recv looks twice since).
		return written, fmt.Errorf("shm data plane: plugin finished without ending the transfer (control socket: %v)", cerr)
	case res.n != written:
		return written, fmt.Errorf("shm data plane: plugin wrote %d bytes, host received %d", res.n, written)
	}
	return written, nil
}

func (c *GRPCClient) statePutShm(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
	chunk := transferChunk(ctx)
	if chunk <= 0 {
		chunk = c.shmPutChunk()
	}
	if src, ok := r.(SocketSource); ok && c.splicesAt(chunk) {
		return c.statePutPipe(ctx, slot, tokens, src, size)
	}
	chunk = int(min(int64(chunk), max(size, 1)))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if src, ok := r.(SocketSource); ok && !c.NoSplice && size > 0 && c.relays(socketNetwork(src)) {
		rl, err := startRelay(ctx, src, size)
		if err != nil {
			return 0, err
		}
		defer rl.stop()
		r = rl
	}
	t, err := c.shm.begin(chunk, RingDepth(c.shmDepth, chunk, size), c.shmPeerCtrl)
	if err != nil {
		return 0, err
	}
	resc := make(chan shmResult, 1)
	go func() {
		resp, err := c.client.StatePutShm(ctx, &backendv1.StatePutShmRequest{
			Slot: int64(slot), Tokens: tokens, Size: size,
			Transfer: shmTransfer(t),
		})
		t.failed(err)
		resc <- shmResult{resp.GetConsumed(), err}
	}()
	var sent int64
	var rerr error
	pluginDone := false
	clock := traceOf(ctx)
	var warm *ringwarm.Warmer
	wsrc, _ := r.(SocketSource)
	// At most the ring less a buffer: never round to the bytes being written.
	if ahead := min(c.PutWarm, t.ring.size()-t.ring.chunk); ahead > 0 && wsrc != nil {
		warm = ringwarm.New(t.ring.mem, ahead)
	}
	for seq, inflight := 0, 0; sent < size; seq++ {
		if inflight == t.ring.depth {
			waited := clock.now()
			for inflight == t.ring.depth && !pluginDone {
				kind, _, _, err := t.ctrl.recv()
				if err != nil || kind != msgFree {
					pluginDone = true // stopped reading: failed or finished early
				}
				inflight--
			}
			clock.since(waited)
		}
		if pluginDone {
			break
		}
		k := seq % t.ring.depth
		n := int(min(int64(t.ring.chunk), size-sent))
		var m int
		var err error
		if warm != nil {
			m, err = fillWarm(wsrc, t.ring.buf(k)[:n], warm, k*t.ring.chunk)
		} else {
			m, err = io.ReadFull(r, t.ring.buf(k)[:n])
		}
		sent += int64(m)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				err = fmt.Errorf("state reader ended after %d of %d bytes: %w", sent, size, io.ErrUnexpectedEOF)
			}
			rerr = err
			break
		}
		if err := t.ctrl.post(msgFilled, uint32(k), uint64(n)); err != nil {
			pluginDone = true
			break
		}
		inflight++
	}
	endPut(t.ctrl, sent, rerr, pluginDone)
	res := <-resc
	t.finish(rerr == nil && res.err == nil)
	return putResult(res, rerr, pluginDone)
}

// endPut tells the plugin how the feeding of a restore ended: ABORT when the
// state's reader failed (the plugin then fails and empties the slot before
// its call returns, so the caller, waiting for that call, never races a
// running restore), END with the byte count unless the plugin stopped first.
func endPut(ctrl *ctrlConn, sent int64, rerr error, pluginDone bool) {
	if rerr != nil {
		_ = ctrl.send(msgAbort, 0, 0)
	} else if !pluginDone {
		_ = ctrl.send(msgEnd, 0, uint64(sent))
	}
}

// putResult is what a restore came to once the plugin's call returned.
func putResult(res shmResult, rerr error, pluginDone bool) (int64, error) {
	switch {
	case rerr != nil:
		return 0, rerr
	case res.err != nil:
		return 0, fromStatus(res.err)
	case pluginDone:
		return 0, errors.New("shm data plane: plugin stopped reading before the end of the state")
	}
	return res.n, nil
}

// shmTransfer describes t's ring to the plugin.
func shmTransfer(t *hostTransfer) *backendv1.ShmTransfer {
	return &backendv1.ShmTransfer{Id: t.id, ChunkSize: int64(t.ring.chunk), Depth: int64(t.ring.depth), CtrlVersion: ctrlVersion}
}

// shmPutChunk is the ring buffer size for restores: socket reads land in it
// directly, so it only needs to be large enough to amortise the messages.
func (c *GRPCClient) shmPutChunk() int {
	if c.PutPieceSize > 0 {
		return c.PutPieceSize
	}
	return 4 << 20
}

// Plugin side: GRPCServer over the shared-memory plane.

func (s *GRPCServer) DataPlane(context.Context, *backendv1.DataPlaneRequest) (*backendv1.DataPlaneResponse, error) {
	pipe, pipeMax := s.Shm != nil, 0
	if p, ok := s.Impl.(PipePutter); ok {
		pipeMax = p.PipePutMaxChunk()
		pipe = pipe && pipeMax != 0
		pipeMax = max(pipeMax, 0)
	}
	return &backendv1.DataPlaneResponse{Shm: s.Shm != nil, CtrlVersion: ctrlVersion, PipePut: pipe, PipePutMaxChunk: int64(pipeMax), PipePutMaxPipes: MaxSplicePipes}, nil
}

func (s *GRPCServer) StateGetShm(ctx context.Context, req *backendv1.StateGetShmRequest) (*backendv1.StateGetShmResponse, error) {
	if s.Shm == nil {
		return nil, toStatus(fmt.Errorf("%w: plugin has no shm data plane", ErrNotImplemented))
	}
	tr := req.GetTransfer()
	if tr.GetPipe() {
		return nil, toStatus(fmt.Errorf("%w: a state pipe carries restores only", ErrBadRequest))
	}
	t, err := s.Shm.open(ctx, tr)
	if err != nil {
		return nil, toStatus(err)
	}
	defer t.close()
	w := &shmWriter{t: t}
	_, err = s.Impl.StateGet(ctx, int(req.GetSlot()), int(tr.GetChunkSize()), w)
	if err == nil {
		err = w.flush()
	}
	// Wait until the host has sent every buffer: then no message is left
	// unread when the sockets close (an unread message would turn the
	// close into a reset that swallows the end mark), and the end mark means
	// the bytes are out.
	for err == nil && w.inflight > 0 {
		err = w.awaitFree()
	}
	if err == nil {
		err = t.ctrl.send(msgEnd, 0, uint64(w.total))
	}
	if err != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		return nil, toStatus(err)
	}
	return &backendv1.StateGetShmResponse{Written: w.total}, nil
}

func (s *GRPCServer) StatePutShm(ctx context.Context, req *backendv1.StatePutShmRequest) (*backendv1.StatePutResponse, error) {
	if s.Shm == nil {
		return nil, toStatus(fmt.Errorf("%w: plugin has no shm data plane", ErrNotImplemented))
	}
	if req.GetSize() < 0 {
		return nil, toStatus(fmt.Errorf("%w: negative state size", ErrBadRequest))
	}
	tr := req.GetTransfer()
	t, err := s.Shm.open(ctx, tr)
	if err != nil {
		return nil, toStatus(err)
	}
	defer t.close()
	var r interface {
		io.Reader
		drain() error
	} = &shmReader{t: t, remain: req.GetSize()}
	if t.pipes != nil {
		r = &pipeReader{t: t, remain: req.GetSize()}
	}
	n, err := s.Impl.StatePut(ctx, int(req.GetSlot()), req.GetTokens(), r, req.GetSize())
	if err == nil {
		// Success means every byte arrived, as on the gRPC plane.
		err = r.drain()
	}
	if err != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		return nil, toStatus(err)
	}
	return &backendv1.StatePutResponse{Consumed: n}, nil
}
