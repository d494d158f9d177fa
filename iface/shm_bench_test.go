//go:build linux

package iface

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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
				be := TestBackendShm(b, &fakeBackend{stateGet: committer(size)}, depth)
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
// one, both closed when the benchmark ends.
func connPair(b *testing.B, network, addr string) (dialled, accepted net.Conn) {
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
// "splice" is a design not built: the reader splices chunks from the socket
// into a pipe (page references, no copy) and a consumer reads the pipe into
// its own chunk buffer and compares it, so the one copy runs on the
// consumer's core;
// "shm" reads it into the ring for a consumer that compares every piece with
// the pattern in place (as the mock plugin verifies a restore), and
// "shm-untouched" for one that takes the pieces without reading them. The
// gap between the two shm rows is what the consumer's reading of the ring
// costs the socket reader; run with -cpuprofile to see where the time goes.
func BenchmarkShmStatePut(b *testing.B) {
	const size = 512 << 20
	pattern := make([]byte, 4<<20)
	for i := range pattern {
		pattern[i] = byte(i*7 + i>>13)
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
		b.Run(fmt.Sprintf("splice/chunk=%dKiB", chunk>>10), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				spliceToConsumer(b, fedSocket(b, pattern, size), pattern, size, chunk)
			}
		})
		for _, touch := range []bool{true, false} {
			name := "shm"
			if !touch {
				name = "shm-untouched"
			}
			b.Run(fmt.Sprintf("%s/chunk=%dKiB/depth=4", name, chunk>>10), func(b *testing.B) {
				consume := func(_ context.Context, _ int, _ []int32, r io.Reader, size int64) (int64, error) {
					cr := r.(ChunkReader)
					var n int64
					for {
						p, err := cr.Next()
						if err == io.EOF {
							return n, nil
						} else if err != nil {
							return n, err
						}
						off := int(n % int64(len(pattern)))
						if touch && !bytes.Equal(p, pattern[off:off+len(p)]) {
							return n, fmt.Errorf("bytes differ at %d", n)
						}
						n += int64(len(p))
					}
				}
				be := TestBackendShm(b, &fakeBackend{statePut: consume}, 4)
				ctx := WithTransferChunk(context.Background(), chunk)
				b.SetBytes(size)
				for b.Loop() {
					r := fedSocket(b, pattern, size)
					if n, err := be.StatePut(ctx, 0, nil, r, size); err != nil || n != size {
						b.Fatalf("StatePut = %d, %v", n, err)
					}
				}
			})
		}
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

// spliceToConsumer moves size bytes from c through a pipe to a goroutine
// that reads them chunk by chunk into one buffer and compares them with the
// pattern.
func spliceToConsumer(b *testing.B, c net.Conn, pattern []byte, size, chunk int) {
	b.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	pipeSize, _ := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, min(chunk, 1<<20))
	if pipeSize <= 0 {
		pipeSize = 64 << 10
	}
	done := make(chan error, 1)
	go func() {
		defer unix.Close(p[0])
		buf := make([]byte, chunk)
		for n := 0; n < size; {
			want := min(chunk, size-n)
			for got := 0; got < want; {
				m, err := unix.Read(p[0], buf[got:want])
				if err != nil || m == 0 {
					done <- fmt.Errorf("pipe read after %d bytes: %v", n+got, err)
					return
				}
				got += m
			}
			off := n % len(pattern)
			if !bytes.Equal(buf[:want], pattern[off:off+want]) {
				done <- fmt.Errorf("bytes differ at %d", n)
				return
			}
			n += want
		}
		done <- nil
	}()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	for rem := size; rem > 0; {
		var n int
		var serr error
		if err := raw.Read(func(fd uintptr) bool {
			var m int64
			m, serr = unix.Splice(int(fd), nil, p[1], nil, min(rem, pipeSize), unix.SPLICE_F_MOVE|unix.SPLICE_F_MORE)
			n = int(m)
			return serr != unix.EAGAIN
		}); err != nil || serr != nil || n == 0 {
			b.Fatalf("splice: %v, %v, %d", err, serr, n)
		}
		rem -= n
	}
	unix.Close(p[1])
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
