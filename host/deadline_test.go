package host

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
)

// trickle hands out at most max bytes per Read, as a socket does, and counts
// the bytes it delivered into buffers of bufSize (bufio's own buffer).
type trickle struct {
	r        io.Reader
	max      int
	bufSize  int
	buffered int
}

func (t *trickle) Read(p []byte) (int, error) {
	n, err := t.r.Read(p[:min(len(p), t.max)])
	if len(p) == t.bufSize {
		t.buffered += n
	}
	return n, err
}

func TestPayloadReaderKeepsOrder(t *testing.T) {
	src := make([]byte, 3<<20)
	for i := range src {
		src[i] = byte(i * 7 / 3)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tr := &trickle{r: bytes.NewReader(src), max: 100_000, bufSize: 64<<10 + 1}
	br := bufio.NewReaderSize(tr, tr.bufSize)
	r := payloadReader{br, tr}
	var got []byte
	for len(got) < len(src) {
		// Mix field-sized reads with chunk-sized ones.
		n := []int{1, 13, 4095, 4096, 70_000, 256 << 10}[rng.IntN(6)]
		n = min(n, len(src)-len(got))
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatal(err)
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("bytes out of order")
	}
}

func TestPayloadReaderBypassesBufferForChunks(t *testing.T) {
	const chunk = 256 << 10
	src := make([]byte, 64*chunk+40)
	tr := &trickle{r: bytes.NewReader(src), max: 100_000, bufSize: 64<<10 + 1}
	br := bufio.NewReaderSize(tr, tr.bufSize)
	r := payloadReader{br, tr}
	hdr := make([]byte, 40) // a blob header: read through the buffer
	if _, err := io.ReadFull(r, hdr); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, chunk)
	for range 64 {
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatal(err)
		}
	}
	// Only the first fill (header plus what came with it) may pass through
	// bufio's buffer; with plain bufio every chunk's tail would.
	if tr.buffered > tr.max {
		t.Fatalf("%d bytes went through the read buffer, want at most %d", tr.buffered, tr.max)
	}
	if _, err := r.Read(p); err != io.EOF {
		t.Fatalf("after the stream: %v, want EOF", err)
	}
}
