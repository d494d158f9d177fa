//go:build unix

package host

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHandoffRingWraps: a blob many times its ring's size goes through it,
// written by copying (a backend's stream) or in place (a plugin filling the
// buffers, shm.SharedSink) and read by copying in pieces of every size or
// in place (shm.SharedSource), each pair on two goroutines; the reader gets
// the blob as written, the header and trailer from their places, the
// trailer only once the writer marked the ring complete.
func TestHandoffRingWraps(t *testing.T) {
	const state = 1 << 20
	hdr, tail := []byte("a blob's header"), []byte("0123456789abcdef")
	want := make([]byte, state)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	for _, inPlaceW := range []bool{false, true} {
		for _, inPlaceR := range []bool{false, true} {
			f, err := os.Create(filepath.Join(t.TempDir(), "ring"))
			if err != nil {
				t.Fatal(err)
			}
			r, err := createRing(f, hdr, state, len(tail), 4096)
			if err != nil {
				t.Fatal(err)
			}
			if r.data() >= state/2 {
				t.Fatalf("a ring of %d bytes for a %d-byte state does not wrap", r.data(), state)
			}
			w := newRingWriter(context.Background(), r, 5*time.Second, false)
			done := make(chan error, 1)
			go func() { done <- writeRing(w, want, inPlaceW, rand.New(rand.NewPCG(5, 6)), tail) }()
			h := &handoffReader{r: r, wait: 5 * time.Second}
			var got []byte
			if inPlaceR {
				got = readInPlace(t, h)
			} else {
				got = readPieces(t, h, rng)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			wantBlob := append(append(append([]byte{}, hdr...), want...), tail...)
			if !bytes.Equal(got, wantBlob) {
				t.Fatalf("writer in place %v, reader in place %v: the reader got other bytes than the writer wrote", inPlaceW, inPlaceR)
			}
			if _, err := w.Write([]byte{1}); err == nil || !strings.Contains(err.Error(), "past") {
				t.Fatalf("a byte past the state: %v", err)
			}
			r.close()
		}
	}
}

// writeRing writes state through w, copied in random pieces or filled in
// place, then the trailer, and marks the ring complete.
func writeRing(w *ringWriter, state []byte, inPlace bool, rng *rand.Rand, tail []byte) error {
	r := w.r
	for p := state; len(p) > 0; {
		if !inPlace {
			k := min(len(p), 1+rng.IntN(3*r.chunk))
			if _, err := w.Write(p[:k]); err != nil {
				return err
			}
			p = p[k:]
			continue
		}
		for !r.room() {
			r.waitFreed(r.filled() - r.depth)
		}
		k := r.filled() % r.depth
		n := copy(r.buf(k), p)
		if err := w.Filled(k, n); err != nil {
			return err
		}
		p = p[n:]
	}
	w.flush()
	copy(r.tailBytes(), tail)
	time.Sleep(time.Millisecond) // the reader waits on the trailer meanwhile
	r.setState(ringComplete)
	return nil
}

// readPieces reads h to its end in pieces of random sizes.
func readPieces(t *testing.T, h *handoffReader, rng *rand.Rand) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, 3*h.r.chunk)
	for {
		n, err := h.Read(buf[:1+rng.IntN(len(buf))])
		got = append(got, buf[:n]...)
		if err == io.EOF {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readInPlace reads h's header, takes its state buffer by buffer in place,
// and reads its trailer, as an import whose plugin takes the ring does.
func readInPlace(t *testing.T, h *handoffReader) []byte {
	t.Helper()
	got := make([]byte, h.r.head)
	if _, err := io.ReadFull(h, got); err != nil {
		t.Fatal(err)
	}
	for h.got < h.r.state() {
		k, n, err := h.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.r.buf(k)[:n]...)
		h.r.free()
	}
	rest, err := io.ReadAll(h)
	if err != nil {
		t.Fatal(err)
	}
	return append(got, rest...)
}

// TestOpenRingRefuses: files whose size and control page disagree are not
// rings, and nothing is mapped for them.
func TestOpenRingRefuses(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "ring"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := createRing(f, []byte("hdr"), 10000, 16, 4096)
	if err != nil {
		t.Fatal(err)
	}
	good := bytes.Clone(r.mem)
	r.close()
	ctrl := len(good) - ringPage
	for name, mutate := range map[string]func(b []byte) []byte{
		"short":        func(b []byte) []byte { return b[:len(b)-ringPage] },
		"odd size":     func(b []byte) []byte { return append(b, 0) },
		"magic":        func(b []byte) []byte { b[ctrl] = 'X'; return b },
		"depth":        func(b []byte) []byte { b[ctrl+24] = 65; return b },
		"chunk":        func(b []byte) []byte { b[ctrl+16]++; return b },
		"tail":         func(b []byte) []byte { b[ctrl+40] = 3; return b },
		"total":        func(b []byte) []byte { b[ctrl+8], b[ctrl+9], b[ctrl+10] = 1, 0, 0; return b },
		"empty header": func(b []byte) []byte { return make([]byte, 2*ringPage) },
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, mutate(bytes.Clone(good)), 0o600); err != nil {
			t.Fatal(err)
		}
		g, _ := os.Open(path)
		fi, _ := g.Stat()
		if r, err := openRing(g, fi.Size()); err == nil {
			r.close()
			t.Errorf("%s: opened as a ring", name)
		}
		g.Close()
	}
	path := filepath.Join(dir, "good")
	os.WriteFile(path, good, 0o600)
	g, _ := os.OpenFile(path, os.O_RDWR, 0)
	if r, err := openRing(g, int64(len(good))); err != nil {
		t.Fatalf("the ring itself: %v", err)
	} else if r.state() != 10000 || r.head != 3 || r.tail != 16 {
		t.Fatalf("the ring reads back as state %d, head %d, tail %d", r.state(), r.head, r.tail)
	} else {
		r.close()
	}
}
