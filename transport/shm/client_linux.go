//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/hydra-engine/hydra-engine/iface"
	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// Client is the host's Backend for a plugin that serves the shared-memory
// plane: StateGet and StatePut move their bytes through the rings and pipes
// of its Host, every other call (and a StateGet without a chunk size) goes
// over gRPC as the embedded client's.
type Client struct {
	*iface.GRPCClient
	rpc  backendv1.BackendClient
	host *Host
	// What the plugin takes (DataPlane): restores through pipes, at chunk
	// sizes up to pipeMax (0: any), from up to pipes pipes in turn.
	pipe    bool
	pipeMax int64
	pipes   int
	pipeSum bool // it sums piped restores for the host (SumReader)

	// Test hooks, set by Connect to the product's behaviour: depth buffers
	// in flight (0: ringDepth's auto rule, 1: serial), restores from sockets
	// kept on the ring (noSplice), and how far ahead a restore read into the
	// ring warms it (warm, 0: off).
	depth    int
	noSplice bool
	warm     int
}

var _ iface.Backend = (*Client)(nil)

// ErrNotServed is Connect's answer for a plugin that does not serve the
// shared-memory plane (started without the socket, or speaking another
// control format): the caller uses gRPC streams.
var ErrNotServed = errors.New("shm data plane: not served by the plugin")

// Connect asks the plugin behind gc whether it serves the shared-memory plane
// and returns the Backend that uses h for it, or ErrNotServed.
func Connect(ctx context.Context, gc *iface.GRPCClient, h *Host) (*Client, error) {
	rpc := backendv1.NewBackendClient(gc.Conn())
	resp, err := rpc.DataPlane(ctx, &backendv1.DataPlaneRequest{})
	switch {
	case errors.Is(iface.FromStatus(err), iface.ErrNotImplemented):
		return nil, ErrNotServed
	case err != nil:
		return nil, iface.FromStatus(err)
	case !resp.GetShm() || resp.GetCtrlVersion() != ctrlVersion:
		return nil, ErrNotServed
	}
	return &Client{
		GRPCClient: gc, rpc: rpc, host: h,
		pipe: resp.GetPipePut(), pipeMax: resp.GetPipePutMaxChunk(),
		pipes:   int(min(max(resp.GetPipePutMaxPipes(), 1), splicePipes)),
		pipeSum: resp.GetPipePutSum(),
		warm:    putWarm,
	}, nil
}

// Splices describes how the plugin takes restores from sockets, for the
// engine's startup log: "false" (the ring), "true" (a pipe at every chunk
// size) or "up to N-byte chunks".
func (c *Client) Splices() string {
	switch {
	case !c.splices():
		return "false"
	case c.pipeMax > 0:
		return fmt.Sprintf("up to %d-byte chunks", c.pipeMax)
	}
	return "true"
}

func (c *Client) splices() bool { return c.pipe && !c.noSplice }

// splicesAt reports whether a restore from a socket whose ring would have
// chunk-byte buffers goes through a pipe instead.
func (c *Client) splicesAt(chunk int) bool {
	return c.splices() && (c.pipeMax <= 0 || int64(chunk) <= c.pipeMax)
}

// StateGet streams the slot's state to w through a ring of chunkSize-byte
// buffers; chunkSize <= 0 asks for gRPC messages as large as they go.
func (c *Client) StateGet(ctx context.Context, slot int, chunkSize int, w io.Writer) (int64, error) {
	if chunkSize <= 0 {
		traceOf(ctx).path(PathGRPC)
		return c.GRPCClient.StateGet(ctx, slot, chunkSize, w)
	}
	traceOf(ctx).path(PathRing)
	return c.stateGetShm(ctx, slot, chunkSize, w)
}

// StatePut restores size bytes of r into the slot: spliced from the client's
// socket into pipes the plugin reads where it takes them, else through the
// ring.
func (c *Client) StatePut(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
	if size < 0 {
		return 0, fmt.Errorf("%w: negative state size %d", iface.ErrBadRequest, size)
	}
	return c.statePutShm(ctx, slot, tokens, r, size)
}

type shmResult struct {
	n   int64
	err error
}

// stateGetShm streams the slot's state through a ring: the plugin fills
// buffers, the host writes them to w and frees them, until END.
func (c *Client) stateGetShm(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
	t, err := c.host.begin(chunk, ringDepth(c.depth, chunk, 0))
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resc := make(chan shmResult, 1)
	go func() {
		resp, err := c.rpc.StateGetShm(ctx, &backendv1.StateGetShmRequest{
			Slot:     int64(slot),
			Transfer: shmTransfer(t),
		})
		t.failed(err)
		resc <- shmResult{resp.GetWritten(), err}
	}()
	g := t.sendFilled(traceOf(ctx), w)
	if g.werr != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		cancel()
	}
	res := <-resc
	t.finish(g.werr == nil && res.err == nil && g.ended)
	return g.written, g.result(res)
}

// getLoop is how a STATE_GET's control loop ended: the bytes written to the
// client, werr (the host's own failure: the client's socket, a bad message),
// cerr (why the loop stopped short of END) and whether END came and matched.
type getLoop struct {
	written    int64
	werr, cerr error
	ended      bool
}

// sendFilled writes each buffer the plugin reports filled to w and frees
// it, until END, ABORT or a failure.
func (t *hostTransfer) sendFilled(clock waitClock, w io.Writer) (g getLoop) {
	for {
		k, n, ok := t.nextFilled(clock, &g)
		if !ok {
			return g
		}
		if int(k) >= t.ring.depth || n > uint64(t.ring.chunk) {
			g.werr = fmt.Errorf("shm data plane: bad buffer (%d, %d) from the plugin", k, n)
			return g
		}
		last, end := t.filledRun(k, n)
		m, err := w.Write(t.ring.mem[uint64(k)*uint64(t.ring.chunk) : end])
		g.written += int64(m)
		if err != nil {
			g.werr = err
			return g
		}
		for j := k; j <= last; j++ {
			if t.ctrl.post(msgFree, j, 0) != nil {
				return g // the plugin is gone; its result says why
			}
		}
	}
}

// nextFilled waits for the plugin's next FILLED message of a STATE_GET and
// returns its buffer and byte count; ok false when the loop ends there
// (END, ABORT, a closed socket), with g saying how.
func (t *hostTransfer) nextFilled(clock waitClock, g *getLoop) (k uint32, n uint64, ok bool) {
	waited := clock.now()
	kind, k, n, err := t.ctrl.recv()
	clock.since(waited)
	switch {
	case err != nil:
		g.cerr = err // the plugin closed its end: its result says why
	case kind == msgEnd:
		if g.ended = uint64(g.written) == n; !g.ended {
			g.werr = fmt.Errorf("shm data plane: plugin announced %d bytes, sent %d", n, g.written)
		}
	case kind != msgFilled: // msgAbort: the plugin failed; its result says why
		g.cerr = fmt.Errorf("control message %d", kind)
	default:
		return k, n, true
	}
	return 0, 0, false
}

// filledRun extends buffer k (n bytes) with the buffers the plugin has
// already filled after it, next in the mapping, so they go out in one write:
// one syscall, and one wake-up of the client, for several small chunks. It
// returns the last buffer of the run and the end of its bytes in the ring.
func (t *hostTransfer) filledRun(k uint32, n uint64) (last uint32, end uint64) {
	chunk := uint64(t.ring.chunk)
	last, end = k, uint64(k)*chunk+n
	for n == chunk && int(last)+1 < t.ring.depth {
		m, ok, err := t.ctrl.poll()
		if err != nil || !ok {
			break // an error shows again at the next recv
		}
		if m.kind != msgFilled || m.k != last+1 || m.n > chunk {
			t.ctrl.unpoll(m)
			break
		}
		last, n, end = m.k, m.n, end+m.n
	}
	return last, end
}

// result is the STATE_GET's outcome once the plugin's call returned.
func (g getLoop) result(res shmResult) error {
	switch {
	case g.werr != nil:
		return g.werr
	case res.err != nil:
		return iface.FromStatus(res.err)
	case !g.ended:
		// Say what ended the control loop (a read once raced the plugin's
		// END and close; ctrlConn.recv looks twice since).
		return fmt.Errorf("shm data plane: plugin finished without ending the transfer (control socket: %v)", g.cerr)
	case res.n != g.written:
		return fmt.Errorf("shm data plane: plugin wrote %d bytes, host received %d", res.n, g.written)
	}
	return nil
}

// statePutShm restores size bytes of r into the slot: through pipes where
// the plugin takes them from r's socket, else through a ring. A SumReader's
// bytes are summed where they land: by the host in the ring's buffers, once
// each is filled and before the plugin is told of it (so a consumer that
// reads the ring in place, RegionReader, gets only summed bytes), or by the
// plugin as it reads its pipes, where it offers to (pipe_put_sum; else the
// ring).
func (c *Client) statePutShm(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
	chunk := transferChunk(ctx)
	if chunk <= 0 {
		chunk = putChunk
	}
	r, sum := sumOf(r)
	if src, ok := r.(SharedSource); ok {
		return c.statePutShared(ctx, slot, tokens, src, sum, size)
	}
	if src, ok := r.(SocketSource); ok && c.splicesAt(chunk) && (sum == nil || c.pipeSum) {
		traceOf(ctx).path(PathPipes)
		return c.statePutPipe(ctx, slot, tokens, src, size, sum)
	}
	chunk = int(min(int64(chunk), max(size, 1)))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	traceOf(ctx).path(PathRing)
	if src, ok := r.(SocketSource); ok && !c.noSplice && size > 0 && src.Network() == "tcp" {
		traceOf(ctx).path(PathRingRelay)
		rl, err := startRelay(ctx, src, size)
		if err != nil {
			return 0, err
		}
		if sum != nil {
			// Bytes the relay took off the socket but the ring never got
			// (the plugin stopped first) were summed by no one. Runs after
			// stop.
			defer func() {
				if rl.fed != sum.N {
					sum.Lost = true
				}
			}()
		}
		defer rl.stop()
		r = rl
	}
	t, err := c.host.begin(chunk, ringDepth(c.depth, chunk, size))
	if err != nil {
		return 0, err
	}
	resc := make(chan shmResult, 1)
	go func() {
		resp, err := c.rpc.StatePutShm(ctx, &backendv1.StatePutShmRequest{
			Slot: int64(slot), Tokens: tokens, Size: size,
			Transfer: shmTransfer(t),
		})
		t.failed(err)
		resc <- shmResult{resp.GetConsumed(), err}
	}()
	fill := c.ringFiller(r, t)
	if sum != nil {
		unsummed := fill
		fill = func(buf []byte, at int) (int, error) {
			n, err := unsummed(buf, at)
			sum.Add(buf[:n])
			return n, err
		}
	}
	sent, rerr, pluginDone := t.fillRing(traceOf(ctx), fill, size)
	endPut(t.ctrl, sent, rerr, pluginDone)
	res := <-resc
	t.finish(rerr == nil && res.err == nil)
	return putResult(res, rerr, pluginDone)
}

// ringFiller returns how buffers of t's ring are filled from r: a socket
// read by the host warms the ring ahead of its copy (at most the ring less a
// buffer, never round to the bytes being written), anything else is read.
func (c *Client) ringFiller(r io.Reader, t *hostTransfer) func(buf []byte, at int) (int, error) {
	src, ok := r.(SocketSource)
	if ahead := min(c.warm, t.ring.size()-t.ring.chunk); ahead > 0 && ok {
		warm := newWarmer(t.ring.mem, ahead)
		return func(buf []byte, at int) (int, error) { return fillWarm(src, buf, warm, at) }
	}
	return func(buf []byte, _ int) (int, error) { return io.ReadFull(r, buf) }
}

// fillRing fills the ring's buffers in turn with fill and posts each to the
// plugin, waiting for a free buffer when all are in flight. rerr is the
// reader failing or ending early; pluginDone the plugin no longer reading.
func (t *hostTransfer) fillRing(clock waitClock, fill func(buf []byte, at int) (int, error), size int64) (sent int64, rerr error, pluginDone bool) {
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
			return sent, nil, true
		}
		k := seq % t.ring.depth
		n := int(min(int64(t.ring.chunk), size-sent))
		m, err := fill(t.ring.buf(k)[:n], k*t.ring.chunk)
		sent += int64(m)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				err = fmt.Errorf("state reader ended after %d of %d bytes: %w", sent, size, io.ErrUnexpectedEOF)
			}
			return sent, err, false
		}
		if t.ctrl.post(msgFilled, uint32(k), uint64(n)) != nil {
			return sent, nil, true
		}
		inflight++
	}
	return sent, nil, false
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
		return 0, iface.FromStatus(res.err)
	case pluginDone:
		return 0, errors.New("shm data plane: plugin stopped reading before the end of the state")
	}
	return res.n, nil
}

// shmTransfer describes t's ring to the plugin.
func shmTransfer(t *hostTransfer) *backendv1.ShmTransfer {
	return &backendv1.ShmTransfer{Id: t.id, ChunkSize: int64(t.ring.chunk), Depth: int64(t.ring.depth), CtrlVersion: ctrlVersion}
}

// putChunk is the ring buffer size for restores the host was given no chunk
// size for: socket reads land in it directly, so it only needs to be large
// enough to amortise the messages.
const putChunk = 4 << 20
