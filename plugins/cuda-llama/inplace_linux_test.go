package cudallama

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// fakeRing is a data plane's RegionReader: src cut into buffers of chunk
// bytes from a ring of depth in one mapping (not Go memory, as C may hold
// pointers into it), each overwritten with garbage once freed (the host
// fills it again), as the shm plane's reader hands them out.
type fakeRing struct {
	src   []byte
	chunk int
	mem   []byte
	bufs  [][]byte
	k     int
	held  []byte // the current buffer
	cur   []byte // its unread rest
	err   error  // returned once src is spent, instead of io.EOF
	nexts int    // calls of Next (not through Read): pieces taken in place
	// lend hands out src itself in chunk pieces (src must not be Go
	// memory), no buffer filled nor overwritten: a host whose work costs
	// the reader nothing, for benchmarks.
	lend bool
	all  []byte // src as given, when lent
}

func newFakeRing(t testing.TB, src []byte, chunk, depth int) *fakeRing {
	mem, err := unix.Mmap(-1, 0, chunk*depth, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	r := &fakeRing{src: src, chunk: chunk, mem: mem}
	for i := range depth {
		r.bufs = append(r.bufs, mem[i*chunk:(i+1)*chunk])
	}
	return r
}

func (r *fakeRing) Next() ([]byte, error) {
	r.nexts++
	return r.next()
}

func (r *fakeRing) next() ([]byte, error) {
	if len(r.cur) > 0 {
		p := r.cur
		r.cur = nil
		return p, nil
	}
	for i := range r.held {
		r.held[i] = 0xEE
	}
	r.held = nil
	if len(r.src) == 0 {
		if r.err != nil {
			return nil, r.err
		}
		return nil, io.EOF
	}
	if r.lend {
		p := r.src[:min(r.chunk, len(r.src))]
		r.src = r.src[len(p):]
		return p, nil
	}
	b := r.bufs[r.k%len(r.bufs)]
	r.k++
	n := copy(b, r.src[:min(r.chunk, len(r.src))])
	r.src = r.src[n:]
	r.held = b[:n]
	return r.held, nil
}

func (r *fakeRing) Read(p []byte) (int, error) {
	b, err := r.next()
	n := copy(p, b)
	r.cur = b[n:]
	return n, err
}

func (r *fakeRing) Region() []byte {
	if r.lend {
		return r.all
	}
	return r.mem
}

var _ shm.RegionReader = (*fakeRing)(nil)

// inRing reports whether p lies in one of r's buffers.
func (r *fakeRing) inRing(p []byte) bool {
	for _, b := range r.bufs {
		lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(len(b))
		if a := uintptr(unsafe.Pointer(unsafe.SliceData(p))); a >= lo && a+uintptr(len(p)) <= hi {
			return true
		}
	}
	return false
}

func TestInPlaceStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, 40<<20)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	const head, trailing = 100 << 10, 1 << 20
	// A state's reads after its head: fields, blocks streamed piece by piece
	// (negative: at least 1 MiB), small blocks read whole, then trailing
	// bytes read with Read.
	var reads []int
	total := head
	for total < len(src)-trailing {
		n := 4 + rng.IntN(9)
		switch rng.IntN(4) {
		case 0:
			n = -(1<<20 + rng.IntN(5<<20))
		case 1:
			n = 1 + rng.IntN(900<<10)
		}
		n = max(-(len(src) - trailing - total), min(n, len(src)-trailing-total))
		reads = append(reads, n)
		total += max(n, -n)
	}
	for _, chunk := range []int{64 << 10, 256 << 10, 2 << 20} {
		ring := newFakeRing(t, src[head:], chunk, 4)
		s, err := newInPlace(ring, src[:head], int64(len(src)))
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		var avail []byte
		taken, inPlaceBytes, streamed := 0, 0, 0
		for _, n := range append([]int{head}, reads...) {
			if n > 0 { // read(n): n contiguous bytes
				if len(avail) < n {
					if avail, err = s.Next(taken, n); err != nil {
						t.Fatalf("chunk %d: Next(%d, %d) after %d bytes: %v", chunk, taken, n, out.Len(), err)
					}
					taken = 0
				}
				out.Write(avail[:n])
				avail, taken = avail[n:], taken+n
				continue
			}
			// A streamed block: pieces of whatever the stream holds.
			for size := -n; size > 0; {
				if len(avail) == 0 {
					if avail, err = s.Next(taken, 1); err != nil {
						t.Fatalf("chunk %d: piece after %d bytes: %v", chunk, out.Len(), err)
					}
					taken = 0
				}
				k := min(len(avail), size)
				if ring.inRing(avail[:k]) {
					inPlaceBytes += k
				}
				out.Write(avail[:k])
				avail, taken, size, streamed = avail[k:], taken+k, size-k, streamed+k
			}
		}
		if err := s.releaseTo(int64(out.Len())); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(s)
		s.close()
		if err != nil {
			t.Fatalf("chunk %d: trailing bytes: %v", chunk, err)
		}
		if !bytes.Equal(append(out.Bytes(), rest...), src) {
			t.Fatalf("chunk %d: the stream came out different", chunk)
		}
		// Streamed blocks come from the ring itself but for the bytes that
		// followed a field or small block staged across a buffer's end.
		if inPlaceBytes < streamed*9/10 {
			t.Fatalf("chunk %d: %d of %d streamed bytes lent in place", chunk, inPlaceBytes, streamed)
		}
	}
}

func TestInPlaceShortPayload(t *testing.T) {
	src := bytes.Repeat([]byte{1}, 1000)
	// The payload announced 1000 bytes: a read past them fails at once.
	s, _ := newInPlace(newFakeRing(t, src[10:], 256, 2), src[:10], 1000)
	if _, err := s.Next(0, 600); err != nil {
		t.Fatal(err)
	}
	_, err := s.Next(600, 401)
	if !errors.Is(err, iface.ErrBadRequest) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("reading past the payload: %v", err)
	}
	s.close()

	// The data plane ends before the payload does.
	s, _ = newInPlace(newFakeRing(t, src, 256, 2), nil, 5000)
	if _, err = s.Next(0, 2000); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a plane ending early: %v", err)
	}
	s.close()

	// The data plane fails (the host aborted): its error, not a bad request.
	r := newFakeRing(t, src, 256, 2)
	r.err = errBroken
	s, _ = newInPlace(r, nil, 5000)
	if _, err = s.Next(0, 2000); !errors.Is(err, errBroken) || errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("a failing plane: %v", err)
	}
	if _, err := s.Next(3000, 1); err == nil {
		t.Fatal("released more than was lent")
	}
	s.close()
}

// FuzzInPlace drives inPlace as llama.cpp's reader could: reads of any size
// (contiguous, staged across buffers when they must be) and streamed blocks
// taken piece by piece, over rings of any buffer size and depth whose freed
// buffers are overwritten, after a head of any length. Whatever the
// pattern, the bytes come out as they went in, a read past the payload is a
// bad request, and the rest reads back with Read.
func FuzzInPlace(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 2, 3, 4})
	f.Add([]byte{255, 40, 2, 200, 201, 7, 9, 250, 251, 252})
	f.Add([]byte{3, 255, 1, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) < 3 {
			return
		}
		src := make([]byte, 20_000)
		for i := range src {
			src[i] = byte(i*31 + i>>8)
		}
		chunk, head, depth := 1+int(ops[0])*16, min(int(ops[1])*97, len(src)), 1+int(ops[2]%4)
		ring := newFakeRing(t, src[head:], chunk, depth)
		s, err := newInPlace(ring, src[:head], int64(len(src)))
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		var out []byte
		var avail []byte
		taken := 0
		for _, op := range ops[3:] {
			n := 1 + int(op>>1)*41
			if len(out)+n > len(src) { // past the payload
				if len(avail) < n {
					if _, err := s.Next(taken, n); !errors.Is(err, iface.ErrBadRequest) {
						t.Fatalf("a read of %d past the payload at %d: %v", n, len(out), err)
					}
					return
				}
				continue
			}
			if op&1 == 0 { // read(n)
				if len(avail) < n {
					if avail, err = s.Next(taken, n); err != nil {
						t.Fatalf("Next(%d, %d) at %d: %v", taken, n, len(out), err)
					}
					taken = 0
				}
				out = append(out, avail[:n]...)
				avail, taken = avail[n:], taken+n
				continue
			}
			for size := n; size > 0; { // a streamed block
				if len(avail) == 0 {
					if avail, err = s.Next(taken, 1); err != nil {
						t.Fatalf("piece at %d: %v", len(out), err)
					}
					taken = 0
				}
				k := min(len(avail), size)
				out = append(out, avail[:k]...)
				avail, taken, size = avail[k:], taken+k, size-k
			}
		}
		if err := s.releaseTo(int64(len(out))); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(append(out, rest...), src) {
			t.Fatalf("chunk %d, head %d, depth %d: the stream came out different", chunk, head, depth)
		}
	})
}
