package cudallama

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestMirrorWraps(t *testing.T) {
	page := os.Getpagesize()
	m, err := newMirror(4*page, page)
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	// A span over the end of the memory continues at its start.
	copy(m.span(int64(4*page-3), 6), "abcdef")
	if got := string(m.span(0, 3)); got != "def" {
		t.Fatalf("the ring's start holds %q, want %q", got, "def")
	}
	if got := string(m.span(int64(3*4*page-3), 6)); got != "abcdef" {
		t.Fatalf("span at a later lap holds %q", got)
	}
	if got := m.contig(int64(4*page - 3)); got != page+3 {
		t.Fatalf("contig at the end: %d, want %d", got, page+3)
	}
	for _, d := range [][2]int{{1000, 1000}, {page, 2 * page}, {2 * page, 0}} {
		if _, err := newMirror(d[0], d[1]); err == nil {
			t.Fatalf("a mirror of %d with a tail of %d was accepted", d[0], d[1])
		}
	}
}

// choppy returns at most max bytes a Read, at random, as a socket or pipe
// does.
type choppy struct {
	r   io.Reader
	max int
	rng *rand.Rand
}

func (c *choppy) Read(p []byte) (int, error) {
	if len(p) > c.max {
		p = p[:1+c.rng.IntN(c.max)]
	}
	return c.r.Read(p)
}

// grows counts the rings a prefetcher asks for.
type grows struct{ sizes []int }

func (g *grows) grow(size, tail int) (*mirror, error) {
	g.sizes = append(g.sizes, size)
	return newMirror(size, tail)
}

// consume reads the stream as llama.cpp's reader does: a field or a block at
// a time, the pointer valid until the next call, releasing what it took.
func consume(t *testing.T, p *prefetcher, reads []int) []byte {
	t.Helper()
	var out bytes.Buffer
	var avail []byte
	taken := 0
	for _, n := range reads {
		if len(avail) < n {
			var err error
			if avail, err = p.Next(taken, n); err != nil {
				t.Fatalf("Next(%d, %d) after %d bytes: %v", taken, n, out.Len(), err)
			}
			taken = 0
		}
		out.Write(avail[:n])
		avail = avail[n:]
		taken += n
	}
	if err := p.releaseTo(int64(out.Len())); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestPrefetchStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 96<<20)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	// A state's reads: fields, then blocks larger than the first ring
	// (growth), then trailing bytes read with Read.
	var reads []int
	total := 0
	for total < len(src)-(4<<20) {
		n := 4 + rng.IntN(9)
		if rng.IntN(3) == 0 {
			n = 1<<20 + rng.IntN(11<<20)
		}
		n = min(n, len(src)-(4<<20)-total)
		reads = append(reads, n)
		total += n
	}
	var g grows
	for _, max := range []int{1 << 10, 64 << 10, 1 << 20, 8 << 20} {
		g.sizes = nil
		// Predicted blocks of 1 MiB: the larger ones grow the ring mid-stream.
		p, err := startPrefetch(context.Background(), &choppy{r: bytes.NewReader(src), max: max, rng: rng}, int64(len(src)), nil, 1<<20, g.grow)
		if err != nil {
			t.Fatal(err)
		}
		got := consume(t, p, reads)
		rest, err := io.ReadAll(p)
		ring := p.close()
		if err != nil {
			t.Fatalf("reads of %d: trailing bytes: %v", max, err)
		}
		if !bytes.Equal(append(got, rest...), src) {
			t.Fatalf("reads of %d: the stream came out different", max)
		}
		if len(g.sizes) < 2 || ring.size != g.sizes[len(g.sizes)-1] || ring.tail < 11<<20 || ring.size < ring.tail+minSlack {
			t.Fatalf("reads of %d: rings %v, kept %d", max, g.sizes, ring.size)
		}
		ring.close()
	}
}

func TestPrefetchKeepsRing(t *testing.T) {
	m, err := newMirror(ringDims(10 << 20))
	if err != nil {
		t.Fatal(err)
	}
	var g grows
	src := bytes.Repeat([]byte{7}, 40<<20)
	p, err := startPrefetch(context.Background(), bytes.NewReader(src), int64(len(src)), m, 10<<20, g.grow)
	if err != nil {
		t.Fatal(err)
	}
	got := consume(t, p, []int{8, 10 << 20, 12, 10 << 20})
	rest, err := io.ReadAll(p)
	if ring := p.close(); ring != m || len(g.sizes) != 0 || err != nil || !bytes.Equal(append(got, rest...), src) {
		t.Fatalf("a ring large enough was replaced (%v) or the bytes differ", g.sizes)
	}
	m.close()

	// A ring too small for the predicted blocks is replaced before the
	// restore starts.
	small, _ := newMirror(ringDims(1 << 20))
	p, err = startPrefetch(context.Background(), bytes.NewReader(src), int64(len(src)), small, 10<<20, g.grow)
	if err != nil {
		t.Fatal(err)
	}
	if small.mem != nil || len(g.sizes) != 1 {
		t.Fatalf("the small ring was not replaced first: %v", g.sizes)
	}
	got = consume(t, p, []int{10 << 20, 10 << 20})
	if ring := p.close(); len(g.sizes) != 1 || !bytes.Equal(got, src[:20<<20]) {
		t.Fatalf("rings %v; bytes equal: %v", g.sizes, bytes.Equal(got, src[:20<<20]))
	} else {
		ring.close()
	}
}

// A block larger than the ring's tail, asked for once the producer has
// read the whole payload: the consumer grows the ring itself.
func TestPrefetchGrowsAfterTheEnd(t *testing.T) {
	var g grows
	src := make([]byte, 8<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	// A ring of 5 MiB with a 1 MiB tail.
	p, err := startPrefetch(context.Background(), bytes.NewReader(src), int64(len(src)), nil, 1<<10, g.grow)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Next(0, 4<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Next(4<<20, 1); err != nil {
		t.Fatal(err)
	}
	for { // until the producer has read the rest, wrapping around the ring
		p.mu.Lock()
		done := p.err != nil
		p.mu.Unlock()
		if done {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b, err := p.Next(0, 4<<20)
	if err != nil || len(b) < 4<<20 || !bytes.Equal(b[:4<<20], src[4<<20:]) || len(g.sizes) != 2 {
		t.Fatalf("rings %v, %d bytes, %v", g.sizes, len(b), err)
	}
	p.close().close()
}

func TestPrefetchShortPayload(t *testing.T) {
	var g grows
	src := bytes.Repeat([]byte{1}, 1000)
	// The payload announced 1000 bytes: a read past them fails at once.
	p, _ := startPrefetch(context.Background(), bytes.NewReader(src), 1000, nil, 1000, g.grow)
	if _, err := p.Next(0, 600); err != nil {
		t.Fatal(err)
	}
	_, err := p.Next(600, 401)
	if !errors.Is(err, iface.ErrBadRequest) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading past the payload: %v", err)
	}
	p.close().close()

	// The source ends before the payload does: truncated, a bad request.
	p, _ = startPrefetch(context.Background(), bytes.NewReader(src), 5000, nil, 1000, g.grow)
	_, err = p.Next(0, 2000)
	if !errors.Is(err, iface.ErrBadRequest) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a source ending early: %v", err)
	}
	p.close().close()
}

type failing struct{ after int }

var errBroken = errors.New("connection reset")

func (f *failing) Read(p []byte) (int, error) {
	if f.after == 0 {
		return 0, errBroken
	}
	n := min(len(p), f.after)
	f.after -= n
	return n, nil
}

func TestPrefetchSourceError(t *testing.T) {
	var g grows
	p, _ := startPrefetch(context.Background(), &failing{after: 3000}, 1<<20, nil, 1000, g.grow)
	if _, err := p.Next(0, 3000); err != nil {
		t.Fatal(err)
	}
	_, err := p.Next(0, 3001)
	if !errors.Is(err, errBroken) || errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("a failing source: %v", err)
	}
	if _, err := p.Next(3001, 1); err == nil {
		t.Fatal("released more than was handed out")
	}
	p.close().close()
}

// stalled blocks in Read until released, then fails.
type stalled struct{ release chan struct{} }

func (s *stalled) Read(p []byte) (int, error) {
	<-s.release
	return 0, errBroken
}

func TestPrefetchCancel(t *testing.T) {
	var g grows
	ctx, cancel := context.WithCancel(context.Background())
	src := &stalled{release: make(chan struct{})}
	p, _ := startPrefetch(ctx, src, 1<<20, nil, 1000, g.grow)
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel()
	}()
	if _, err := p.Next(0, 10); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled restore: %v", err)
	}
	// close waits for the read in progress: the data plane's reader must not
	// be used after the restore returns.
	closed := make(chan *mirror)
	go func() { closed <- p.close() }()
	select {
	case <-closed:
		t.Fatal("close returned while the producer was still reading")
	case <-time.After(50 * time.Millisecond):
	}
	close(src.release)
	(<-closed).close()
}

// BenchmarkPipeRead measures what the prefetcher's read(2) from the spliced
// restore pipe costs by where the bytes land: a hot 1 MiB buffer (as the
// mock reads), a restore ring of 24 MiB cycled through (as this plugin does:
// memfd pages, mapped twice), Go heap of the same size, a 1 MiB ring. A
// writer goroutine fills the pipe from a hot buffer; run with -cpu 2 or more.
func BenchmarkPipeRead(b *testing.B) {
	ring, err := newMirror(ringDims(20 << 20))
	if err != nil {
		b.Fatal(err)
	}
	defer ring.close()
	small, err := newMirror(1<<20, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	defer small.close()
	// The Go heap (anonymous memory) and a small ring tell the size of the
	// destination from its kind (memfd pages, mapped twice).
	for _, c := range []struct {
		name string
		dst  []byte
	}{{"hot-1MiB", make([]byte, 1<<20)}, {"ring-24MiB", ring.mem[:ring.size]},
		{"heap-24MiB", make([]byte, ring.size)}, {"ring-1MiB", small.mem[:small.size]}} {
		b.Run(c.name, func(b *testing.B) {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			_, _ = unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, 1<<20)
			const piece = 1 << 20
			total := int64(b.N) * piece
			b.SetBytes(piece)
			go func() {
				src := make([]byte, piece)
				for n := int64(0); n < total; n += piece {
					if _, err := w.Write(src); err != nil {
						break
					}
				}
				w.Close()
			}()
			b.ResetTimer()
			off := 0
			for got := int64(0); got < total; {
				n, err := r.Read(c.dst[off:min(off+piece, len(c.dst))])
				if err != nil {
					b.Fatal(err)
				}
				got += int64(n)
				if off += n; off == len(c.dst) {
					off = 0
				}
			}
		})
	}
}
