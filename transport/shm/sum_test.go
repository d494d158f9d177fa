//go:build linux

package shm

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// TestShmStatePutSum: a SumReader's bytes are summed on every path a
// restore takes (pipes from TCP and Unix, one or several; the ring from a
// plain reader, from TCP through the relay, from Unix with warming; a
// consumer reading the ring in place or through Read), continuing the seed,
// and exactly the restore's bytes: the sum is the CRC-32C of what the
// backend got, and a byte beyond the restore is left in the source.
func TestShmStatePutSum(t *testing.T) {
	data := randomBytes(5<<20 + 777)
	const seed = 0xdeadbeef
	want := crc32.Update(seed, castagnoli, data)
	for _, tc := range []struct {
		name    string
		network string // "" a plain reader
		ring    bool   // the plugin takes no pipes
		warm    bool
		pipes   int
		useNext bool
	}{
		{name: "pipes1/tcp", network: "tcp", pipes: 1},
		{name: "pipes2/unix", network: "unix", pipes: 2},
		{name: "pipes2/tcp/buffered", network: "tcp", pipes: 2},
		{name: "ring/reader/next", useNext: true},
		{name: "ring/reader/read"},
		{name: "ring/tcp-relay/next", network: "tcp", ring: true, useNext: true},
		{name: "ring/unix-warm/next", network: "unix", ring: true, warm: true, useNext: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got bytes.Buffer
			var impl iface.Backend = &fakeBackend{statePut: consumer(&got, 65_537, tc.useNext)}
			if tc.ring {
				impl = ringOnly{impl.(*fakeBackend)}
			}
			b := testBackend(t, impl, 4)
			if tc.pipes > 0 {
				b.pipes = tc.pipes
			}
			if !tc.warm {
				b.warm = 0
			}
			full := append(bytes.Clone(data), "TRAILER!"...)
			var src io.Reader = io.MultiReader(bytes.NewReader(full))
			var sock *sockSource
			if tc.network != "" {
				prefix := 0
				if tc.name == "pipes2/tcp/buffered" {
					prefix = 1000
				}
				sock = feedSocket(t, tc.network, full, prefix, -1, false)
				src = sock
			}
			sum := &SumReader{R: src, CRC: seed, Limit: int64(len(data))}
			var trace TransferTrace
			ctx := WithTransferTrace(WithTransferChunk(context.Background(), 256<<10), &trace)
			n, err := b.StatePut(ctx, 1, []int32{1}, sum, int64(len(data)))
			if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(got.Bytes(), data))
			}
			if sum.Lost || sum.N != int64(len(data)) || sum.CRC != want {
				t.Fatalf("path %s: sum %08x of %d bytes (lost %v), want %08x of %d", trace.Path, sum.CRC, sum.N, sum.Lost, want, len(data))
			}
			rest := make([]byte, 8)
			if _, err := io.ReadFull(src, rest); err != nil || string(rest) != "TRAILER!" {
				t.Fatalf("path %s: what follows the restore: %q, %v", trace.Path, rest, err)
			}
			if wantPath := map[bool]string{true: PathPipes, false: PathRing}[tc.pipes > 0]; tc.network != "tcp" || tc.pipes > 0 {
				if trace.Path != wantPath {
					t.Fatalf("path %s, want %s", trace.Path, wantPath)
				}
			} else if trace.Path != PathRingRelay {
				t.Fatalf("path %s, want %s", trace.Path, PathRingRelay)
			}
		})
	}
}

// TestShmStatePutSumPluginStops: a plugin that gives up reading its pipes
// early leaves spliced bytes no one summed: the sum is marked lost, never
// taken for a whole one; on the ring the host's sum covers exactly what it
// took from the source, so it can be completed from there.
func TestShmStatePutSumPluginStops(t *testing.T) {
	data := randomBytes(8 << 20)
	for _, tc := range []struct {
		ring    bool
		network string
	}{{false, "unix"}, {false, "tcp"}, {true, "unix"}, {true, "tcp"}} {
		ring := tc.ring
		t.Run(fmt.Sprintf("ring=%v/%s", ring, tc.network), func(t *testing.T) {
			fb := &fakeBackend{statePut: func(ctx context.Context, slot int, toks []int32, r io.Reader, size int64) (int64, error) {
				io.ReadFull(r, make([]byte, 100))
				return 0, fmt.Errorf("%w: bad magic", iface.ErrBadRequest)
			}}
			var impl iface.Backend = fb
			if ring {
				impl = ringOnly{fb}
			}
			b := testBackend(t, impl, 4)
			b.warm = 0
			src := feedSocket(t, tc.network, data, 0, -1, false)
			sum := &SumReader{R: src, Limit: int64(len(data))}
			if _, err := b.StatePut(WithTransferChunk(context.Background(), 64<<10), 0, nil, sum, int64(len(data))); err == nil {
				t.Fatal("StatePut succeeded")
			}
			t.Logf("sum of %d bytes, lost %v, the source gave %d", sum.N, sum.Lost, src.read)
			switch {
			case sum.Lost:
				// Nothing to complete (the relay or the pipes took bytes the
				// sum never saw): right only if they really were taken.
				if sum.N == src.read {
					t.Fatalf("sum marked lost, yet it covers all %d bytes the source gave", src.read)
				}
			case sum.N != src.read:
				t.Fatalf("sum of %d bytes, the source gave %d, not marked lost", sum.N, src.read)
			default:
				if _, err := io.Copy(io.Discard, sum); err != nil || sum.CRC != crc32.Checksum(data, castagnoli) {
					t.Fatalf("the ring's sum, completed from the source: %08x (%v), want %08x", sum.CRC, err, crc32.Checksum(data, castagnoli))
				}
			}
		})
	}
}
