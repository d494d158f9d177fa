package cudallama

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// prefetcher reads a restore's bytes ahead, on a goroutine of its own, into a
// mirror ring, while llama.cpp's thread takes them block by block (one K or V
// block per layer, contiguous) and uploads each to the device, so that the
// data plane is read while the upload runs rather than between uploads.
//
// The ring holds the block being uploaded plus slack bytes read ahead: the
// upload is much faster than the data plane, so a little read-ahead covers
// it. The caller predicts the largest block (from the state's cell count);
// a larger one grows the ring mid-restore.
type prefetcher struct {
	src  io.Reader
	grow func(size, tail int) (*mirror, error) // a new ring; the prefetcher closes the old one

	mu      sync.Mutex
	data    sync.Cond // the consumer's: w reached want, or the producer stopped
	space   sync.Cond // the producer's: room freed, a growth asked for, or stop
	ring    *mirror
	w       int64  // stream bytes read into the ring
	r       int64  // stream bytes the consumer released
	left    int64  // bytes src may still give
	want    int64  // the consumer waits until w ≥ want
	growTo  [2]int // ring size and tail the consumer waits for (the producer swaps rings)
	err     error  // why the producer stopped: io.EOF once the payload is read
	stop    bool
	ctxErr  error // the restore's context ended
	done    chan struct{}
	stopCtx func() bool

	// Where the restore's time went, for its log line: the consumer waiting
	// for bytes (the data plane set the pace) and the producer waiting for
	// room (the uploads did).
	waitData, waitSpace time.Duration
}

// minSlack is the least read-ahead beside a block: a pinned upload is
// several times faster than the data plane, so a few MiB of reading covers
// the upload of a block.
const minSlack = 4 << 20

// ringDims is the ring for blocks of up to block bytes: a tail that holds
// the block, and the block plus max(minSlack, block/4) of read-ahead, in
// whole MiB.
func ringDims(block int) (size, tail int) {
	const mib = 1 << 20
	block = max(block, 1)
	size = (block + max(minSlack, block/4) + mib - 1) &^ (mib - 1)
	tail = (block + mib - 1) &^ (mib - 1)
	return size, tail
}

// fits reports whether m serves blocks of up to block bytes as ringDims
// would have it.
func fits(m *mirror, block int) bool {
	size, tail := ringDims(block)
	return m != nil && m.size >= size && m.tail >= tail
}

// grownDims is the ring replacing m (nil: none) for blocks of up to block
// bytes: rings only grow, so alternating restores do not remap them.
func grownDims(m *mirror, block int) (size, tail int) {
	size, tail = ringDims(block)
	if m != nil {
		size, tail = max(size, m.size), max(tail, m.tail)
	}
	return size, tail
}

// startPrefetch reads size bytes of src into ring until close. block is the
// largest read expected; a ring that does not fit it is replaced first
// (closed, then a new one from grow, so the two never add up).
func startPrefetch(ctx context.Context, src io.Reader, size int64, ring *mirror, block int, grow func(size, tail int) (*mirror, error)) (*prefetcher, error) {
	if !fits(ring, block) {
		s, t := grownDims(ring, block)
		_ = ring.close() // nil-safe
		var err error
		if ring, err = grow(s, t); err != nil {
			return nil, err
		}
	}
	p := &prefetcher{src: src, grow: grow, ring: ring, left: size, done: make(chan struct{})}
	p.data.L, p.space.L = &p.mu, &p.mu
	p.stopCtx = context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.ctxErr = ctx.Err()
		p.data.Broadcast()
		p.mu.Unlock()
	})
	go p.run()
	return p, nil
}

func (p *prefetcher) run() {
	defer close(p.done)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.w-p.r == int64(p.ring.size) {
			start := time.Now()
			for !p.stop && p.growTo[0] == 0 && p.left > 0 && p.w-p.r == int64(p.ring.size) {
				p.space.Wait()
			}
			p.waitSpace += time.Since(start)
		}
		switch {
		case p.stop:
			return
		case p.growTo[0] > 0:
			p.swap()
			continue
		case p.left == 0:
			p.finish(io.EOF)
			return
		}
		free := int64(p.ring.size) - (p.w - p.r)
		buf := p.ring.span(p.w, int(min(free, p.left, int64(p.ring.contig(p.w)))))
		p.mu.Unlock()
		n, err := p.src.Read(buf)
		p.mu.Lock()
		p.w += int64(n)
		p.left -= int64(n)
		if p.w >= p.want {
			p.data.Signal()
		}
		switch {
		case err == nil || (errors.Is(err, io.EOF) && p.left == 0):
		case errors.Is(err, io.EOF):
			p.finish(io.ErrUnexpectedEOF)
			return
		default:
			p.finish(err)
			return
		}
	}
}

// finish records why the producer stopped and wakes the consumer.
func (p *prefetcher) finish(err error) {
	p.err = err
	p.data.Broadcast()
}

// swap moves the unreleased bytes into a ring of growTo's dimensions. Called
// by the producer, so no read is landing in the old ring; the consumer is
// waiting in next and holds no pointer into it.
func (p *prefetcher) swap() {
	size, tail := p.growTo[0], p.growTo[1]
	p.growTo = [2]int{}
	n, err := p.grow(size, tail)
	if err != nil {
		p.finish(fmt.Errorf("growing the restore ring to %d bytes: %w", size, err))
		p.stop = true
		return
	}
	for off := p.r; off < p.w; {
		k := min(int(p.w-off), p.ring.contig(off), n.contig(off))
		copy(n.span(off, k), p.ring.span(off, k))
		off += int64(k)
	}
	_ = p.ring.close()
	p.ring = n
	p.data.Broadcast()
}

// Next releases the release bytes the consumer is done with and returns the
// unreleased bytes read so far, at least need of them, contiguous. They stay
// valid until the next call.
func (p *prefetcher) Next(release, need int) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if int64(release) > p.w-p.r {
		return nil, fmt.Errorf("restore ring: releasing %d bytes, %d were handed out", release, p.w-p.r)
	}
	p.r += int64(release)
	p.space.Signal()
	return p.wait(need)
}

func (p *prefetcher) wait(need int) ([]byte, error) {
	if have := p.w - p.r; int64(need) > have+p.left {
		return nil, fmt.Errorf("%w: state truncated at offset %d: llama.cpp needs %d bytes more than the payload holds: %w",
			iface.ErrBadRequest, p.w+p.left, int64(need)-have-p.left, io.ErrUnexpectedEOF)
	}
	// Grow: a block must fit the tail, and the read-ahead beside it is what
	// overlaps its upload. A running producer swaps the rings (no read may
	// land in the old one); a stopped one never touches the ring again.
	if !fits(p.ring, need) {
		s, t := grownDims(p.ring, need)
		p.growTo = [2]int{s, t}
		if p.err == nil {
			p.space.Signal()
		} else {
			p.swap()
		}
	}
	want := p.r + int64(need)
	p.want = want
	if p.w < want || p.growTo[0] > 0 {
		start := time.Now()
		for (p.w < want || p.growTo[0] > 0) && p.err == nil && p.ctxErr == nil {
			p.data.Wait()
		}
		p.waitData += time.Since(start)
	}
	p.want = 0
	switch {
	case p.ctxErr != nil:
		return nil, p.ctxErr
	case p.w < want:
		return nil, truncated(p.w, p.err)
	case p.ring.contig(p.r) < need: // the growth failed
		return nil, p.err
	}
	// A growth still pending means the producer stopped before it swapped
	// (and never will): what it read fits the ring as it is.
	p.growTo = [2]int{}
	return p.ring.span(p.r, min(int(p.w-p.r), p.ring.contig(p.r))), nil
}

// releaseTo marks the first off bytes of the stream consumed.
func (p *prefetcher) releaseTo(off int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if off < p.r || off > p.w {
		return fmt.Errorf("restore ring: consumed up to %d, read %d, released %d", off, p.w, p.r)
	}
	p.r = off
	p.space.Signal()
	return nil
}

// Read reads on after what was released, releasing what it returns.
func (p *prefetcher) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == p.r && p.left == 0 {
		return 0, io.EOF
	}
	avail, err := p.wait(1)
	if err != nil {
		return 0, err
	}
	n := copy(b, avail)
	p.r += int64(n)
	p.space.Signal()
	return n, nil
}

// close stops the producer, waiting for a read in progress to return (the
// data plane's reader must not outlive the restore), and returns the ring,
// to be kept for the next restore.
func (p *prefetcher) close() *mirror {
	p.stopCtx()
	p.mu.Lock()
	p.stop = true
	p.space.Broadcast()
	p.mu.Unlock()
	<-p.done
	return p.ring
}
