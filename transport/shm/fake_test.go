package shm

import (
	"context"
	"io"
	"math/rand/v2"
	"slices"

	"github.com/hydra-engine/hydra-engine/iface"
)

// fakeBackend is a Backend whose StateGet and StatePut are the test's; the
// data plane's tests make no other call (the nil iface.Backend would panic).
type fakeBackend struct {
	iface.Backend
	stateGet func(context.Context, int, int, io.Writer) (int64, error)
	statePut func(context.Context, int, []int32, io.Reader, int64) (int64, error)
}

func (f *fakeBackend) StateGet(ctx context.Context, slot int, chunkSize int, w io.Writer) (int64, error) {
	if f.stateGet == nil {
		return 0, iface.ErrNotImplemented
	}
	return f.stateGet(ctx, slot, chunkSize, w)
}

func (f *fakeBackend) StatePut(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
	if f.statePut == nil {
		return 0, iface.ErrNotImplemented
	}
	return f.statePut(ctx, slot, tokens, r, size)
}

// randomBytes is n reproducible bytes of a ChaCha8 stream, so that a shifted,
// dropped or repeated chunk cannot go unnoticed.
func randomBytes(n int) []byte {
	var seed [32]byte
	seed[0], seed[1] = byte(n), byte(n>>8)
	b := make([]byte, n)
	rand.NewChaCha8(seed).Read(b)
	return b
}

// chunkRecorder keeps what it is written and the length of each write.
type chunkRecorder struct {
	data   []byte
	chunks []int
}

func (w *chunkRecorder) Write(p []byte) (int, error) {
	w.data, w.chunks = append(w.data, p...), append(w.chunks, len(p))
	return len(p), nil
}

func (w *chunkRecorder) maxChunk() int { return slices.Max(append(w.chunks, 0)) }

// failingWriter fails its failAt-th write with err.
type failingWriter struct {
	writes, failAt int
	err            error
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.writes++; w.writes == w.failAt {
		return 0, w.err
	}
	return len(p), nil
}
