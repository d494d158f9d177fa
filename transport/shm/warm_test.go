//go:build linux

package shm

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// TestShmPutWarm: a restore the host reads from its socket into the ring
// while warming the ring ahead (a Unix socket; TCP with NoSplice, which the
// relay then leaves alone) arrives whole, bytes held in memory first, and
// through the socket's own reads. (A client that hangs up, a plugin that
// gives up: TestShmPipePutClientVanishes, TestShmPipePutPluginStops.)
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
						b := testBackend(t, ringOnly{&fakeBackend{statePut: readerKind(&got, &kind, 100_003)}}, 4)
						b.noSplice = true
						src := feedSocket(t, network, data[:size], prefix, -1, false)
						n, err := b.StatePut(WithTransferChunk(context.Background(), chunk), 1, []int32{1}, src, int64(size))
						if err != nil || n != int64(size) || !bytes.Equal(got.Bytes(), data[:size]) {
							t.Fatalf("n=%d err=%v equal=%v", n, err, bytes.Equal(got.Bytes(), data[:size]))
						}
						if kind != "*shm.shmReader" {
							t.Fatalf("the plugin read through %s, not the ring", kind)
						}
						if src.read != int64(size) || src.spliced != int64(size-prefix) {
							t.Fatalf("the source counted %d bytes, %d of them through its socket's reads; want %d, %d", src.read, src.spliced, size, size-prefix)
						}
					})
				}
			}
		}
	}
}
