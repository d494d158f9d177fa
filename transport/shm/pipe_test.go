//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// sockSource is a SocketSource over the read end of a real socket, with
// prefix standing in for bytes the host's bufio already holds.
type sockSource struct {
	prefix  []byte
	c       net.Conn
	raw     syscall.RawConn
	network string // what Network says
	read    int64  // bytes taken, by Read or splice
	spliced int64  // of them, by ReadSocket
	err     error  // the socket's first error, as the host records it
}

func (s *sockSource) Network() string { return s.network }

func (s *sockSource) Read(p []byte) (int, error) {
	if len(s.prefix) > 0 {
		n := copy(p, s.prefix)
		s.prefix = s.prefix[n:]
		s.read += int64(n)
		return n, nil
	}
	n, err := s.c.Read(p)
	s.read += int64(n)
	if err != nil && s.err == nil {
		s.err = err
	}
	return n, err
}

func (s *sockSource) Buffered() int { return len(s.prefix) }

func (s *sockSource) ReadSocket(f func(uintptr) (int, bool, error)) error {
	if len(s.prefix) > 0 {
		return errors.New("buffered bytes first")
	}
	n, err := ReadRawConn(s.raw, f)
	s.read += n
	s.spliced += n
	if err != nil && s.err == nil {
		s.err = err
	}
	return err
}

// feedSocket returns a sockSource reading data[len(prefix):] from a socket
// on network ("tcp" or "unix") that a goroutine writes, then stops writing
// after the first cut bytes of it (all when cut < 0): closing when hangUp,
// else holding the connection open until the test ends.
func feedSocket(t *testing.T, network string, data []byte, prefix, cut int, hangUp bool) *sockSource {
	t.Helper()
	w, src := sockPair(t, network)
	rest := data[prefix:]
	if cut >= 0 {
		rest = rest[:cut]
	}
	go func() {
		w.Write(rest)
		if hangUp {
			w.Close()
		}
	}()
	src.prefix = data[:prefix]
	return src
}

// sockPair connects a client to a server socket on network ("tcp" or
// "unix"), both closed when the test ends, and returns the client and a
// sockSource reading the server's end.
func sockPair(t *testing.T, network string) (net.Conn, *sockSource) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = t.TempDir() + "/s"
	}
	w, r := connPair(t, network, addr)
	raw, err := r.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return w, &sockSource{c: r, raw: raw, network: network}
}

// trickleSocket is a sockSource on a Unix socket whose client writes data in
// 100-byte pieces: each a socket buffer, so a 1 MiB pipe (256 of them) fills
// with 25,600 bytes.
func trickleSocket(t *testing.T, data []byte) *sockSource {
	w, src := sockPair(t, "unix")
	go func() {
		for p := data; len(p) > 0; p = p[min(100, len(p)):] {
			if _, err := w.Write(p[:min(100, len(p))]); err != nil {
				return
			}
		}
	}()
	return src
}

// readerKind is consumer reading through Read, in pieces of piece bytes,
// that also records the reader's type (and for a pipe reader, "/N pipes").
func readerKind(got *bytes.Buffer, kind *string, piece int) func(context.Context, int, []int32, io.Reader, int64) (int64, error) {
	read := consumer(got, piece, false)
	return func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
		*kind = fmt.Sprintf("%T", r)
		if pr, ok := r.(*pipeReader); ok {
			*kind += fmt.Sprintf("/%d pipes", len(pr.t.pipes))
		}
		return read(ctx, slot, toks, r, size)
	}
}

// TestShmPipePut: a restore from a socket is spliced into one pipe or
// several in turn that the plugin reads, on TCP and Unix sockets, with and
// without buffered bytes first, for states smaller and much larger than a
// pipe, and the bytes are right.
func TestShmPipePut(t *testing.T) {
	data := randomBytes(9<<20 + 333)
	for _, pipes := range []int{1, 2, 3, maxPipes} {
		for _, network := range []string{"tcp", "unix"} {
			for _, size := range []int{0, 1, 70_000, len(data)} {
				for i, prefix := range []int{0, min(1000, size), min(600<<10, size)} {
					if i > 0 && prefix <= 1 {
						continue
					}
					t.Run(fmt.Sprintf("pipes%d/%s/size%d/buffered%d", pipes, network, size, prefix), func(t *testing.T) {
						var got bytes.Buffer
						var kind string
						b := testBackend(t, &fakeBackend{statePut: readerKind(&got, &kind, 100_003)}, 4)
						b.pipes = pipes
						src := feedSocket(t, network, data[:size], prefix, -1, false)
						ctx := WithTransferChunk(context.Background(), 64<<10)
						n, err := b.StatePut(ctx, 1, []int32{1}, src, int64(size))
						if err != nil || n != int64(size) || !bytes.Equal(got.Bytes(), data[:size]) {
							t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(got.Bytes(), data[:size]))
						}
						if want := fmt.Sprintf("*shm.pipeReader/%d pipes", pipes); kind != want {
							t.Fatalf("the plugin read through %s, want %s", kind, want)
						}
						if src.read != int64(size) {
							t.Fatalf("the source counted %d bytes, want %d", src.read, size)
						}
					})
				}
			}
		}
	}
}

// TestShmPipePutDefaults: a spliced restore fills splicePipes pipes in turn.
func TestShmPipePutDefaults(t *testing.T) {
	data := randomBytes(3 << 20)
	var got bytes.Buffer
	var kind string
	b := testBackend(t, &fakeBackend{statePut: readerKind(&got, &kind, 1<<20)}, 4)
	n, err := b.StatePut(WithTransferChunk(context.Background(), 256<<10), 0, nil, feedSocket(t, "unix", data, 0, -1, false), int64(len(data)))
	if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("n=%d err=%v", n, err)
	}
	if want := fmt.Sprintf("*shm.pipeReader/%d pipes", splicePipes); kind != want {
		t.Fatalf("the plugin read through %s, want %s", kind, want)
	}
}

// TestShmPipePutSmallWrites: a client writing in small pieces fills a pipe
// with far fewer bytes than its capacity (a pipe holds a page reference a
// socket buffer: 256 of them in a 1 MiB pipe). With several pipes the plugin
// reads one only once told of its bytes, so the host must tell before it
// waits for room in a full pipe, not only at the end of a segment.
func TestShmPipePutSmallWrites(t *testing.T) {
	data := randomBytes(300_000)
	for _, pipes := range []int{1, 2} {
		var got bytes.Buffer
		var kind string
		b := testBackend(t, &fakeBackend{statePut: readerKind(&got, &kind, 1<<20)}, 4)
		b.pipes = pipes
		ctx, cancel := context.WithTimeout(WithTransferChunk(context.Background(), 256<<10), 20*time.Second)
		n, err := b.StatePut(ctx, 0, nil, trickleSocket(t, data), int64(len(data)))
		cancel()
		if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("%d pipes: n=%d err=%v equal=%v", pipes, n, err, bytes.Equal(got.Bytes(), data))
		}
	}
}

// ringOnly is a backend that declines pipes.
type ringOnly struct{ *fakeBackend }

func (ringOnly) PipePutMaxChunk() int { return 0 }

// smallPipes is a backend that takes pipes at chunks up to 1 MiB.
type smallPipes struct{ *fakeBackend }

func (smallPipes) PipePutMaxChunk() int { return 1 << 20 }

// TestShmPipePutOptOut: NoSplice keeps socket restores on the ring, as does
// a backend that declines pipes, or one that takes them only up to a chunk
// size for larger chunks, and a source that is no socket never goes through
// the pipe.
func TestShmPipePutOptOut(t *testing.T) {
	data := randomBytes(3 << 20)
	var got bytes.Buffer
	var kind string
	rb := testBackend(t, ringOnly{&fakeBackend{statePut: readerKind(&got, &kind, 65536)}}, 4)
	if n, err := rb.StatePut(context.Background(), 0, nil, feedSocket(t, "unix", data, 0, -1, false), int64(len(data))); err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("declining backend: n=%d err=%v", n, err)
	}
	if kind != "*shm.shmReader" {
		t.Fatalf("declining backend: the plugin read through %s, not the ring", kind)
	}
	got.Reset()
	sb := testBackend(t, smallPipes{&fakeBackend{statePut: readerKind(&got, &kind, 65536)}}, 4)
	for _, tc := range []struct {
		chunk int
		want  string
	}{{256 << 10, "*shm.pipeReader/2 pipes"}, {1 << 20, "*shm.pipeReader/2 pipes"}, {2 << 20, "*shm.shmReader"}, {0, "*shm.shmReader"}} {
		got.Reset()
		ctx := context.Background()
		if tc.chunk > 0 {
			ctx = WithTransferChunk(ctx, tc.chunk)
		}
		if n, err := sb.StatePut(ctx, 0, nil, feedSocket(t, "tcp", data, 0, -1, false), int64(len(data))); err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("pipes up to 1 MiB, chunk %d: n=%d err=%v", tc.chunk, n, err)
		}
		if kind != tc.want {
			t.Fatalf("pipes up to 1 MiB, chunk %d: the plugin read through %s, want %s", tc.chunk, kind, tc.want)
		}
	}
	got.Reset()
	b := testBackend(t, &fakeBackend{statePut: readerKind(&got, &kind, 65536)}, 4)
	b.noSplice = true
	if n, err := b.StatePut(context.Background(), 0, nil, feedSocket(t, "tcp", data, 0, -1, false), int64(len(data))); err != nil || n != int64(len(data)) {
		t.Fatalf("NoSplice: n=%d err=%v", n, err)
	}
	if kind != "*shm.shmReader" {
		t.Fatalf("NoSplice: the plugin read through %s, not the ring", kind)
	}
	b.noSplice = false
	got.Reset()
	if n, err := b.StatePut(context.Background(), 0, nil, bytes.NewReader(data), int64(len(data))); err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("plain reader: n=%d err=%v", n, err)
	}
	if kind != "*shm.shmReader" {
		t.Fatalf("plain reader: the plugin read through %s, not the ring", kind)
	}
}

// TestShmPipePutClientVanishes: the client hanging up mid-state, on the pipe
// or the ring (through the relay, or read by the host warming the ring
// ahead), fails the restore with io.ErrUnexpectedEOF, the source
// records the socket's end (the host closes the connection on it), and the
// plugin saw the failure before StatePut returned.
func TestShmPipePutClientVanishes(t *testing.T) {
	data := randomBytes(4 << 20)
	for _, network := range []string{"tcp", "unix", "tcp-ring", "unix-ring", "tcp-warm", "unix-warm"} {
		t.Run(network, func(t *testing.T) {
			var mu sync.Mutex
			var pluginErr error
			fb := &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
				_, err := io.Copy(io.Discard, r)
				mu.Lock()
				pluginErr = err
				mu.Unlock()
				return 0, fmt.Errorf("%w: %w", iface.ErrBadRequest, err)
			}}
			var backend iface.Backend = fb
			warm := strings.HasSuffix(network, "-warm")
			if strings.HasSuffix(network, "-ring") || warm {
				network, backend = network[:strings.IndexByte(network, '-')], ringOnly{fb} // the host fills the ring from the socket
			}
			b := testBackend(t, backend, 4)
			if warm {
				b.noSplice = true
			} else {
				b.warm = 0 // the plain ring fill, as for a TLS client
			}
			src := feedSocket(t, network, data, 100, 3<<20, true)
			_, err := b.StatePut(WithTransferChunk(context.Background(), 256<<10), 0, nil, src, int64(len(data)))
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
			}
			if src.err == nil {
				t.Fatal("the source did not record the client's end")
			}
			mu.Lock()
			defer mu.Unlock()
			if !errors.Is(pluginErr, io.ErrUnexpectedEOF) {
				t.Fatalf("the plugin saw %v, want io.ErrUnexpectedEOF", pluginErr)
			}
		})
	}
}

// TestShmPipePutPluginStops: a plugin that fails after a few bytes, or
// without reading any, closes the pipe (or, on the ring, stops freeing
// buffers, which the host fills through its relay or, warm, reads into
// itself); the host stops feeding at once (the client keeps its connection
// open and would send more), returns the plugin's error, and leaves the rest
// of the payload on the socket for the host to drain.
func TestShmPipePutPluginStops(t *testing.T) {
	data := randomBytes(16 << 20)
	for _, tc := range []struct {
		read       int
		ring, warm bool
	}{{0, false, false}, {100, false, false}, {2 << 20, false, false}, {0, true, false}, {100, true, false}, {5 << 20, true, false},
		{0, true, true}, {5 << 20, true, true}} {
		t.Run(fmt.Sprintf("after%d/ring=%v/warm=%v", tc.read, tc.ring, tc.warm), func(t *testing.T) {
			fb := &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
				io.ReadFull(r, make([]byte, tc.read))
				return 0, fmt.Errorf("%w: bad magic", iface.ErrBadRequest)
			}}
			var backend iface.Backend = fb
			if tc.ring {
				backend = ringOnly{fb} // through the host's relay
			}
			b := testBackend(t, backend, 4)
			if tc.warm {
				b.noSplice = true
			} else {
				b.warm = 0
			}
			src := feedSocket(t, "tcp", data, 0, -1, false)
			done := make(chan error, 1)
			go func() {
				_, err := b.StatePut(WithTransferChunk(context.Background(), 64<<10), 0, nil, src, int64(len(data)))
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, iface.ErrBadRequest) {
					t.Fatalf("err = %v, want iface.ErrBadRequest", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("StatePut still feeding a plugin that gave up")
			}
			if src.err != nil {
				t.Fatalf("the client's socket was blamed: %v", src.err)
			}
			if src.read >= int64(len(data)) {
				t.Fatalf("the host fed all %d bytes to a plugin that gave up", src.read)
			}
		})
	}
}

// TestShmPipePutCancel: cancelling a restore whose plugin has stopped
// reading (a full pipe, or a full ring behind the host's relay) returns
// promptly.
func TestShmPipePutCancel(t *testing.T) {
	for _, ring := range []bool{false, true} {
		t.Run(fmt.Sprintf("ring=%v", ring), func(t *testing.T) { testShmPipePutCancel(t, ring) })
	}
}

func testShmPipePutCancel(t *testing.T, ring bool) {
	data := randomBytes(16 << 20)
	started := make(chan struct{})
	fb := &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
		io.ReadFull(r, make([]byte, 1000))
		close(started)
		<-ctx.Done()
		return 0, ctx.Err()
	}}
	var backend iface.Backend = fb
	if ring {
		backend = ringOnly{fb}
	}
	b := testBackend(t, backend, 4)
	ctx, cancel := context.WithCancel(WithTransferChunk(context.Background(), 64<<10))
	done := make(chan error, 1)
	go func() {
		_, err := b.StatePut(ctx, 0, nil, feedSocket(t, "unix", data, 0, -1, false), int64(len(data)))
		done <- err
	}()
	<-started
	time.Sleep(50 * time.Millisecond) // let the pipe fill
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled restore succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("StatePut did not return after cancel")
	}
}

// TestPipeReaderMessages: with several pipes the plugin reads the state in
// the order the host's FILLED messages give, and a message that does not fit
// (a pipe it has not got, more bytes than are to come, none, a message of
// another kind, an early END or an ABORT) fails the read with a clear error.
func TestPipeReaderMessages(t *testing.T) {
	type msg struct {
		kind, k uint32
		n       uint64
		data    string // written to pipe k first
	}
	for _, tc := range []struct {
		name string
		msgs []msg
		want string // the bytes read; or the error's text
		err  error
	}{
		{"order", []msg{{msgFilled, 1, 3, "abc"}, {msgFilled, 0, 2, "de"}, {msgFilled, 1, 1, "f"}, {msgEnd, 0, 6, ""}}, "abcdef", nil},
		{"no such pipe", []msg{{msgFilled, 2, 3, "abc"}}, "pipe 2 of 2", nil},
		{"too many bytes", []msg{{msgFilled, 0, 7, "abcdefg"}}, "announced 7 bytes", nil},
		{"no bytes", []msg{{msgFilled, 0, 0, ""}}, "announced 0 bytes", nil},
		{"free", []msg{{msgFree, 0, 3, ""}}, "unexpected message 2", nil},
		{"early end", []msg{{msgFilled, 0, 3, "abc"}, {msgEnd, 0, 3, ""}}, "", io.ErrUnexpectedEOF},
		{"abort", []msg{{msgFilled, 0, 3, "abc"}, {msgAbort, 0, 0, ""}}, "", errShmAborted},
		{"end miscounted", []msg{{msgFilled, 0, 6, "abcdef"}, {msgEnd, 0, 5, ""}}, "", io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fds []int
			var ws []*os.File
			for range 2 {
				r, w, _, err := newPipe()
				if err != nil {
					t.Fatal(err)
				}
				fds = append(fds, r)
				ws = append(ws, os.NewFile(uintptr(w), "w"))
			}
			defer func() {
				for _, w := range ws {
					w.Close()
				}
			}()
			pipes, err := openPipes(fds)
			if err != nil {
				t.Fatal(err)
			}
			a, b, err := seqpacketPair()
			if err != nil {
				t.Fatal(err)
			}
			host, err := newCtrlConn(a, 2, 0)
			if err != nil {
				t.Fatal(err)
			}
			plugin, err := newCtrlConn(b, 2, 0)
			if err != nil {
				t.Fatal(err)
			}
			pt := &pluginTransfer{pipes: pipes, ctrl: plugin, stop: func() bool { return true }}
			defer pt.close()
			defer host.close()
			for _, m := range tc.msgs {
				if m.data != "" {
					ws[m.k%2].WriteString(m.data)
				}
				if err := host.send(m.kind, m.k, m.n); err != nil {
					t.Fatal(err)
				}
			}
			r := &pipeReader{t: pt, remain: 6}
			got, err := io.ReadAll(io.LimitReader(readerFunc(r.Read), 100))
			switch {
			case tc.err != nil:
				if !errors.Is(err, tc.err) {
					t.Fatalf("got %q, err %v; want %v", got, err, tc.err)
				}
			case tc.want == "abcdef":
				if err != nil || string(got) != tc.want {
					t.Fatalf("got %q, err %v; want %q", got, err, tc.want)
				}
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("got %q, err %v; want an error saying %q", got, err, tc.want)
			}
		})
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestShmRelay: a restore from a TCP socket onto the ring goes through the
// host's relay (pipes it splices into and reads out of), one from a Unix
// socket is read by the host itself, with and without
// buffered bytes first, and the bytes are right; a client's small writes,
// which fill a pipe with far fewer bytes than a segment, come through the
// relay too.
func TestShmRelay(t *testing.T) {
	data := randomBytes(9<<20 + 333)
	for _, network := range []string{"tcp", "unix"} {
		for _, size := range []int{1, 70_000, len(data)} {
			for i, prefix := range []int{0, min(1000, size), min(600<<10, size)} {
				if i > 0 && prefix <= 1 {
					continue
				}
				t.Run(fmt.Sprintf("%s/size%d/buffered%d", network, size, prefix), func(t *testing.T) {
					var got bytes.Buffer
					var kind string
					b := testBackend(t, ringOnly{&fakeBackend{statePut: readerKind(&got, &kind, 100_003)}}, 4)
					b.warm = 0 // a warmed fill reads the socket too: count only the relay's
					src := feedSocket(t, network, data[:size], prefix, -1, false)
					n, err := b.StatePut(WithTransferChunk(context.Background(), 2<<20), 1, []int32{1}, src, int64(size))
					if err != nil || n != int64(size) || !bytes.Equal(got.Bytes(), data[:size]) {
						t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(got.Bytes(), data[:size]))
					}
					if kind != "*shm.shmReader" {
						t.Fatalf("the plugin read through %s, not the ring", kind)
					}
					if src.read != int64(size) {
						t.Fatalf("the source counted %d bytes, want %d", src.read, size)
					}
					// TCP through the relay, Unix read by the host itself.
					if relayed := src.spliced > 0; relayed != (network == "tcp" && size > prefix) {
						t.Fatalf("%d of %d bytes relayed", src.spliced, size)
					}
				})
			}
		}
	}
	t.Run("small writes", func(t *testing.T) {
		small := data[:300_000]
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		rl, err := startRelay(ctx, trickleSocket(t, small), int64(len(small)))
		if err != nil {
			t.Fatal(err)
		}
		defer rl.stop()
		got, err := io.ReadAll(io.LimitReader(rl, int64(len(small))))
		if err != nil || !bytes.Equal(got, small) {
			t.Fatalf("read %d bytes, err %v, equal %v", len(got), err, bytes.Equal(got, small))
		}
	})
}
