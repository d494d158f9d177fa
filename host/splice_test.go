package host

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSocketTrackerAccounting: a STATE_PUT payload handed to the data plane
// as an shm.SocketSource gives its buffered bytes first, then the socket;
// bytes taken off the socket count against the payload, so the request that
// follows it on the connection is read intact.
func TestSocketTrackerAccounting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	payload := make([]byte, 1<<20)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	go client.Write(append(append([]byte("HDR"), payload...), "NEXT"...))

	dc := &deadlineConn{Conn: server, readTimeout: 5 * time.Second}
	br := bufio.NewReaderSize(dc, 64<<10)
	hdr := make([]byte, 3)
	if _, err := io.ReadFull(br, hdr); err != nil || string(hdr) != "HDR" {
		t.Fatalf("header %q, %v", hdr, err)
	}
	req := &request{payload: &io.LimitedReader{R: payloadReader{br, dc}, N: int64(len(payload))}, conn: dc}
	src := &readTracker{r: req.payload}
	st := spliceable(req, src)
	if st == nil {
		t.Fatal("a TCP payload is not offered for splicing")
	}
	if n := st.Network(); n != "tcp" {
		t.Fatalf("a TCP payload says its socket is %q", n)
	}
	var got []byte
	if b := st.Buffered(); b > 0 {
		if err := st.ReadSocket(func(uintptr) (int, bool, error) { return 0, true, nil }); err == nil {
			t.Fatal("ReadSocket ran under buffered bytes")
		}
		p := make([]byte, b)
		if _, err := io.ReadFull(st, p); err != nil {
			t.Fatal(err)
		}
		got = append(got, p...)
	}
	if st.Buffered() != 0 {
		t.Fatalf("%d bytes still buffered", st.Buffered())
	}
	// Take the rest off the socket as the data plane does, by descriptor.
	buf := make([]byte, 256<<10)
	for req.payload.N > 0 {
		err := st.ReadSocket(func(fd uintptr) (int, bool, error) {
			n, err := unix.Read(int(fd), buf[:min(int64(len(buf)), req.payload.N)])
			if err == unix.EAGAIN {
				return 0, false, nil
			}
			if err != nil {
				return 0, true, err
			}
			got = append(got, buf[:n]...)
			return n, true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("payload bytes differ")
	}
	// The last byte came in through ReadSocket: the trace's AfterPayload
	// counts from there.
	if src.last.IsZero() || src.sinceLast() <= 0 || src.sinceLast() > time.Minute {
		t.Fatalf("last payload byte at %v (%v ago)", src.last, src.sinceLast())
	}
	next := make([]byte, 4)
	if _, err := io.ReadFull(br, next); err != nil || string(next) != "NEXT" {
		t.Fatalf("the next request reads %q, %v", next, err)
	}
	if src.err != nil {
		t.Fatalf("a clean payload recorded %v", src.err)
	}
	// A socket error met by the data plane is the client's: recorded.
	boom := errors.New("connection reset")
	if err := st.ReadSocket(func(uintptr) (int, bool, error) { return 0, true, boom }); !errors.Is(err, boom) || !errors.Is(src.err, boom) {
		t.Fatalf("ReadSocket = %v, recorded %v", err, src.err)
	}
}

// TestSocketNetworkUnix: a payload on a Unix socket says so (the shm plane
// relays only TCP restores onto the ring).
func TestSocketNetworkUnix(t *testing.T) {
	dc := &deadlineConn{Conn: acceptedPair(t, "unix", t.TempDir()+"/s")}
	req := &request{payload: &io.LimitedReader{R: payloadReader{bufio.NewReader(dc), dc}, N: 10}, conn: dc}
	st := spliceable(req, &readTracker{r: req.payload})
	if st == nil || st.Network() != "unix" {
		t.Fatalf("a Unix socket payload: %v", st)
	}
}

// TestSpliceableNeedsAKernelSocket: connections the kernel cannot splice
// from (TLS, in-memory) keep the plain reader.
func TestSpliceableNeedsAKernelSocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	dc := &deadlineConn{Conn: a}
	req := &request{payload: &io.LimitedReader{R: payloadReader{bufio.NewReader(dc), dc}, N: 10}, conn: dc}
	if st := spliceable(req, &readTracker{r: req.payload}); st != nil {
		t.Fatal("an in-memory connection was offered for splicing")
	}
}

// TestReadTrackerLast: the time of the payload's last byte is taken when the
// announced length is used up by Read, not before, and never for a payload
// cut short.
func TestReadTrackerLast(t *testing.T) {
	tr := &readTracker{r: &io.LimitedReader{R: bytes.NewReader(make([]byte, 10)), N: 10}}
	if d := tr.sinceLast(); d != 0 {
		t.Fatalf("sinceLast before any read: %v", d)
	}
	p := make([]byte, 6)
	if _, err := tr.Read(p); err != nil || !tr.last.IsZero() {
		t.Fatalf("after 6 of 10 bytes: %v, last %v", err, tr.last)
	}
	if n, err := tr.Read(p); n != 4 || err != nil || tr.last.IsZero() {
		t.Fatalf("after 10 of 10 bytes: %d, %v, last %v", n, err, tr.last)
	}
	cut := &readTracker{r: &io.LimitedReader{R: bytes.NewReader(make([]byte, 3)), N: 10}}
	if _, err := io.ReadFull(cut, make([]byte, 10)); err == nil || !cut.last.IsZero() || cut.err == nil {
		t.Fatalf("a payload cut short: %v, last %v, recorded %v", err, cut.last, cut.err)
	}
}
