package iface

import "io"

// ChunkWriter is implemented by the StateGet writers of a data plane that
// owns its chunk buffers (the shared-memory ring): a producer fills Buffer()
// in place and commits it, which saves one copy of every state byte.
// Producers check for it with a type assertion and fall back to Write.
type ChunkWriter interface {
	io.Writer
	// Buffer returns the free part of the current chunk buffer, never empty.
	// It may block until the host has sent an earlier chunk.
	Buffer() ([]byte, error)
	// Commit marks the first n bytes of the last Buffer as written.
	Commit(n int) error
}
