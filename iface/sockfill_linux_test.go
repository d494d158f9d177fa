//go:build linux

package iface

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// pacedSocket returns a sockSource over a socket on network whose writer
// sends data[prefix:] in pieces of piece bytes, pausing pause after each,
// then trailer, and closes when hangUp.
func pacedSocket(t *testing.T, network string, data, trailer []byte, prefix, piece int, pause time.Duration, hangUp bool) (*sockSource, net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = t.TempDir() + "/s"
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); r.Close() })
	go func() {
		for rest := data[prefix:]; len(rest) > 0; rest = rest[min(piece, len(rest)):] {
			if _, err := w.Write(rest[:min(piece, len(rest))]); err != nil {
				return
			}
			time.Sleep(pause)
		}
		w.Write(trailer)
		if hangUp {
			w.Close()
		}
	}()
	raw, err := r.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return &sockSource{prefix: data[:prefix], c: r, raw: raw}, r
}

// TestFillFromSocket: a buffer fills from the source's buffered bytes and
// then its socket, whether the socket keeps up, runs dry for less than the
// poll wait or for longer (the netpoller then waits), on TCP and Unix
// sockets; the bytes after the buffer stay in the socket.
func TestFillFromSocket(t *testing.T) {
	defer func(d time.Duration) { socketPollWait = d }(socketPollWait)
	socketPollWait = 5 * time.Millisecond
	data := randomBytes(3<<20 + 17)
	trailer := []byte("next request")
	for _, network := range []string{"tcp", "unix"} {
		for _, tc := range []struct {
			prefix, piece int
			pause         time.Duration
		}{
			{0, 1 << 30, 0},
			{1000, 64 << 10, 0},
			{0, 700_001, time.Millisecond},      // dry, within the poll wait
			{7, 1 << 20, 20 * time.Millisecond}, // dry past it: the netpoller's turn
		} {
			t.Run(fmt.Sprintf("%s/prefix%d/piece%d/pause%v", network, tc.prefix, tc.piece, tc.pause), func(t *testing.T) {
				src, conn := pacedSocket(t, network, data, trailer, tc.prefix, tc.piece, tc.pause, false)
				buf := make([]byte, len(data))
				n, err := fillFromSocket(src, buf)
				if err != nil || n != len(data) || !bytes.Equal(buf, data) {
					t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(buf, data))
				}
				if src.read != int64(len(data)) {
					t.Fatalf("the source counted %d bytes, want %d", src.read, len(data))
				}
				rest := make([]byte, len(trailer))
				conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadFull(conn, rest); err != nil || !bytes.Equal(rest, trailer) {
					t.Fatalf("after the buffer the socket held %q, %v; want %q", rest, err, trailer)
				}
			})
		}
	}
}

// TestFillFromSocketClientGone: a client that hangs up mid-buffer fails the
// fill with io.ErrUnexpectedEOF after the bytes it sent, recorded by the
// source as its socket's error.
func TestFillFromSocketClientGone(t *testing.T) {
	data := randomBytes(1 << 20)
	for _, network := range []string{"tcp", "unix"} {
		src, _ := pacedSocket(t, network, data[:300_000], nil, 10, 100_000, time.Millisecond, true)
		n, err := fillFromSocket(src, make([]byte, len(data)))
		if !errors.Is(err, io.ErrUnexpectedEOF) || n != 300_000 {
			t.Fatalf("%s: n=%d err=%v, want 300000 and io.ErrUnexpectedEOF", network, n, err)
		}
		if !errors.Is(src.err, io.ErrUnexpectedEOF) {
			t.Fatalf("%s: the source recorded %v", network, src.err)
		}
	}
}

// TestFillFromSocketDeadline: a client that stalls fails the fill once the
// source's deadline passes, within the poll wait of it.
func TestFillFromSocketDeadline(t *testing.T) {
	defer func(d time.Duration) { socketPollWait = d }(socketPollWait)
	socketPollWait = 5 * time.Millisecond
	data := randomBytes(1 << 20)
	src, conn := pacedSocket(t, "tcp", data[:4096], nil, 0, 4096, 0, false)
	conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	start := time.Now()
	n, err := fillFromSocket(src, make([]byte, len(data)))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != 4096 {
		t.Fatalf("n=%d err=%v, want 4096 and the deadline", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the deadline took %v to cut the stalled client", d)
	}
}
