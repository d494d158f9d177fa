//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// producer is a StateGet that writes data in pieces of the given size,
// through ChunkWriter when the writer offers it (zero-copy) and Write
// otherwise.
func producer(data []byte, piece int, useChunk bool, sawChunk *bool) func(context.Context, int, int, io.Writer) (int64, error) {
	return func(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
		cw, ok := w.(ChunkWriter)
		if sawChunk != nil {
			*sawChunk = ok
		}
		var n int64
		for off := 0; off < len(data); {
			if useChunk && ok {
				b, err := cw.Buffer()
				if err != nil {
					return n, err
				}
				m := copy(b, data[off:min(off+piece, len(data))])
				if err := cw.Commit(m); err != nil {
					return n, err
				}
				off, n = off+m, n+int64(m)
				continue
			}
			m, err := w.Write(data[off:min(off+piece, len(data))])
			off, n = off+m, n+int64(m)
			if err != nil {
				return n, err
			}
		}
		return n, nil
	}
}

func TestShmStateGet(t *testing.T) {
	data := randomBytes(10<<20 + 12345)
	for _, depth := range []int{0, 1, 2, 4, 8} {
		for _, chunk := range []int{64 << 10, 1 << 20, 3<<20 + 7} {
			for _, useChunk := range []bool{false, true} {
				name := fmt.Sprintf("depth%d/chunk%d/chunkwriter=%v", depth, chunk, useChunk)
				t.Run(name, func(t *testing.T) {
					var saw bool
					b := testBackend(t, &fakeBackend{stateGet: producer(data, 100_003, useChunk, &saw)}, depth)
					var rec chunkRecorder
					n, err := b.StateGet(context.Background(), 0, chunk, &rec)
					if err != nil || n != int64(len(data)) || !bytes.Equal(rec.data, data) {
						t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(rec.data, data))
					}
					if !saw {
						t.Fatal("the backend was not offered a ChunkWriter")
					}
					// Consecutive filled buffers may go out in one write,
					// never more than the ring holds.
					if d := ringDepth(depth, chunk, 0); rec.maxChunk() > chunk*d {
						t.Fatalf("host wrote %d bytes at once, the ring is %d × %d", rec.maxChunk(), d, chunk)
					}
				})
			}
		}
	}
}

// TestShmRingReuse: consecutive transfers reuse the ring, and a transfer with
// another geometry gets a new one; bytes are right every time.
func TestShmRingReuse(t *testing.T) {
	data := randomBytes(3 << 20)
	b := testBackend(t, &fakeBackend{stateGet: producer(data, 1<<20, true, nil)}, 2)
	for i, chunk := range []int{256 << 10, 256 << 10, 1 << 20, 256 << 10} {
		var rec chunkRecorder
		if _, err := b.StateGet(context.Background(), 0, chunk, &rec); err != nil || !bytes.Equal(rec.data, data) {
			t.Fatalf("transfer %d: %v", i, err)
		}
	}
	h := b.host
	h.poolMu.Lock()
	defer h.poolMu.Unlock()
	if len(h.pool) != 2 {
		t.Fatalf("%d idle rings, want 2 (one per geometry)", len(h.pool))
	}
}

func TestRingDepth(t *testing.T) {
	for _, c := range []struct {
		depth, chunk int
		size         int64
		want         int
	}{
		{4, 64 << 10, 0, 4}, {1, 64 << 10, 0, 1}, {16, 64 << 20, 0, 16}, {100, 1 << 20, 0, maxDepth}, // as configured
		{0, 2 << 20, 0, 4}, {0, 1 << 20, 0, 4}, {0, 64 << 20, 0, 4}, // auto: 4 from 1 MiB up
		{0, 512 << 10, 0, 8}, {0, 256 << 10, 0, 16}, {0, 100_000, 0, 42}, {0, 64 << 10, 0, 64}, {0, 4 << 10, 0, maxDepth},
		{0, 64 << 10, 100_000, 4}, {0, 64 << 10, 640 << 10, 10}, {0, 64 << 10, 1 << 30, 64}, // a restore's size bounds auto
		{3, 64 << 10, 100_000, 3},
	} {
		if got := ringDepth(c.depth, c.chunk, c.size); got != c.want {
			t.Errorf("ringDepth(%d, %d, %d) = %d, want %d", c.depth, c.chunk, c.size, got, c.want)
		}
	}
}

// TestShmAutoRingDepth: with depth 0 the plugin maps RingDepth's ring (its
// Region is chunk × depth), for STATE_GET by chunk size, for STATE_PUT also
// bounded by the state's size.
func TestShmAutoRingDepth(t *testing.T) {
	data := randomBytes(5<<20 + 17)
	var regions []int
	produce := producer(data, 1<<20, true, nil)
	fb := &fakeBackend{
		stateGet: func(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
			regions = append(regions, len(w.(RegionWriter).Region()))
			return produce(ctx, slot, chunk, w)
		},
		statePut: func(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
			regions = append(regions, len(r.(RegionReader).Region()))
			return io.Copy(io.Discard, r)
		},
	}
	b := testBackend(t, fb, 0)
	for _, chunk := range []int{64 << 10, 256 << 10, 2 << 20} {
		var rec chunkRecorder
		if _, err := b.StateGet(context.Background(), 0, chunk, &rec); err != nil || !bytes.Equal(rec.data, data) {
			t.Fatalf("STATE_GET at %d: %v", chunk, err)
		}
	}
	ctx := WithTransferChunk(context.Background(), 64<<10)
	for _, size := range []int{100_000, len(data)} {
		if n, err := b.StatePut(ctx, 1, nil, bytes.NewReader(data[:size]), int64(size)); err != nil || n != int64(size) {
			t.Fatalf("STATE_PUT of %d: %d, %v", size, n, err)
		}
	}
	if want := []int{64 * 64 << 10, 16 * 256 << 10, 4 * 2 << 20, 4 * 64 << 10, 64 * 64 << 10}; !slices.Equal(regions, want) {
		t.Fatalf("ring sizes %v, want %v", regions, want)
	}
}

func TestShmStateGetWriterFails(t *testing.T) {
	data := randomBytes(8 << 20)
	stopped := make(chan error, 1)
	fb := &fakeBackend{stateGet: func(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
		n, err := producer(data, 64<<10, true, nil)(ctx, slot, chunk, w)
		stopped <- err
		return n, err
	}}
	b := testBackend(t, fb, 2)
	boom := errors.New("client went away")
	_, err := b.StateGet(context.Background(), 0, 256<<10, &failingWriter{failAt: 5, err: boom})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the writer's", err)
	}
	select {
	case perr := <-stopped:
		if perr == nil {
			t.Fatal("the backend finished as if nothing happened")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the backend did not stop")
	}
	// The plane still works afterwards.
	var rec chunkRecorder
	if _, err := b.StateGet(context.Background(), 0, 256<<10, &rec); err != nil || !bytes.Equal(rec.data, data) {
		t.Fatalf("after a failed transfer: %v", err)
	}
}

func TestShmStateGetBackendFails(t *testing.T) {
	bad := fmt.Errorf("%w: slot 3 is gone", iface.ErrNoSlot)
	b := testBackend(t, &fakeBackend{stateGet: func(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
		w.Write(randomBytes(chunk * 3))
		return 0, bad
	}}, 2)
	_, err := b.StateGet(context.Background(), 3, 64<<10, io.Discard)
	if !errors.Is(err, iface.ErrNoSlot) {
		t.Fatalf("err = %v, want iface.ErrNoSlot", err)
	}
}

// consumer is a StatePut that copies the state into got, taking the ring's
// pieces in place (ChunkReader) when useNext and the reader offers them; a
// RegionReader's pieces must lie in its region.
func consumer(got *bytes.Buffer, piece int, useNext bool) func(context.Context, int, []int32, io.Reader, int64) (int64, error) {
	return func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
		var n int64
		var err error
		if cr, ok := r.(ChunkReader); ok && useNext {
			for {
				p, perr := cr.Next()
				if perr == io.EOF {
					break
				}
				if perr != nil {
					return n, perr
				}
				if len(p) == 0 {
					return n, errors.New("Next returned an empty piece")
				}
				if rr, ok := r.(RegionReader); ok && !within(p, rr.Region()) {
					return n, errors.New("a piece outside the reader's region")
				}
				got.Write(p)
				n += int64(len(p))
			}
		} else {
			buf := make([]byte, piece)
			if n, err = io.CopyBuffer(got, r, buf); err != nil {
				return n, err
			}
		}
		if n != size {
			return n, fmt.Errorf("%w: read %d of %d", iface.ErrBadRequest, n, size)
		}
		return n, nil
	}
}

// within reports whether p lies in region.
func within(p, region []byte) bool {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(region)))
	a := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	return a >= lo && a+uintptr(len(p)) <= lo+uintptr(len(region))
}

func TestShmStatePut(t *testing.T) {
	data := randomBytes(9<<20 + 333)
	for _, depth := range []int{0, 1, 3, 4, 8} {
		for _, chunk := range []int{0, 64 << 10, 2 << 20} {
			for _, useNext := range []bool{false, true} {
				t.Run(fmt.Sprintf("depth%d/chunk%d/next=%v", depth, chunk, useNext), func(t *testing.T) {
					var got bytes.Buffer
					b := testBackend(t, &fakeBackend{statePut: consumer(&got, 77_777, useNext)}, depth)
					ctx := context.Background()
					if chunk > 0 {
						ctx = WithTransferChunk(ctx, chunk)
					}
					src := io.MultiReader(bytes.NewReader(data), bytes.NewReader([]byte("beyond size")))
					n, err := b.StatePut(ctx, 1, []int32{1, 2}, src, int64(len(data)))
					if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
						t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(got.Bytes(), data))
					}
				})
			}
		}
	}
}

// TestShmTransferTrace: the time the host waits on a slow plugin lands in
// the transfer's trace, within the transfer's time: for a filled buffer on a
// STATE_GET, for a free one on a ring STATE_PUT; a transfer without a trace
// works.
func TestShmTransferTrace(t *testing.T) {
	const pause = 60 * time.Millisecond
	data := randomBytes(3<<20 + 5)
	slowGet := func(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
		time.Sleep(pause) // before the first byte
		n, err := w.Write(data)
		return int64(n), err
	}
	slowPut := func(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
		time.Sleep(pause) // with the ring full
		n, err := io.Copy(io.Discard, r)
		return n, err
	}
	b := testBackend(t, &fakeBackend{stateGet: slowGet, statePut: slowPut}, 1)
	for _, traced := range []bool{true, false} {
		var tr TransferTrace
		ctx := context.Background()
		if traced {
			ctx = WithTransferTrace(ctx, &tr)
		}
		start := time.Now()
		var rec chunkRecorder
		if n, err := b.StateGet(ctx, 0, 1<<20, &rec); err != nil || n != int64(len(data)) {
			t.Fatalf("StateGet = %d, %v", n, err)
		}
		// Bounds with room for a loaded machine: the host may start waiting
		// late, never wait longer than the transfer.
		if elapsed := time.Since(start); traced && (tr.BackendWait < pause/2 || tr.BackendWait > elapsed) {
			t.Fatalf("GET: backend wait %v, want about %v and no more than the transfer's %v", tr.BackendWait, pause, elapsed)
		}
		tr = TransferTrace{}
		start = time.Now()
		if n, err := b.StatePut(WithTransferChunk(ctx, 1<<20), 1, nil, bytes.NewReader(data), int64(len(data))); err != nil || n != int64(len(data)) {
			t.Fatalf("StatePut = %d, %v", n, err)
		}
		if elapsed := time.Since(start); traced && (tr.BackendWait < pause/3 || tr.BackendWait > elapsed) {
			t.Fatalf("PUT: backend wait %v, want about %v and no more than the transfer's %v", tr.BackendWait, pause, elapsed)
		}
	}
	// Through the host's relay (a TCP source onto the ring) the ring's
	// waits for free buffers are recorded as before; the relay's feeder,
	// whose waits are on the ring's fill, not on the plugin, records none.
	big := randomBytes(8 << 20)
	// The plugin sleeps once the first byte came, so that the pause starts
	// with the relay under way, not with its TCP source still connecting.
	slowAfterFirst := func(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
		var first [1]byte
		if _, err := io.ReadFull(r, first[:]); err != nil {
			return 0, err
		}
		time.Sleep(pause)
		n, err := io.Copy(io.Discard, r)
		return n + 1, err
	}
	rb := testBackend(t, ringOnly{&fakeBackend{statePut: slowAfterFirst}}, 1)
	for range 3 {
		var tr TransferTrace
		start := time.Now()
		src := feedSocket(t, "tcp", big, 0, -1, false)
		if n, err := rb.StatePut(WithTransferChunk(WithTransferTrace(context.Background(), &tr), 1<<20), 1, nil, src, int64(len(big))); err != nil || n != int64(len(big)) {
			t.Fatalf("relayed StatePut = %d, %v", n, err)
		}
		if src.spliced == 0 {
			t.Fatal("the TCP restore was not relayed")
		}
		if elapsed := time.Since(start); tr.BackendWait < pause/3 || tr.BackendWait > elapsed {
			t.Fatalf("relayed PUT: backend wait %v, want about %v and no more than the transfer's %v", tr.BackendWait, pause, elapsed)
		}
	}
}

// TestShmStatePutReaders: the host's reads land across buffer boundaries
// whatever sizes the socket returns, data and EOF together included.
func TestShmStatePutReaders(t *testing.T) {
	data := randomBytes(3<<20 + 4321)
	for name, wrap := range map[string]func(io.Reader) io.Reader{
		"half":     iotest.HalfReader,
		"data+eof": iotest.DataErrReader,
		"one byte": func(r io.Reader) io.Reader { return io.LimitReader(iotest.OneByteReader(r), 200_000) },
		"odd":      func(r io.Reader) io.Reader { return &oddReader{r: r} },
	} {
		for _, depth := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/depth%d", name, depth), func(t *testing.T) {
				src := data
				if name == "one byte" {
					src = data[:200_000]
				}
				var got bytes.Buffer
				b := testBackend(t, &fakeBackend{statePut: consumer(&got, 77_777, depth == 4)}, depth)
				ctx := WithTransferChunk(context.Background(), 64<<10)
				n, err := b.StatePut(ctx, 1, nil, wrap(bytes.NewReader(src)), int64(len(src)))
				if err != nil || n != int64(len(src)) || !bytes.Equal(got.Bytes(), src) {
					t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(got.Bytes(), src))
				}
			})
		}
	}
}

// oddReader returns pieces of changing odd sizes.
type oddReader struct {
	r    io.Reader
	turn int
}

func (o *oddReader) Read(p []byte) (int, error) {
	sizes := []int{1, 65535, 7, 200_001, 65537, 3}
	o.turn++
	return o.r.Read(p[:min(len(p), sizes[o.turn%len(sizes)])])
}

// ctrlPair is both ends of a control socket, for rings of depth da and db
// of 64 KiB buffers, each sending to its peer as to a version 0 one (a
// message per datagram).
func ctrlPair(t *testing.T, da, db int) (*ctrlConn, *ctrlConn) {
	t.Helper()
	a, b, err := seqpacketPair()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := newCtrlConn(a, da, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ca.close)
	cb, err := newCtrlConn(b, db, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cb.close)
	return ca, cb
}

// TestCtrlBatchSize: half the ring, but no more than ctrlBatchBytes of it.
func TestCtrlBatchSize(t *testing.T) {
	for _, c := range []struct{ depth, chunk, want int }{
		{1, 64 << 10, 1}, {4, 64 << 10, 2}, {4, 256 << 10, 2}, {4, 512 << 10, 2}, {4, 1 << 20, 1},
		{4, 2 << 20, 1}, {4, 64 << 20, 1}, {64, 64 << 10, 16}, {64, 1024, 32}, {128, 1024, 63}, {8, 0, 4},
	} {
		if got := ctrlBatch(c.depth, c.chunk); got != c.want {
			t.Errorf("ctrlBatch(%d, %d) = %d, want %d", c.depth, c.chunk, got, c.want)
		}
	}
}

// TestCtrlBatching: posted messages wait for a batch, or for their sender to
// wait itself, and arrive whole and in order.
func TestCtrlBatching(t *testing.T) {
	ca, cb := ctrlPair(t, 6, 1) // batches 3 and 1
	if ca.batch != 3 || cb.batch != 1 {
		t.Fatalf("batches %d, %d; want 3, 1", ca.batch, cb.batch)
	}
	pending := func() bool { // does b have a message waiting?
		cb.c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		defer cb.c.SetReadDeadline(time.Time{})
		_, _, _, err := cb.recv()
		return err == nil
	}
	expect := func(kind, k uint32, n uint64) {
		t.Helper()
		gk, gi, gn, err := cb.recv()
		if err != nil || gk != kind || gi != k || gn != n {
			t.Fatalf("got (%d, %d, %d, %v), want (%d, %d, %d)", gk, gi, gn, err, kind, k, n)
		}
	}
	for i := range 2 {
		if err := ca.post(msgFree, uint32(i), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if pending() {
		t.Fatal("a message of an unfinished batch was sent")
	}
	if err := ca.post(msgFree, 2, 2); err != nil { // completes the batch
		t.Fatal(err)
	}
	for i := range 3 {
		expect(msgFree, uint32(i), uint64(i))
	}

	// A sender about to wait sends what it holds first...
	if err := ca.post(msgFilled, 7, 70); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		kind, k, n, err := ca.recv()
		if err == nil && (kind != msgEnd || k != 0 || n != 5) {
			err = fmt.Errorf("a received (%d, %d, %d)", kind, k, n)
		}
		got <- err
	}()
	expect(msgFilled, 7, 70)
	if err := cb.send(msgEnd, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	// ...but not when a message is already there for it.
	if err := cb.send(msgFree, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := ca.post(msgFilled, 8, 80); err != nil {
		t.Fatal(err)
	}
	if kind, k, _, err := ca.recv(); err != nil || kind != msgFree || k != 1 {
		t.Fatalf("a received (%d, %d, %v)", kind, k, err)
	}
	if pending() {
		t.Fatal("a sent its held message though it did not wait")
	}
	// poll takes what has arrived without waiting; unpoll puts it back.
	if _, ok, err := ca.poll(); ok || err != nil {
		t.Fatalf("poll on an empty socket: ok %v, err %v", ok, err)
	}
	for i := range 2 {
		if err := cb.send(msgFilled, uint32(i), 9); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	m, ok, err := ca.poll()
	if !ok || err != nil || m != (ctrlMsg{msgFilled, 0, 9}) {
		t.Fatalf("poll = %+v, %v, %v", m, ok, err)
	}
	ca.unpoll(m)
	if kind, k, _, err := ca.recv(); err != nil || kind != msgFilled || k != 0 {
		t.Fatalf("recv after unpoll: (%d, %d, %v)", kind, k, err)
	}
	if m, ok, err := ca.poll(); !ok || err != nil || m.k != 1 {
		t.Fatalf("second poll = %+v, %v, %v", m, ok, err)
	}
	// send flushes held messages before its own, in order.
	if err := ca.send(msgAbort, 0, 0); err != nil {
		t.Fatal(err)
	}
	expect(msgFilled, 8, 80)
	expect(msgAbort, 0, 0)
	// A peer that goes away ends a receive that flushed first.
	if err := ca.post(msgFree, 3, 0); err != nil {
		t.Fatal(err)
	}
	cb.close()
	if _, _, _, err := ca.recv(); err == nil {
		t.Fatal("recv from a closed peer succeeded")
	}
}

func TestShmStatePutReaderFails(t *testing.T) {
	data := randomBytes(4 << 20)
	for _, tc := range []struct {
		name string
		r    io.Reader
		want error
	}{
		{"short", bytes.NewReader(data[:3<<20]), io.ErrUnexpectedEOF},
		{"error", io.MultiReader(bytes.NewReader(data[:1<<20]), iotest.ErrReader(errors.New("socket reset"))), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var pluginErr error
			fb := &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
				_, err := io.Copy(io.Discard, r)
				mu.Lock()
				pluginErr = err
				mu.Unlock()
				return 0, fmt.Errorf("%w: %w", iface.ErrBadRequest, err)
			}}
			b := testBackend(t, fb, 2)
			_, err := b.StatePut(WithTransferChunk(context.Background(), 256<<10), 0, nil, tc.r, int64(len(data)))
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			// StatePut returns only once the plugin has seen the failure.
			mu.Lock()
			defer mu.Unlock()
			if pluginErr == nil {
				t.Fatal("the plugin did not see the stream fail before StatePut returned")
			}
		})
	}
}

func TestShmStatePutBackendStopsEarly(t *testing.T) {
	data := randomBytes(6 << 20)
	b := testBackend(t, &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
		io.ReadFull(r, make([]byte, 100))
		return 0, fmt.Errorf("%w: bad magic", iface.ErrBadRequest)
	}}, 2)
	_, err := b.StatePut(WithTransferChunk(context.Background(), 64<<10), 0, nil, bytes.NewReader(data), int64(len(data)))
	if !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("err = %v, want iface.ErrBadRequest", err)
	}
	// A backend that returns success after a partial read is drained, so
	// success still means every byte arrived.
	var got bytes.Buffer
	b = testBackend(t, &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
		n, err := io.CopyN(&got, r, 1000)
		return n, err
	}}, 2)
	if n, err := b.StatePut(context.Background(), 0, nil, bytes.NewReader(data), int64(len(data))); err != nil || n != 1000 {
		t.Fatalf("n=%d err=%v", n, err)
	}
}

// TestShmConcurrentTransfers: transfers on different slots at once each get
// their own ring and the right bytes.
func TestShmConcurrentTransfers(t *testing.T) {
	datas := [][]byte{randomBytes(5 << 20), randomBytes(5<<20 + 1), randomBytes(5<<20 + 2), randomBytes(5<<20 + 3)}
	b := testBackend(t, &fakeBackend{stateGet: func(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
		return producer(datas[slot], 300_000, slot%2 == 0, nil)(ctx, slot, chunk, w)
	}}, 3)
	var wg sync.WaitGroup
	errs := make(chan error, len(datas)*3)
	for round := 0; round < 3; round++ {
		for slot := range datas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var rec chunkRecorder
				if _, err := b.StateGet(context.Background(), slot, 512<<10, &rec); err != nil {
					errs <- err
				} else if !bytes.Equal(rec.data, datas[slot]) {
					errs <- fmt.Errorf("slot %d: bytes differ", slot)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCtrlBatchIsOneDatagram(t *testing.T) {
	ca, cb := ctrlPair(t, 8, 1) // batch 4
	buf := make([]byte, 1024)

	for i := range 3 {
		if err := ca.post(msgFilled, uint32(i), uint64(10+i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ca.send(msgEnd, 0, 33); err != nil { // flushes the three with it
		t.Fatal(err)
	}
	n, err := cb.c.Read(buf)
	if err != nil || n != 4*ctrlMsgSize {
		t.Fatalf("first datagram: %d bytes, %v; want one of %d", n, err, 4*ctrlMsgSize)
	}
	// Sent again, the receiver hands them out one by one, in order, across
	// poll and recv.
	if _, err := ca.c.Write(buf[:n]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	m, ok, err := cb.poll()
	if !ok || err != nil || m != (ctrlMsg{msgFilled, 0, 10}) {
		t.Fatalf("poll = %+v, %v, %v", m, ok, err)
	}
	cb.unpoll(m)
	for i := range 3 {
		kind, k, n, err := cb.recv()
		if err != nil || kind != msgFilled || k != uint32(i) || n != uint64(10+i) {
			t.Fatalf("message %d: (%d, %d, %d, %v)", i, kind, k, n, err)
		}
	}
	if kind, _, n, err := cb.recv(); err != nil || kind != msgEnd || n != 33 {
		t.Fatalf("end: (%d, %d, %v)", kind, n, err)
	}
	// A datagram that is not whole messages is an error, not a guess.
	if _, err := ca.c.Write(buf[:ctrlMsgSize+3]); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := cb.recv(); err == nil || !strings.Contains(err.Error(), "19 bytes") {
		t.Fatalf("recv of a 19-byte datagram: %v", err)
	}
}

// otherCtrl is a plugin that speaks another control format.
type otherCtrl struct{ *server }

func (s otherCtrl) DataPlane(ctx context.Context, req *backendv1.DataPlaneRequest) (*backendv1.DataPlaneResponse, error) {
	resp, err := s.server.DataPlane(ctx, req)
	resp.CtrlVersion = ctrlVersion + 1
	return resp, err
}

// TestShmConnectRefusesOtherCtrl: a plugin announcing another control format
// is not served the shm plane (the host falls back to gRPC streams).
func TestShmConnectRefusesOtherCtrl(t *testing.T) {
	host, pluginEnd, err := NewHost()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close(); pluginEnd.Close() })
	extend := func(s *iface.GRPCServer) backendv1.BackendServer { return otherCtrl{&server{GRPCServer: s}} }
	gc := iface.TestBackendPlugin(t, &iface.BackendPlugin{Impl: &fakeBackend{}, Extend: extend})
	if c, err := Connect(context.Background(), gc, host); !errors.Is(err, ErrNotServed) {
		t.Fatalf("Connect = %v, %v; want ErrNotServed", c, err)
	}
}

// TestShmCallFailsBeforeTakingTheRing: a plugin whose shm call fails before
// it took the transfer's descriptors (here: one that never reads them) must
// not leave the host waiting for a control message that will never come.
func TestShmCallFailsBeforeTakingTheRing(t *testing.T) {
	host, pluginEnd, err := NewHost()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close(); pluginEnd.Close() })
	data := randomBytes(8 << 20)
	// The plugin serves no shm plane: its shm calls answer Unimplemented at
	// once, while the descriptors wait unread in pluginEnd.
	gc := iface.TestBackend(t, &fakeBackend{
		stateGet: producer(data, 1<<20, true, nil),
		statePut: consumer(new(bytes.Buffer), 1<<20, true),
	})
	c := &Client{GRPCClient: gc, rpc: backendv1.NewBackendClient(gc.Conn()), host: host, depth: 2, noSplice: true}
	done := make(chan error, 3)
	go func() {
		_, err := c.StateGet(context.Background(), 0, 1<<20, io.Discard)
		done <- err
	}()
	go func() {
		_, err := c.StatePut(WithTransferChunk(context.Background(), 1<<20), 0, nil, bytes.NewReader(data), int64(len(data)))
		done <- err
	}()
	// The same through a pipe: the host stops feeding a pipe nobody reads.
	pc := iface.TestBackend(t, &fakeBackend{})
	p := &Client{GRPCClient: pc, rpc: backendv1.NewBackendClient(pc.Conn()), host: host, depth: 2, pipe: true, pipes: 1}
	go func() {
		_, err := p.StatePut(context.Background(), 0, nil, feedSocket(t, "unix", data, 0, -1, false), int64(len(data)))
		done <- err
	}()
	for range 3 {
		select {
		case err := <-done:
			if !errors.Is(err, iface.ErrNotImplemented) {
				t.Fatalf("err = %v, want iface.ErrNotImplemented", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the host still waits on (or feeds) a plugin whose call failed")
		}
	}
}
