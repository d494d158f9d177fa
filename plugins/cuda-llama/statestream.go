//go:build llama && cgo

package cudallama

import (
	"context"
	"io"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// The ends of a state stream as the binding calls them (llama.StatePlan.Save,
// llama.Context.LoadState): a save's calls check for cancellation, and run
// without the context lock, which the save does not hold; a restore lets the
// lock go while it writes a KV part's rows and while it waits on the data
// plane (llama.LoadParams.Lock); its source is the restoreSource itself.

// saveCall is one StateGet's writer: where the chunks go.
type saveCall struct {
	ctx context.Context
	w   io.Writer
}

// Write writes a staged chunk (plain writers).
func (s *saveCall) Write(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	return s.w.Write(p)
}

// chunkSave is a StateGet's writer that lends its own buffers
// (shm.ChunkWriter), which the state is written into in place.
type chunkSave struct {
	*saveCall
	cw shm.ChunkWriter
}

var _ llama.ChunkWriter = (*chunkSave)(nil)

// Buffer lends the next buffer.
func (s *chunkSave) Buffer() ([]byte, error) {
	if err := s.ctx.Err(); err != nil {
		return nil, err
	}
	return s.cw.Buffer()
}

// Commit says the first n bytes of the last buffer are written.
func (s *chunkSave) Commit(n int) error { return s.cw.Commit(n) }
