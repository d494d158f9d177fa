package cudallama

import (
	"bytes"
	"io"
	"testing"
)

// pieces is a ChunkReader over fixed-size pieces of b; Read copies out of
// the current piece, as the shm ring's reader does.
type pieces struct {
	b    []byte
	size int
	rest []byte // what Read left of the current piece
}

func (p *pieces) Next() ([]byte, error) {
	if len(p.rest) > 0 {
		out := p.rest
		p.rest = nil
		return out, nil
	}
	if len(p.b) == 0 {
		return nil, io.EOF
	}
	n := min(p.size, len(p.b))
	out := p.b[:n]
	p.b = p.b[n:]
	return out, nil
}

func (p *pieces) Read(dst []byte) (int, error) {
	b, err := p.Next()
	if err != nil {
		return 0, err
	}
	n := copy(dst, b)
	p.rest = b[n:]
	return n, nil
}

func TestPieceCopierReadsInOrder(t *testing.T) {
	src := make([]byte, 5<<20+123)
	for i := range src {
		src[i] = byte(i*31 + i>>11)
	}
	for _, piece := range []int{1000, 256 << 10, 2 << 20, 8 << 20} {
		r := readerFor(&pieces{b: src, size: piece}, 4)
		if _, ok := r.(*pieceCopier); !ok {
			t.Fatalf("readerFor did not wrap a ChunkReader")
		}
		var got bytes.Buffer
		// Reads of every kind: fields, row blocks larger and smaller than a piece.
		for _, n := range []int{4, 8, 3 << 20, 17, 600 << 10, 1 << 20} {
			p := make([]byte, n)
			if _, err := io.ReadFull(r, p); err != nil {
				t.Fatalf("piece %d: %v", piece, err)
			}
			got.Write(p)
		}
		rest, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		got.Write(rest)
		if !bytes.Equal(got.Bytes(), src) {
			t.Fatalf("piece %d: bytes differ", piece)
		}
	}
}

func TestParallelCopyEdges(t *testing.T) {
	for _, n := range []int{0, 1, parallelMin - 1, parallelMin, parallelMin + 1, 4<<20 + 65} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i%251 + 1)
		}
		dst := make([]byte, n+10)
		if got := parallelCopy(dst, src, 4); got != n {
			t.Fatalf("n=%d: copied %d", n, got)
		}
		if !bytes.Equal(dst[:n], src) || bytes.ContainsFunc(dst[n:], func(r rune) bool { return r != 0 }) {
			t.Fatalf("n=%d: wrong bytes", n)
		}
		short := make([]byte, n/2)
		if got := parallelCopy(short, src, 4); got != n/2 || !bytes.Equal(short, src[:n/2]) {
			t.Fatalf("n=%d into %d: copied %d", n, n/2, got)
		}
	}
}

func BenchmarkParallelCopy(b *testing.B) {
	src := make([]byte, 2<<20)
	dst := make([]byte, 64<<20) // larger than the caches: as the staging buffer
	for i := range src {
		src[i] = byte(i)
	}
	b.SetBytes(int64(len(src)))
	off := 0
	for b.Loop() {
		parallelCopy(dst[off:off+len(src)], src, 4)
		off = (off + len(src)) % len(dst)
	}
}
