//go:build unix

package host

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestShmRingWraps: a writer and a reader on two goroutines move a stream
// many times the ring's size through it, in pieces of every size, and the
// reader gets the stream as written; neither side goes past total.
func TestShmRingWraps(t *testing.T) {
	const size, total = 4096, 1 << 20
	r := &shmRing{mem: make([]byte, ringHeader+size), total: total, size: size}
	want := make([]byte, total)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		wr := rand.New(rand.NewPCG(5, 6))
		for p := want; len(p) > 0; {
			k := r.put(p[:min(len(p), 1+wr.IntN(3*size))])
			if k == 0 {
				runtime.Gosched()
			}
			p = p[k:]
		}
		if r.put([]byte{1}) != 0 {
			t.Error("the ring took a byte past its total")
		}
	}()
	got := make([]byte, 0, total)
	buf := make([]byte, 3*size)
	for len(got) < total {
		k := r.take(buf[:1+rng.IntN(len(buf))])
		if k == 0 {
			runtime.Gosched()
		}
		got = append(got, buf[:k]...)
	}
	<-done
	if !bytes.Equal(got, want) || r.take(buf) != 0 {
		t.Fatal("the reader got other bytes than the writer wrote")
	}
}
