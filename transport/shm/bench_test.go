//go:build linux

package shm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
)

// The shm data plane alone, in one process: a producer that commits ring
// buffers without touching them, the host writing them to a Unix socket
// that a goroutine drains (the client), against a raw writer of the same
// bytes on the same kind of socket. Serial (depth 1) and pipelined (depth 4)
// run side by side; what separates them from raw is the per-chunk cost of
// the plane (control messages, wake-ups), since no byte is produced.
//
//	go test -run '^$' -bench Shm -benchtime 3x ./iface
func BenchmarkShmStateGet(b *testing.B) {
	const size = 256 << 20
	for _, chunk := range []int{64 << 10, 256 << 10, 2 << 20} {
		b.Run(fmt.Sprintf("raw/chunk=%dKiB", chunk>>10), func(b *testing.B) {
			w := drainedSocket(b)
			buf := make([]byte, chunk)
			b.SetBytes(size)
			for b.Loop() {
				for off := 0; off < size; off += chunk {
					if _, err := w.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		for _, depth := range []int{1, 4} {
			b.Run(fmt.Sprintf("shm/chunk=%dKiB/depth=%d", chunk>>10, depth), func(b *testing.B) {
				be := testBackend(b, &fakeBackend{stateGet: committer(size)}, depth)
				w := drainedSocket(b)
				b.SetBytes(size)
				for b.Loop() {
					if n, err := be.StateGet(context.Background(), 0, chunk, w); err != nil || n != size {
						b.Fatalf("StateGet = %d, %v", n, err)
					}
				}
			})
		}
	}
}

// committer is a StateGet that hands over size bytes of ring buffers as
// they are.
func committer(size int) func(context.Context, int, int, io.Writer) (int64, error) {
	return func(_ context.Context, _, _ int, w io.Writer) (int64, error) {
		cw := w.(ChunkWriter)
		var n int64
		for n < int64(size) {
			buf, err := cw.Buffer()
			if err != nil {
				return n, err
			}
			m := min(len(buf), size-int(n))
			if err := cw.Commit(m); err != nil {
				return n, err
			}
			n += int64(m)
		}
		return n, nil
	}
}

// drainedSocket is the write end of a Unix socket pair whose read end a
// goroutine discards, through a 1 MiB buffer, until the benchmark ends.
func drainedSocket(b *testing.B) net.Conn {
	b.Helper()
	r, w := connPair(b, "unix", b.TempDir()+"/s")
	w.(*net.UnixConn).SetWriteBuffer(4 << 20) // as the engine's client connections
	go io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, make([]byte, 1<<20))
	return w
}

// connPair is a connection on network: the dialled end and the accepted
// one, both closed when the test or benchmark ends.
func connPair(b testing.TB, network, addr string) (dialled, accepted net.Conn) {
	b.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	dialled, err = net.Dial(network, ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dialled.Close() })
	accepted, err = ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { accepted.Close() })
	return dialled, accepted
}

// BenchmarkShmStatePut is the restore direction over TCP loopback, in one
// process: a client goroutine writes the state from a 4 MiB pattern buffer;
// "raw" reads it into one reused 4 MiB buffer (hydra-bench's raw server);
// "pipe" is the host's splice path: the socket is spliced into a pipe (page
// references, no copy) and the plugin reads it into its own chunk buffer and
// compares it with the pattern (as the mock verifies a restore), so the one
// copy runs on the plugin's core;
// "shm" reads it into the ring for a consumer that compares every piece with
// the pattern in place, and "shm-untouched" for one that takes the pieces
// without reading them. The gap between the two shm rows is what the
// consumer's reading of the ring costs the socket reader; run with
// -cpuprofile to see where the time goes. "pipe-into-N" reads the pipe into
// a ring of N bytes, cycled through, as the llama plugin's prefetcher reads
// into its restore ring: what the size of the reader's destination costs.
func BenchmarkShmStatePut(b *testing.B) {
	const size = 512 << 20
	pattern := make([]byte, 4<<20)
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>13)
	}
	// compare checks a restore against the pattern: each piece in place when
	// the reader offers them (the ring, unless untouched), else read into one
	// chunk buffer.
	compare := func(chunk int, touch bool) func(context.Context, int, []int32, io.Reader, int64) (int64, error) {
		return func(_ context.Context, _ int, _ []int32, r io.Reader, size int64) (int64, error) {
			cr, ok := r.(ChunkReader)
			var buf []byte
			if !ok {
				buf = make([]byte, chunk)
			}
			var n int64
			for {
				var p []byte
				var err error
				if ok {
					p, err = cr.Next()
				} else {
					var m int
					m, err = r.Read(buf)
					p = buf[:m]
				}
				if err == io.EOF {
					return n, nil
				} else if err != nil {
					return n, err
				}
				for len(p) > 0 { // a piece may wrap around the pattern
					off := int(n % int64(len(pattern)))
					m := min(len(p), len(pattern)-off)
					if touch && !bytes.Equal(p[:m], pattern[off:off+m]) {
						return n, fmt.Errorf("bytes differ at %d", n)
					}
					p, n = p[m:], n+int64(m)
				}
			}
		}
	}
	for _, chunk := range []int{256 << 10, 2 << 20} {
		b.Run(fmt.Sprintf("raw/chunk=%dKiB", chunk>>10), func(b *testing.B) {
			buf := make([]byte, 4<<20)
			b.SetBytes(size)
			for b.Loop() {
				r := fedSocket(b, pattern, size)
				for rem := size; rem > 0; {
					n, err := r.Read(buf[:min(rem, len(buf))])
					if err != nil {
						b.Fatal(err)
					}
					rem -= n
				}
			}
		})
		for _, v := range []struct {
			name        string
			pipe, touch bool
			sink        int // read into a ring of this many bytes instead of comparing
		}{{"pipe", true, true, 0}, {"shm", false, true, 0}, {"shm-untouched", false, false, 0},
			{"pipe-into-1MiB", true, false, 1 << 20}, {"pipe-into-6MiB", true, false, 6 << 20}, {"pipe-into-24MiB", true, false, 24 << 20}} {
			b.Run(fmt.Sprintf("%s/chunk=%dKiB/depth=4", v.name, chunk>>10), func(b *testing.B) {
				put := compare(chunk, v.touch)
				if v.sink > 0 {
					put = sink(v.sink)
				}
				be := testBackend(b, &fakeBackend{statePut: put}, 4)
				be.noSplice = !v.pipe
				ctx := WithTransferChunk(context.Background(), chunk)
				b.SetBytes(size)
				for b.Loop() {
					c := fedSocket(b, pattern, size)
					raw, err := c.(syscall.Conn).SyscallConn()
					if err != nil {
						b.Fatal(err)
					}
					if n, err := be.StatePut(ctx, 0, nil, &sockSource{c: c, raw: raw}, size); err != nil || n != size {
						b.Fatalf("StatePut = %d, %v", n, err)
					}
				}
			})
		}
	}
}

// sink is a restore that reads the state into a ring of size bytes, as the
// llama plugin's prefetcher reads it into its restore ring (1 MiB reads):
// with the pipe, how much the size of the reader's destination costs.
func sink(size int) func(context.Context, int, []int32, io.Reader, int64) (int64, error) {
	return func(_ context.Context, _ int, _ []int32, r io.Reader, total int64) (int64, error) {
		ring := make([]byte, size)
		for i := range ring {
			ring[i] = 1 // resident
		}
		var n int64
		for off := 0; n < total; {
			m, err := r.Read(ring[off:min(off+1<<20, size)])
			n += int64(m)
			if off += m; off == size {
				off = 0
			}
			if err == io.EOF {
				break
			} else if err != nil {
				return n, err
			}
		}
		return n, nil
	}
}

// fedSocket is the read end of a TCP loopback connection whose other end a
// goroutine fills with size bytes of the repeated pattern.
func fedSocket(b *testing.B, pattern []byte, size int) net.Conn {
	b.Helper()
	c, r := connPair(b, "tcp", "127.0.0.1:0")
	go func() {
		defer c.Close()
		for rem := size; rem > 0; {
			n, err := c.Write(pattern[:min(rem, len(pattern))])
			if err != nil {
				return
			}
			rem -= n
		}
		io.Copy(io.Discard, c) // until the reader closes
	}()
	return r
}
