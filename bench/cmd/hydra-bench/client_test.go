package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// unixListener listens on a Unix socket in a test directory, closed at the
// test's end.
func unixListener(t *testing.T) (net.Listener, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, path
}

// TestBlockingConn: writes larger than the socket's buffer go through whole,
// in order, while the reader is slow; afterwards the socket is non-blocking
// again, so a Go read on it still obeys its deadline instead of hanging.
func TestBlockingConn(t *testing.T) {
	ln, path := unixListener(t)
	const size = 8 << 20
	got, done := make(chan []byte, 1), make(chan struct{})
	defer close(done)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		var b bytes.Buffer
		buf := make([]byte, 64<<10)
		for b.Len() < size {
			time.Sleep(time.Millisecond) // slow: the writer must block
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			b.Write(buf[:n])
		}
		got <- b.Bytes()
		<-done
	}()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	bc, err := newBlockingConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if n, err := bc.Write(want); n != len(want) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("the reader got %d bytes, not the %d written", len(b), len(want))
	}
	bc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := bc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read after blocking writes: %v, want the deadline", err)
	}
	if _, err := newBlockingConn(&net.TCPConn{}); err == nil {
		t.Fatal("a TCP connection was given blocking sends")
	}
}

// TestClientPut: a STATE_PUT and a STATE_GET through clients with blocking
// sends, asked-for socket buffers and both, against the raw server over a
// Unix socket.
func TestClientPut(t *testing.T) {
	dir := t.TempDir()
	const size = 3<<20 + 17
	s, err := startRawServer("unix://"+filepath.Join(dir, "raw.sock"), size)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	blob, err := os.Create(filepath.Join(dir, "blob"))
	if err != nil {
		t.Fatal(err)
	}
	defer blob.Close()
	if _, err := blob.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, o := range []clientOpts{{blocking: true}, {sockbuf: 64 << 10}, {blocking: true, sockbuf: 1 << 20}} {
		c, err := dialClient(ctx, s.addr(), o)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := putOnce(ctx, c, blob, size, "1"); err != nil {
				t.Fatalf("%+v: %v", o, err)
			}
			if _, err := getOnce(ctx, c, size, make([]byte, 1<<20)); err != nil {
				t.Fatalf("%+v: %v", o, err)
			}
		}
		c.Close()
	}
}

// TestClientSockBuf: --client-sockbuf reaches the client's socket, and the
// report's figure (sendBuffer) is what that socket has.
func TestClientSockBuf(t *testing.T) {
	ln, path := unixListener(t)
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			c.Read(make([]byte, 1))
		}
	}()
	sndbuf := func(c net.Conn) int {
		raw, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var n int
		var serr error
		if err := raw.Control(func(fd uintptr) { n, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF) }); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
		return n
	}
	const want = 64 << 10 // under any net.core.wmem_max; the kernel doubles it
	for _, o := range []clientOpts{{sockbuf: want}, {blocking: true, sockbuf: want}} {
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		c, err := unixClientConn(conn, o)
		if err != nil {
			t.Fatal(err)
		}
		got := sndbuf(c)
		if got != 2*want {
			t.Errorf("%+v: SO_SNDBUF %d, want %d", o, got, 2*want)
		}
		if rep, err := sendBuffer(want); err != nil || rep != got {
			t.Errorf("sendBuffer(%d) = %d, %v; the socket has %d", want, rep, err, got)
		}
		if _, blocking := c.(blockingConn); blocking != o.blocking {
			t.Errorf("%+v: a %T", o, c)
		}
		c.Close()
	}
}
