//go:build unix

package host

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"syscall"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// The two sides of a handoff ring (shmring.go): the exporting engine's
// writer and the importing engine's reader, each able to move the state's
// bytes itself or to let its plugin fill or read the buffers in place.

// exportClaim is how long an export waits for its importer's first read
// before it gives the slot back: a client that exports and never imports
// must not hold the slot for the whole stall limit.
const exportClaim = 30 * time.Second

// ringWriter is an export's side of its ring: the sink of a plugin filling
// the buffers in place (shm.SharedSink), or the writer copying a backend's
// state into them. It gives up with the context, when the reader did, or
// after wait without room (exportClaim before a reader came). It sums what
// it publishes, the header first, for the trailer.
type ringWriter struct {
	ctx   context.Context
	r     *handoffRing
	wait  time.Duration
	since time.Time // when it began waiting for room
	fill  int       // bytes copied into the buffer not yet published
	n     int64     // the blob's bytes published (header included)
	sum   bool
	crc   uint32
}

var _ shm.SharedSink = (*ringWriter)(nil)

// newRingWriter is the writer of r's state, its header counted (and summed,
// with sum) as written.
func newRingWriter(ctx context.Context, r *handoffRing, wait time.Duration, sum bool) *ringWriter {
	w := &ringWriter{ctx: ctx, r: r, wait: wait, sum: sum}
	w.add(r.headBytes())
	return w
}

// add counts and sums p, published.
func (w *ringWriter) add(p []byte) {
	if w.sum {
		w.crc = crc32.Update(w.crc, transport.Castagnoli, p)
	}
	w.n += int64(len(p))
}

// Filled publishes buffer k, which the plugin filled with n bytes.
func (w *ringWriter) Filled(k, n int) error {
	switch {
	case k != w.r.filled()%w.r.depth || !w.r.room():
		return fmt.Errorf("the backend filled buffer %d, not the next free one", k)
	case w.n+int64(n) > int64(w.r.head)+w.r.state():
		return fmt.Errorf("the backend wrote past the %d bytes announced", w.r.state())
	}
	w.add(w.r.buf(k)[:n])
	w.r.publish(n)
	return nil
}

// AwaitFreed waits until the importer gave back more than have buffers, or
// says why the export stops.
func (w *ringWriter) AwaitFreed(ctx context.Context, have int) (int, error) {
	for {
		if f := w.r.freed(); f > have {
			return f, nil
		}
		if err := w.stalled(); err != nil {
			return 0, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		w.r.waitFreed(have)
	}
}

// stalled is why the export must stop: the context, the importer gone, or
// no room for too long; nil to go on.
func (w *ringWriter) stalled() error {
	switch {
	case w.ctx.Err() != nil:
		return fmt.Errorf("the export was stopped: %w", w.ctx.Err())
	case w.r.status() == ringReaderGone:
		return errors.New("the importer gave up")
	case w.r.room():
		w.since = time.Time{}
		return nil
	case w.since.IsZero():
		w.since = time.Now()
	}
	limit := w.wait
	if !w.r.claimed() {
		limit = exportClaim
	}
	if time.Since(w.since) > limit {
		return fmt.Errorf("no importer made room in the ring for %v", limit)
	}
	return nil
}

// Write copies p into the buffers, publishing each once full.
func (w *ringWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if w.n+int64(w.fill+len(p)) > int64(w.r.head)+w.r.state() {
			return n, fmt.Errorf("the backend wrote past the %d bytes announced", w.r.state())
		}
		for w.fill == 0 {
			if err := w.stalled(); err != nil {
				return n, err
			}
			if w.r.room() {
				break
			}
			w.r.waitFreed(w.r.filled() - w.r.depth)
		}
		c := copy(w.r.buf(w.r.filled() % w.r.depth)[w.fill:], p)
		w.fill += c
		p, n = p[c:], n+c
		if w.fill == w.r.chunk {
			w.flush()
		}
	}
	return n, nil
}

// flush publishes the buffer being filled, if it holds anything.
func (w *ringWriter) flush() {
	if w.fill > 0 {
		w.add(w.r.buf(w.r.filled() % w.r.depth)[:w.fill])
		w.r.publish(w.fill)
		w.fill = 0
	}
}

// handoffReader reads an export's blob as its engine writes it: the header
// and trailer from their places, the state buffer by buffer, copied out
// (Read) or handed out in place (Next). It waits for more, and fails where
// the writer failed, its engine (pid, from the file's name) is gone, or
// nothing comes for wait. The trailer is read only once the writer marked
// the ring complete (every byte written, the source slot freed).
type handoffReader struct {
	r     *handoffRing
	wait  time.Duration
	pid   int
	since time.Time
	pos   int64     // the blob's bytes read, or taken in place
	taken int       // buffers taken
	got   int64     // the state's bytes in them
	cur   []byte    // the rest of the buffer Read copies from
	held  bool      // Read holds a buffer not given back yet
	moved func(int) // counts bytes Next takes in place
}

func (h *handoffReader) Read(p []byte) (int, error) {
	head, stateEnd := int64(h.r.head), int64(h.r.head)+h.r.state()
	var from []byte
	switch {
	case h.pos < head:
		from = h.r.headBytes()[h.pos:]
	case h.pos < stateEnd:
		if len(h.cur) == 0 {
			h.release()
			k, n, err := h.await(context.Background())
			if err != nil {
				return 0, err
			}
			h.cur, h.held = h.r.buf(k)[:n], true
		}
		n := copy(p, h.cur)
		h.cur, h.pos = h.cur[n:], h.pos+int64(n)
		return n, nil
	case h.pos < h.r.total:
		h.release()
		if err := h.awaitComplete(); err != nil {
			return 0, err
		}
		from = h.r.tailBytes()[h.pos-stateEnd:]
	default:
		h.release()
		return 0, io.EOF
	}
	n := copy(p, from)
	h.pos += int64(n)
	return n, nil
}

// release gives back the buffer Read holds.
func (h *handoffReader) release() {
	if h.held {
		h.held = false
		h.r.free()
	}
}

// Next waits for the next buffer and hands it out in place
// (shm.SharedSource).
func (h *handoffReader) Next(ctx context.Context) (k, n int, err error) {
	if k, n, err = h.await(ctx); err == nil {
		h.pos += int64(n)
		if h.moved != nil {
			h.moved(n)
		}
	}
	return k, n, err
}

// await waits for the next buffer.
func (h *handoffReader) await(ctx context.Context) (k, n int, err error) {
	for {
		k, n, ok, err := h.take()
		if ok || err != nil {
			return k, n, err
		}
		if err := h.stalled(); err != nil {
			return 0, 0, err
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		h.r.waitFilled(h.taken)
	}
}

// take takes the next buffer if the writer has published it: ok false when
// not yet.
func (h *handoffReader) take() (k, n int, ok bool, err error) {
	if h.r.status() == ringWriterFailed {
		return 0, 0, false, h.cutOff()
	}
	if h.r.filled() <= h.taken {
		return 0, 0, false, nil
	}
	k = h.taken % h.r.depth
	n = h.r.length(k)
	switch {
	case n <= 0 || n > h.r.chunk || h.got+int64(n) > h.r.state():
		return 0, 0, false, fmt.Errorf("the export's buffer %d holds %d bytes after %d of the state's %d", k, n, h.got, h.r.state())
	}
	h.taken++
	h.got += int64(n)
	h.since = time.Time{}
	return k, n, true, nil
}

// awaitComplete waits for the writer to mark the ring complete.
func (h *handoffReader) awaitComplete() error {
	for h.r.status() != ringComplete {
		if h.r.status() == ringWriterFailed {
			return h.cutOff()
		}
		if err := h.stalled(); err != nil {
			return err
		}
		h.r.waitState()
	}
	return nil
}

func (h *handoffReader) cutOff() error {
	return fmt.Errorf("the export was cut off at its source after %d of %d bytes (its engine's log says why)", h.pos, h.r.total)
}

// stalled is why the reader must stop waiting: its engine gone or nothing
// for wait; nil to go on.
func (h *handoffReader) stalled() error {
	switch {
	case h.pid > 0 && syscall.Kill(h.pid, 0) == syscall.ESRCH:
		return fmt.Errorf("the export's engine (pid %d) is gone after %d of %d bytes", h.pid, h.pos, h.r.total)
	case h.since.IsZero():
		h.since = time.Now()
	case time.Since(h.since) > h.wait:
		return fmt.Errorf("the export stopped at %d of %d bytes for %v", h.pos, h.r.total, h.wait)
	}
	return nil
}
