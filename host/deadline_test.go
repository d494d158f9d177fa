package host

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport/shm"
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

// tcpPair is a connected loopback TCP pair: the server side wrapped in a
// deadlineConn at rate bytes/s over window, inside a request.
func tcpPair(t *testing.T, rate int64, window time.Duration) (*deadlineConn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cli, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close(); srv.Close() })
	dc := newDeadlineConn(srv, NewMinRate(rate, window))
	dc.beginRequest(time.Minute)
	return dc, cli
}

// send writes n bytes of p every period until stop closes.
func send(c net.Conn, n int, period time.Duration, stop <-chan struct{}) {
	p := make([]byte, n)
	for {
		select {
		case <-stop:
			return
		case <-time.After(period):
		}
		if _, err := c.Write(p); err != nil {
			return
		}
	}
}

func TestMinRateCutsTrickle(t *testing.T) {
	const window = 300 * time.Millisecond
	dc, cli := tcpPair(t, 1000, window) // 300 bytes due per window
	stop := make(chan struct{})
	defer close(stop)
	go send(cli, 1, 20*time.Millisecond, stop) // 50 bytes/s, each read well within the stall limit
	start := time.Now()
	_, err := io.Copy(io.Discard, dc)
	var re *RateError
	if !errors.As(err, &re) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("trickle ended with %v, want a RateError", err)
	}
	t.Logf("cut after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if d := time.Since(start); d > 20*window {
		t.Fatalf("cut only after %v", d)
	}
}

func TestMinRateNeverCapsAMovingTransfer(t *testing.T) {
	// A window long beside the writer's 10 ms sleeps: on a loaded machine
	// (the race detector, two cores, other packages' tests) a sleeping
	// goroutine can be left off the CPU for a 100 ms window whole, and a
	// transfer that did not move for a window is cut, as it should be.
	const window = 500 * time.Millisecond
	dc, cli := tcpPair(t, 1000, window) // 500 bytes due per window
	go func() {
		p := make([]byte, 100)
		for range 60 { // 6 KB at 10 KB/s: ten times the due, over a window long
			time.Sleep(10 * time.Millisecond)
			cli.Write(p)
		}
		cli.Close()
	}()
	n, err := io.Copy(io.Discard, dc)
	if err != nil || n != 6000 {
		t.Fatalf("read %d bytes, %v", n, err)
	}
}

func TestMinRateIgnoresHostTime(t *testing.T) {
	const window = 100 * time.Millisecond
	dc, cli := tcpPair(t, 1<<20, window)
	p := make([]byte, 10)
	cli.Write(p)
	if _, err := io.ReadFull(dc, p); err != nil {
		t.Fatal(err)
	}
	// The host is busy elsewhere (the backend) for several windows while
	// the client has sent everything it can.
	cli.Write(p)
	time.Sleep(5 * window)
	if _, err := io.ReadFull(dc, p); err != nil {
		t.Fatalf("after host time: %v", err)
	}
}

func TestMinRateCutsAReaderThatStopsReading(t *testing.T) {
	const window = 200 * time.Millisecond
	dc, _ := tcpPair(t, 1<<20, window) // the client never reads
	big := make([]byte, 64<<20)
	start := time.Now()
	_, err := dc.Write(big)
	var re *RateError
	if !errors.As(err, &re) {
		t.Fatalf("write to a stalled reader: %v, want a RateError", err)
	}
	t.Logf("write cut after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestMinRateCountsRawReads: reads through rawSocket (the data plane's
// splices) count as the payload's remaining count drops.
func TestMinRateCountsRawReads(t *testing.T) {
	const window = 300 * time.Millisecond
	dc, cli := tcpPair(t, 1000, window)
	dc.payload = &io.LimitedReader{N: 1 << 20}
	raw, ok := dc.rawSocket()
	if !ok {
		t.Fatal("no raw socket")
	}
	stop := make(chan struct{})
	defer close(stop)
	go send(cli, 1, 20*time.Millisecond, stop)
	buf := make([]byte, 4096)
	var err error
	for err == nil {
		if err = dc.armRead(); err != nil {
			break
		}
		var n int64
		n, err = shm.ReadRawConn(raw, func(fd uintptr) (int, bool, error) {
			k, rerr := syscall.Read(int(fd), buf)
			if rerr == syscall.EAGAIN {
				return 0, false, nil
			}
			return max(k, 0), true, rerr
		})
		dc.payload.N -= n
	}
	var re *RateError
	if !errors.As(err, &re) {
		t.Fatalf("raw trickle ended with %v, want a RateError", err)
	}
}

func TestMinRateOff(t *testing.T) {
	m := NewMinRate(-1, time.Second)
	if d := m.Deadline(time.Now()); !d.IsZero() {
		t.Fatalf("deadline %v with the rate off", d)
	}
	m.Done(0, time.Hour)
	if m.Exceeded() {
		t.Fatal("exceeded with the rate off")
	}
}
