//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testShared is the other party of a SharedRing in one process: the
// consumer of a StateGetShared (SharedSink) or the producer of a
// statePutShared (SharedSource), which stops with errStop after stopAt
// buffers (-1: never).
type testShared struct {
	ring   SharedRing
	mu     sync.Mutex
	filled int
	freed  int
	taken  int
	lens   []int
	stopAt int
	err    error
}

var errStop = errors.New("the other engine gave up")

func newTestShared(t *testing.T, chunk, depth, stopAt int) *testShared {
	t.Helper()
	fd, err := unix.MemfdCreate("shared-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(chunk*depth)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, chunk*depth, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "shared-test")
	t.Cleanup(func() { unix.Munmap(mem); f.Close() })
	return &testShared{ring: SharedRing{File: f, Mem: mem, Chunk: chunk, Depth: depth}, lens: make([]int, depth), stopAt: stopAt}
}

// wait polls cond under the lock until it holds, ctx ends or the party stopped.
func (s *testShared) wait(ctx context.Context, cond func() bool) error {
	for {
		s.mu.Lock()
		ok, err := cond(), s.err
		s.mu.Unlock()
		switch {
		case ok:
			return nil
		case err != nil:
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// SharedSink: the consumer's side of a StateGetShared.
func (s *testShared) Filled(k, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lens[k] = n
	s.filled++
	return nil
}

func (s *testShared) AwaitFreed(ctx context.Context, have int) (int, error) {
	err := s.wait(ctx, func() bool { return s.freed > have })
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.freed, err
}

// consume takes the buffers as they are filled, up to size bytes, freeing
// each, and returns them.
func (s *testShared) consume(size int) []byte {
	var got []byte
	for seq := 0; len(got) < size; seq++ {
		if s.stopAt == seq {
			s.mu.Lock()
			s.err = errStop
			s.mu.Unlock()
			return got
		}
		if s.wait(context.Background(), func() bool { return s.filled > seq }) != nil {
			return got
		}
		k := seq % s.ring.Depth
		got = append(got, s.ring.Mem[k*s.ring.Chunk:][:s.lens[k]]...)
		s.mu.Lock()
		s.freed++
		s.mu.Unlock()
	}
	return got
}

// SharedSource: the producer's side of a statePutShared.
func (s *testShared) Read([]byte) (int, error) { return 0, errors.New("read in place only") }
func (s *testShared) Shared() SharedRing       { return s.ring }

func (s *testShared) Next(ctx context.Context) (int, int, error) {
	if err := s.wait(ctx, func() bool { return s.filled > s.taken }); err != nil {
		return 0, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.taken % s.ring.Depth
	s.taken++
	return k, s.lens[k], nil
}

func (s *testShared) Free() {
	s.mu.Lock()
	s.freed++
	s.mu.Unlock()
}

// produce fills the buffers with state in turn as they are free.
func (s *testShared) produce(state []byte) {
	for seq := 0; len(state) > 0; seq++ {
		if s.stopAt == seq {
			s.mu.Lock()
			s.err = errStop
			s.mu.Unlock()
			return
		}
		if s.wait(context.Background(), func() bool { return s.filled-s.freed < s.ring.Depth }) != nil {
			return
		}
		k := seq % s.ring.Depth
		n := copy(s.ring.Mem[k*s.ring.Chunk:(k+1)*s.ring.Chunk], state)
		state = state[n:]
		s.mu.Lock()
		s.lens[k] = n
		s.filled++
		s.mu.Unlock()
	}
}

// TestShmSharedGet: the plugin fills another party's ring in place, each
// buffer passed on in turn and refilled only once given back; where that
// party gives up, or the backend fails, the transfer ends with the reason
// on both sides and nothing waits.
func TestShmSharedGet(t *testing.T) {
	state := randomBytes(5<<20 + 123)
	var backendErr error
	c := testBackend(t, &fakeBackend{stateGet: func(_ context.Context, _, _ int, w io.Writer) (int64, error) {
		var n int64
		for p := state; len(p) > 0; {
			k := min(len(p), 300<<10)
			m, err := w.Write(p[:k])
			n += int64(m)
			if err != nil {
				backendErr = err
				return n, err
			}
			p = p[k:]
		}
		return n, nil
	}}, 0)
	for _, stopAt := range []int{-1, 0, 1} {
		sh := newTestShared(t, 1<<20, 4, stopAt)
		gotc := make(chan []byte, 1)
		go func() { gotc <- sh.consume(len(state)) }()
		backendErr = nil
		var trace TransferTrace
		n, err := c.StateGetShared(WithTransferTrace(context.Background(), &trace), 0, sh.ring, sh)
		got := <-gotc
		switch {
		case stopAt < 0 && (err != nil || n != int64(len(state)) || !bytes.Equal(got, state) || trace.Path != PathShared):
			t.Fatalf("a whole state: %d bytes, %v, path %q; the bytes equal: %v", n, err, trace.Path, bytes.Equal(got, state))
		case stopAt >= 0 && (!errors.Is(err, errStop) || backendErr == nil):
			t.Fatalf("the consumer stopping after %d buffers: %v (the backend: %v)", stopAt, err, backendErr)
		}
	}
	failing := testBackend(t, &fakeBackend{stateGet: func(_ context.Context, _, _ int, w io.Writer) (int64, error) {
		n, _ := w.Write(state[:3<<20])
		return int64(n), errors.New("the device was lost")
	}}, 0)
	sh := newTestShared(t, 1<<20, 4, -1)
	done := make(chan []byte)
	go func() { done <- sh.consume(len(state)) }()
	_, err := failing.StateGetShared(context.Background(), 0, sh.ring, sh)
	sh.stop()
	<-done
	if err == nil || !strings.Contains(err.Error(), "device was lost") {
		t.Fatalf("a backend failing halfway: %v", err)
	}
}

// stop ends the party's loop (consume, produce) where it waits.
func (s *testShared) stop() {
	s.mu.Lock()
	s.err = errStop
	s.mu.Unlock()
}

// TestShmSharedPut: the plugin reads another party's ring in place, each
// buffer summed on the way and given back once read; where the producer
// gives up, or the backend stops reading, the restore fails and nothing
// waits.
func TestShmSharedPut(t *testing.T) {
	state := randomBytes(5<<20 + 321)
	var got []byte
	c := testBackend(t, &fakeBackend{statePut: func(_ context.Context, _ int, _ []int32, r io.Reader, size int64) (int64, error) {
		var err error
		got, err = io.ReadAll(io.LimitReader(r, size))
		if err == nil && int64(len(got)) < size {
			err = io.ErrUnexpectedEOF
		}
		return int64(len(got)), err
	}}, 0)
	for _, stopAt := range []int{-1, 0, 3} {
		sh := newTestShared(t, 1<<20, 4, stopAt)
		done := make(chan struct{})
		go func() { sh.produce(state); close(done) }()
		sum := &SumReader{R: sh, Limit: int64(len(state))}
		got = nil
		n, err := c.StatePut(context.Background(), 0, nil, sum, int64(len(state)))
		sh.stop()
		<-done
		switch {
		case stopAt < 0 && (err != nil || n != int64(len(state)) || !bytes.Equal(got, state) || sum.CRC != crc32.Checksum(state, castagnoli)):
			t.Fatalf("a whole state: %d bytes, %v; the bytes equal: %v, the sum: %v", n, err, bytes.Equal(got, state), sum.CRC == crc32.Checksum(state, castagnoli))
		case stopAt >= 0 && !errors.Is(err, errStop):
			t.Fatalf("the producer stopping after %d buffers: %v", stopAt, err)
		}
	}
	stops := testBackend(t, &fakeBackend{statePut: func(_ context.Context, _ int, _ []int32, r io.Reader, _ int64) (int64, error) {
		io.ReadFull(r, make([]byte, 2<<20))
		return 0, errors.New("the state does not fit")
	}}, 0)
	sh := newTestShared(t, 1<<20, 4, -1)
	done := make(chan struct{})
	go func() { sh.produce(state); close(done) }()
	_, err := stops.StatePut(context.Background(), 0, nil, sh, int64(len(state)))
	sh.stop()
	<-done
	if err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("a backend refusing halfway: %v", err)
	}
}
