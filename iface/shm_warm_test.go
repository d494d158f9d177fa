//go:build linux

package iface

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"
)

// TestWarmerTouch: the warmer loads at most ahead bytes past the write
// position, a step at a time, slides with the position (wrapping at the
// ring's end) and only loads what has not been loaded since.
func TestWarmerTouch(t *testing.T) {
	const ring, ahead, step = 1 << 20, 256 << 10, 16 << 10
	w := &warmer{mem: make([]byte, ring), ahead: ahead}
	calls := 0
	for w.touch(0, step) {
		calls++
	}
	if calls != ahead/step || w.pos != ahead {
		t.Fatalf("%d touches to pos %d, want %d to %d", calls, w.pos, ahead/step, ahead)
	}
	// 100 KiB written: that much more to warm.
	if !w.touch(100<<10, step) || w.pos != ahead-100<<10+step {
		t.Fatalf("after 100 KiB, pos %d", w.pos)
	}
	for w.touch(100<<10, step) {
	}
	if w.pos != ahead {
		t.Fatalf("pos %d, want %d", w.pos, ahead)
	}
	// Past the end of the ring, and further than ahead: from scratch.
	at := ring - 10<<10
	for w.touch(at, step) {
	}
	if w.pos != ahead || w.at != at {
		t.Fatalf("at the ring's end: pos %d at %d", w.pos, w.at)
	}
	// The position wrapped round to the ring's start.
	if !w.touch(6<<10, step) || w.pos != ahead-16<<10+step {
		t.Fatalf("after wrapping: pos %d", w.pos)
	}
}

// TestShmPutWarm: a restore the host reads from its socket into the ring
// while warming the ring ahead (a Unix socket; TCP with NoSplice, which the
// relay then leaves alone) arrives whole, bytes held in memory first, and
// through the socket's own reads; a client that hangs up midway fails it
// with io.ErrUnexpectedEOF; a plugin that gives up stops the feeding.
func TestShmPutWarm(t *testing.T) {
	data := randomBytes(9<<20 + 333)
	for _, network := range []string{"unix", "tcp"} {
		for _, size := range []int{1, 70_000, len(data)} {
			for i, prefix := range []int{0, min(1000, size), min(600<<10, size)} {
				if i > 0 && prefix <= 1 {
					continue
				}
				for _, chunk := range []int{64 << 10, 2 << 20} {
					t.Run(fmt.Sprintf("%s/size%d/buffered%d/chunk%d", network, size, prefix, chunk), func(t *testing.T) {
						var got bytes.Buffer
						var kind string
						b := TestBackendShm(t, ringOnly{&fakeBackend{statePut: readerKind(&got, &kind, 100_003)}}, 4)
						b.(*GRPCClient).PutWarm, b.(*GRPCClient).NoSplice = DefaultPutWarm, true
						src := feedSocket(t, network, data[:size], prefix, -1, false)
						n, err := b.StatePut(WithTransferChunk(context.Background(), chunk), 1, []int32{1}, src, int64(size))
						if err != nil || n != int64(size) || !bytes.Equal(got.Bytes(), data[:size]) {
							t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(got.Bytes(), data[:size]))
						}
						if kind != "*iface.shmReader" {
							t.Fatalf("the plugin read through %s, not the ring", kind)
						}
						if src.read != int64(size) || src.spliced != int64(size-prefix) {
							t.Fatalf("the source counted %d bytes, %d of them through its socket's reads; want %d, %d", src.read, src.spliced, size, size-prefix)
						}
					})
				}
			}
		}
		t.Run(network+"/hang-up", func(t *testing.T) {
			var pluginErr error
			fb := &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
				_, pluginErr = io.Copy(io.Discard, r)
				return 0, fmt.Errorf("%w: %w", ErrBadRequest, pluginErr)
			}}
			b := TestBackendShm(t, ringOnly{fb}, 4)
			b.(*GRPCClient).PutWarm, b.(*GRPCClient).NoSplice = DefaultPutWarm, true
			src := feedSocket(t, network, data, 100, 3<<20+5, true)
			_, err := b.StatePut(WithTransferChunk(context.Background(), 2<<20), 0, nil, src, int64(len(data)))
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
			}
			if !errors.Is(src.err, io.ErrUnexpectedEOF) || src.read != 3<<20+105 {
				t.Fatalf("the source recorded %v after %d bytes", src.err, src.read)
			}
			if !errors.Is(pluginErr, io.ErrUnexpectedEOF) {
				t.Fatalf("the plugin saw %v, want io.ErrUnexpectedEOF", pluginErr)
			}
		})
		t.Run(network+"/plugin-stops", func(t *testing.T) {
			big := randomBytes(16 << 20)
			fb := &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
				io.ReadFull(r, make([]byte, 3<<20))
				return 0, fmt.Errorf("%w: bad magic", ErrBadRequest)
			}}
			b := TestBackendShm(t, ringOnly{fb}, 4)
			b.(*GRPCClient).PutWarm, b.(*GRPCClient).NoSplice = DefaultPutWarm, true
			src := feedSocket(t, network, big, 0, -1, false)
			done := make(chan error, 1)
			go func() {
				_, err := b.StatePut(WithTransferChunk(context.Background(), 1<<20), 0, nil, src, int64(len(big)))
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, ErrBadRequest) {
					t.Fatalf("err = %v, want ErrBadRequest", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("StatePut still feeding a plugin that gave up")
			}
			if src.err != nil || src.read >= int64(len(big)) {
				t.Fatalf("source error %v after %d of %d bytes", src.err, src.read, len(big))
			}
		})
	}
}
