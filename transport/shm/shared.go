package shm

import (
	"context"
	"io"
	"os"
)

// SharedRing is a ring of buffers in a file of shared memory that another
// party owns (the host's engine-to-engine handoff): Depth buffers of Chunk
// bytes at the file's start, used in turn, each filled from its start. The
// data plane passes the file to the plugin as a transfer's ring, so the
// plugin fills or reads the buffers in place, while the owner decides when a
// buffer is free again; the bytes cross no other copy on this side.
type SharedRing struct {
	File  *os.File
	Mem   []byte // the owner's mapping of the buffers (at least Chunk×Depth bytes)
	Chunk int
	Depth int
}

// SharedSink takes a StateGet's buffers as the plugin fills them.
type SharedSink interface {
	// Filled passes on the next buffer in turn: k holds n bytes.
	Filled(k, n int) error
	// AwaitFreed waits until the consumer has given back more than have
	// buffers in all and returns how many; an error when the consumer gave
	// up or stalled, or ctx ended.
	AwaitFreed(ctx context.Context, have int) (int, error)
}

// SharedGetter is a Backend that can stream a slot's state straight into a
// SharedRing (the Client of a plugin serving the ring).
type SharedGetter interface {
	StateGetShared(ctx context.Context, slot int, ring SharedRing, sink SharedSink) (int64, error)
}

// SharedSource is a StatePut reader whose bytes already lie in a SharedRing
// that another party fills: a data plane that can hand the ring to its
// plugin forwards the buffers without touching them (but to sum them, for a
// SumReader), any other reads them as a stream.
type SharedSource interface {
	io.Reader
	Shared() SharedRing
	// Next waits for the next filled buffer in turn: k holds n bytes; an
	// error when the producer failed, is gone or stalled, or ctx ended. The
	// bytes count as read.
	Next(ctx context.Context) (k, n int, err error)
	// Free gives the oldest buffer Next returned back to the producer.
	Free()
}
