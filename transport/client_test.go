package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// handler answers one request of the fake server. payload is limited to the
// request's payload; whatever the handler leaves unread is drained. Over
// net.Pipe a handler must read the payload before replying: the client sends
// it whole before it reads, and the pipe has no buffer.
type handler func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error

// serve runs a minimal Hydra server on conn until the client hangs up.
func serve(conn net.Conn, handle handler) error {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for {
		h, err := ReadRequestHeader(br)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		key, trace, err := ReadKeyTrace(br, h)
		if err != nil {
			return err
		}
		payload := io.LimitReader(br, int64(h.PayloadLen))
		if err := handle(h, key, trace, payload, conn); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, payload); err != nil {
			return err
		}
	}
}

// pipeClient returns a Client talking to handle over net.Pipe.
func pipeClient(t testing.TB, handle handler) *Client {
	t.Helper()
	cc, sc := net.Pipe()
	return startServer(t, cc, sc, handle)
}

// tcpClient returns a Client talking to handle over loopback TCP.
func tcpClient(t testing.TB, handle handler) *Client {
	t.Helper()
	l, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cc, err := Dial(context.Background(), "tcp://"+l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return startServer(t, cc, sc, handle)
}

func startServer(t testing.TB, cc, sc net.Conn, handle handler) *Client {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- serve(sc, handle) }()
	c := NewClient(cc)
	t.Cleanup(func() {
		c.Close()
		sc.Close()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrClosedPipe) &&
			!errors.Is(err, io.ErrUnexpectedEOF) && !strings.Contains(err.Error(), "connection reset") {
			t.Errorf("fake server: %v", err)
		}
	})
	return c
}

// reply writes a whole response.
func reply(w io.Writer, status Status, meta string, payload []byte) error {
	if err := WriteResponseHeader(w, status, []byte(meta), uint64(len(payload))); err != nil || len(payload) == 0 {
		return err // (an empty Write on net.Pipe blocks until the peer reads)
	}
	_, err := w.Write(payload)
	return err
}

// echoHandler answers every request with OK, a meta naming what it got, and
// the request payload echoed back.
func echoHandler(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
	b, err := io.ReadAll(payload)
	if err != nil {
		return err
	}
	meta := fmt.Sprintf(`{"op":%q,"key":%q,"trace":%q}`, h.Op, key, trace)
	return reply(w, StatusOK, meta, b)
}

func TestClientCall(t *testing.T) {
	c := pipeClient(t, echoHandler)
	ctx := context.Background()
	for i := range 3 { // several requests on one connection
		payload := []byte(fmt.Sprintf(`{"state_chunk_size":%d}`, 1<<(16+i)))
		resp, body, err := c.Call(ctx, OpConfigure, "0", payload)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != StatusOK || resp.Err() != nil || string(resp.Meta) != `{"op":"CONFIGURE","key":"0","trace":""}` {
			t.Fatalf("response %+v, meta %s", resp, resp.Meta)
		}
		if !bytes.Equal(body, payload) || resp.PayloadLen != uint64(len(payload)) {
			t.Fatalf("payload %q, want %q", body, payload)
		}
		if err := resp.Close(); err != nil {
			t.Fatalf("Close after Call: %v", err)
		}
	}

	resp, err := c.Do(ctx, Request{Op: OpInfo, Key: "", Trace: "trace-1"})
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Meta) != `{"op":"INFO","key":"","trace":"trace-1"}` || resp.PayloadLen != 0 {
		t.Fatalf("meta %s, payload_len %d", resp.Meta, resp.PayloadLen)
	}
	if n, err := resp.Body.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("empty Body read = %d, %v", n, err)
	}
}

func TestClientReplyError(t *testing.T) {
	c := pipeClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		if _, err := io.Copy(io.Discard, payload); err != nil {
			return err
		}
		switch key {
		case "9":
			return reply(w, StatusNotFound, `{"error":"invalid slot ID"}`, nil)
		case "busy":
			return reply(w, StatusBusy, "", nil)
		}
		return reply(w, StatusError, "not json", nil)
	})
	ctx := context.Background()
	for key, want := range map[string]string{
		"9":    "transport: STATE_PUT: server replied NOT_FOUND: invalid slot ID",
		"busy": "transport: STATE_PUT: server replied BUSY",
		"x":    "transport: STATE_PUT: server replied ERROR: not json",
	} {
		resp, _, err := c.Call(ctx, OpStatePut, key, []byte{1, 2, 3})
		if err != nil {
			t.Fatalf("non-OK status made Call fail: %v", err)
		}
		var re *ReplyError
		if err := resp.Err(); !errors.As(err, &re) || err.Error() != want {
			t.Errorf("key %q: Err() = %v, want %q", key, err, want)
		}
	}
}

// patternPeriod is prime so the pattern never lines up with buffer sizes.
const patternPeriod = 65521

var patternTable = func() []byte {
	b := make([]byte, patternPeriod)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}()

// patternReader yields n deterministic bytes without holding them.
type patternReader struct{ off, n int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	for i := 0; i < len(b); {
		i += copy(b[i:], patternTable[(p.off+int64(i))%patternPeriod:])
	}
	p.off += int64(len(b))
	return len(b), nil
}

func patternCRC(t *testing.T, n int64) uint32 {
	t.Helper()
	h := crc32.NewIEEE()
	if _, err := io.CopyBuffer(h, &patternReader{n: n}, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	return h.Sum32()
}

// TestClientStreams64MiB sends and receives 64 MiB payloads and checks that
// neither side buffers them whole.
func TestClientStreams64MiB(t *testing.T) {
	const size = 64 << 20
	want := patternCRC(t, size)
	c := tcpClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		sum := crc32.NewIEEE()
		buf := make([]byte, 1<<20)
		n, err := io.CopyBuffer(sum, payload, buf)
		if err != nil {
			return err
		}
		meta := fmt.Sprintf(`{"bytes":%d,"crc":%d}`, n, sum.Sum32())
		if err := WriteResponseHeader(w, StatusOK, []byte(meta), size); err != nil {
			return err
		}
		_, err = io.CopyBuffer(struct{ io.Writer }{w}, &patternReader{n: size}, buf)
		return err
	})

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Do(ctx, Request{Op: OpStatePut, Key: "0", Payload: &patternReader{n: size}, PayloadLen: size})
	if err != nil {
		t.Fatal(err)
	}
	var meta struct{ Bytes, CRC int64 }
	if err := json.Unmarshal(resp.Meta, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Bytes != size || uint32(meta.CRC) != want {
		t.Fatalf("server got %d bytes crc %08x, want %d crc %08x", meta.Bytes, meta.CRC, size, want)
	}
	if resp.PayloadLen != size {
		t.Fatalf("payload_len %d", resp.PayloadLen)
	}
	sum := crc32.NewIEEE()
	n, err := io.CopyBuffer(sum, struct{ io.Reader }{resp.Body}, make([]byte, 256<<10))
	if err != nil || n != size || sum.Sum32() != want {
		t.Fatalf("body: %d bytes crc %08x, %v; want %d crc %08x", n, sum.Sum32(), err, size, want)
	}

	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("moving 2×64 MiB allocated %d MiB: a payload was buffered", alloc>>20)
	}

	// The connection is in sync for another request.
	if _, _, err := c.Call(ctx, OpInfo, "0", nil); err != nil {
		t.Fatal(err)
	}
}

// TestClientFiles streams a file as the request payload (sendfile) and the
// response body into a file through Body's WriteTo (splice), over TCP.
func TestClientFiles(t *testing.T) {
	const size = 8<<20 + 3
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	f, err := os.Create(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, &patternReader{n: size}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := patternCRC(t, size)

	c := tcpClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		sum := crc32.NewIEEE()
		if _, err := io.Copy(sum, payload); err != nil {
			return err
		}
		// Meta and the first payload bytes in one write, so that some of the
		// body sits in the client's read buffer when WriteTo starts.
		var first bytes.Buffer
		WriteResponseHeader(&first, StatusOK, []byte(fmt.Sprintf(`{"crc":%d}`, sum.Sum32())), size)
		io.CopyN(&first, &patternReader{n: size}, 1000)
		if _, err := w.Write(first.Bytes()); err != nil {
			return err
		}
		_, err := io.Copy(w, &patternReader{off: 1000, n: size})
		return err
	})

	src, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	resp, err := c.Do(context.Background(), Request{Op: OpStatePut, Key: "0", Payload: src, PayloadLen: size})
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Meta) != fmt.Sprintf(`{"crc":%d}`, want) {
		t.Fatalf("server saw %s, want crc %d", resp.Meta, want)
	}
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if n, err := io.Copy(out, resp.Body); err != nil || n != size {
		t.Fatalf("io.Copy(file, Body) = %d, %v", n, err)
	}
	out.Seek(0, io.SeekStart)
	sum := crc32.NewIEEE()
	io.Copy(sum, out)
	if sum.Sum32() != want {
		t.Fatal("file received through WriteTo differs")
	}
	if _, _, err := c.Call(context.Background(), OpInfo, "0", nil); err != nil {
		t.Fatalf("connection out of sync after WriteTo: %v", err)
	}
}

func TestResponseCloseDrains(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	c := pipeClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		if h.Op == OpStateGet {
			return reply(w, StatusOK, `{"n_past":1}`, big)
		}
		return echoHandler(h, key, trace, payload, w)
	})
	ctx := context.Background()
	resp, err := c.Do(ctx, Request{Op: OpStateGet, Key: "0"})
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 10)
	if _, err := io.ReadFull(resp.Body, head); err != nil || string(head) != "0123456789" {
		t.Fatalf("Body starts %q, %v", head, err)
	}
	if _, err := c.Do(ctx, Request{Op: OpInfo, Key: "0"}); !errors.Is(err, ErrUnreadBody) {
		t.Fatalf("Do with an unread Body: err = %v, want ErrUnreadBody", err)
	}
	if err := resp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := resp.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	resp, body, err := c.Call(ctx, OpInfo, "7", []byte("after"))
	if err != nil || string(body) != "after" || !strings.Contains(string(resp.Meta), `"key":"7"`) {
		t.Fatalf("request after Close: %s %q %v", resp.Meta, body, err)
	}
}

// stallingServer answers nothing: it reads a request and waits, or with
// partial set sends a header promising 100 bytes and only 10 of them.
func stallingServer(t *testing.T, partial bool) *Client {
	release := make(chan struct{})
	c := pipeClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		if _, err := io.Copy(io.Discard, payload); err != nil {
			return err
		}
		if partial {
			if err := WriteResponseHeader(w, StatusOK, nil, 100); err != nil {
				return err
			}
			w.Write(make([]byte, 10))
		}
		<-release
		return net.ErrClosed
	})
	t.Cleanup(func() { close(release) }) // runs before pipeClient's cleanup waits for the server
	return c
}

func TestClientContextDeadline(t *testing.T) {
	c := stallingServer(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Do(ctx, Request{Op: OpPrefill, Key: "0", Payload: strings.NewReader("{}"), PayloadLen: 2})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("deadline honoured after %v", d)
	}
	if _, err := c.Do(context.Background(), Request{Op: OpInfo}); !errors.Is(err, ErrClientBroken) {
		t.Fatalf("Do after a timed-out request: err = %v, want ErrClientBroken", err)
	}
}

func TestClientContextDeadlineInBody(t *testing.T) {
	c := stallingServer(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	resp, err := c.Do(ctx, Request{Op: OpStateGet, Key: "0"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if len(b) != 10 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadAll = %d bytes, %v; want 10 bytes and context.DeadlineExceeded", len(b), err)
	}
	if err := resp.Close(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v", err)
	}
}

func TestClientContextCancel(t *testing.T) {
	c := stallingServer(t, false)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel)
	if _, err := c.Do(ctx, Request{Op: OpInfo, Key: "0"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}

	c2 := pipeClient(t, echoHandler)
	if _, err := c2.Do(ctx, Request{Op: OpInfo}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with a done context: err = %v", err)
	}
	// A refused request does not break the client.
	if _, _, err := c2.Call(context.Background(), OpInfo, "0", nil); err != nil {
		t.Fatal(err)
	}
}

// TestClientDeadlineCleared checks that a request's deadline does not outlive it.
func TestClientDeadlineCleared(t *testing.T) {
	c := pipeClient(t, echoHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if _, _, err := c.Call(ctx, OpInfo, "0", nil); err != nil {
		t.Fatal(err)
	}
	cancel()
	time.Sleep(80 * time.Millisecond)
	if _, _, err := c.Call(context.Background(), OpInfo, "0", nil); err != nil {
		t.Fatalf("request after an earlier deadline passed: %v", err)
	}
}

func TestClientBadPayloads(t *testing.T) {
	c := pipeClient(t, echoHandler)
	ctx := context.Background()
	if _, err := c.Do(ctx, Request{Op: OpStatePut, PayloadLen: 5}); err == nil || errors.Is(err, ErrClientBroken) {
		t.Fatalf("nil Payload with PayloadLen 5: err = %v", err)
	}
	if _, err := c.Do(ctx, Request{Op: OpInfo, Key: strings.Repeat("k", 1<<16)}); err == nil {
		t.Fatal("64 KiB key accepted")
	}
	// Neither refusal touched the connection.
	if _, _, err := c.Call(ctx, OpInfo, "0", nil); err != nil {
		t.Fatal(err)
	}

	// A short small payload is caught before anything is sent.
	_, err := c.Do(ctx, Request{Op: OpStatePut, Key: "0", Payload: strings.NewReader("abc"), PayloadLen: 5})
	if err == nil || !strings.Contains(err.Error(), "3 of PayloadLen 5") || errors.Is(err, ErrClientBroken) {
		t.Fatalf("short Payload: err = %v", err)
	}
	if _, body, err := c.Call(ctx, OpInfo, "0", []byte("still fine")); err != nil || string(body) != "still fine" {
		t.Fatalf("after a refused short payload: %q, %v", body, err)
	}

	// A short large payload is found mid-stream: the server waits for bytes
	// that never come, so the connection is given up.
	_, err = c.Do(ctx, Request{Op: OpStatePut, Key: "0", Payload: &patternReader{n: 100 << 10}, PayloadLen: 200 << 10})
	if err == nil || !strings.Contains(err.Error(), "102400 of PayloadLen 204800") {
		t.Fatalf("short large Payload: err = %v", err)
	}
	if _, err := c.Do(ctx, Request{Op: OpInfo}); !errors.Is(err, ErrClientBroken) {
		t.Fatalf("after a short payload: err = %v, want ErrClientBroken", err)
	}
}

func TestClientInlinePayload(t *testing.T) {
	// Header and a small payload leave in one write.
	cc, sc := net.Pipe()
	c := NewClient(cc)
	defer c.Close()
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, 1024)
		n, _ := sc.Read(b) // one Read on a pipe returns at most one Write
		got <- b[:n]
		sc.Close()
	}()
	c.Do(context.Background(), Request{Op: OpSetExpertMode, Key: "0", Trace: "tr", Payload: strings.NewReader("combined"), PayloadLen: 8})
	want := unhex(t, "59 48 44 00 01 00 08 00 00 00 00 00 00 00 02 00 30 74 72 63 6f 6d 62 69 6e 65 64")
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("first write % x\nwant        % x", b, want)
	}
}

func TestClientServerGoneMidBody(t *testing.T) {
	c := pipeClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		WriteResponseHeader(w, StatusOK, nil, 100)
		w.Write(make([]byte, 10))
		return net.ErrClosed // hang up
	})
	resp, err := c.Do(context.Background(), Request{Op: OpStateGet, Key: "0"})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(resp.Body); len(b) != 10 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("ReadAll = %d bytes, %v; want 10 and io.ErrUnexpectedEOF", len(b), err)
	}
}

func TestClientUnexpectedBytes(t *testing.T) {
	c := pipeClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		// The C++ engine's STATE_GET NOT_FOUND: an unframed message after the header.
		var b bytes.Buffer
		WriteResponseHeader(&b, StatusNotFound, nil, 0)
		b.WriteString("invalid slot ID")
		_, err := w.Write(b.Bytes())
		return err
	})
	resp, err := c.Do(context.Background(), Request{Op: OpStateGet, Key: "9"})
	if err != nil || resp.Status != StatusNotFound {
		t.Fatalf("resp %+v, %v", resp, err)
	}
	if _, err := c.Do(context.Background(), Request{Op: OpInfo}); err == nil || !strings.Contains(err.Error(), "15 unexpected bytes") {
		t.Fatalf("err = %v, want a report of 15 stray bytes", err)
	}
}

func TestClientClose(t *testing.T) {
	c := pipeClient(t, echoHandler)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(context.Background(), Request{Op: OpInfo}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Do after Close: err = %v, want net.ErrClosed", err)
	}
}

func TestDialClient(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.sock")
	l, err := Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err == nil {
			serve(conn, echoHandler)
		}
	}()
	c, err := DialClient(context.Background(), "unix://"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, body, err := c.Call(context.Background(), OpSetExpertMode, "0", []byte("solo")); err != nil || string(body) != "solo" {
		t.Fatalf("Call over unix socket: %q, %v", body, err)
	}
}

// BenchmarkClientStream moves a 64 MiB payload each way over loopback TCP,
// the path of STATE_PUT and STATE_GET.
func BenchmarkClientStream(b *testing.B) {
	const size = 64 << 20
	c := tcpClient(b, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		buf := make([]byte, 1<<20)
		if _, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, payload, buf); err != nil {
			return err
		}
		if err := WriteResponseHeader(w, StatusOK, nil, size); err != nil {
			return err
		}
		_, err := io.CopyBuffer(struct{ io.Writer }{w}, &patternReader{n: size}, buf)
		return err
	})
	ctx := context.Background()
	b.SetBytes(2 * size)
	for b.Loop() {
		resp, err := c.Do(ctx, Request{Op: OpStatePut, Key: "0", Payload: &patternReader{n: size}, PayloadLen: size})
		if err != nil {
			b.Fatal(err)
		}
		if n, err := io.Copy(io.Discard, resp.Body); err != nil || n != size {
			b.Fatalf("body: %d bytes, %v", n, err)
		}
	}
}

func TestClientServerGoneBeforeReply(t *testing.T) {
	c := pipeClient(t, func(h RequestHeader, key, trace string, payload io.Reader, w io.Writer) error {
		return net.ErrClosed // hang up without a reply, as on a bad magic
	})
	_, err := c.Do(context.Background(), Request{Op: OpInfo, Key: "0"})
	if err == nil || !strings.Contains(err.Error(), "server closed the connection without a reply") {
		t.Fatalf("err = %v", err)
	}
}
