//go:build linux

package iface

import (
	"context"
	"fmt"
	"io"
	"net"
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
	ln, err := net.Listen("unix", b.TempDir()+"/s")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	r, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	w := <-accepted
	if w == nil {
		b.Fatal("accept failed")
	}
	w.(*net.UnixConn).SetWriteBuffer(4 << 20) // as the engine's client connections
	b.Cleanup(func() { w.Close(); r.Close() })
	go io.CopyBuffer(io.Discard, struct{ io.Reader }{r}, make([]byte, 1<<20))
	return w
}
