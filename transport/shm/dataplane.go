// Package shm is the shared-memory data plane between the engine and a
// backend plugin on the same host: state bytes cross the process boundary
// through a ring of buffers in a memfd both map, or through pipes spliced
// from the client's socket, while gRPC carries only the calls and results.
// The host side is Client (a Backend wrapping iface.GRPCClient); the plugin
// side is Extend, passed to iface.Serve. docs/design/data-plane.md says why
// each path is the one it is.
package shm

import (
	"context"
	"hash/crc32"
	"io"
	"syscall"
	"time"
)

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

// RegionWriter is a ChunkWriter whose buffers all lie in one mapping that
// lives for the whole transfer (the shm ring). A GPU backend can pin that
// region once per transfer, so its device copies land in the buffers at DMA
// speed instead of through the driver's bounce buffer.
type RegionWriter interface {
	ChunkWriter
	Region() []byte
}

// ChunkReader is implemented by the StatePut readers of a data plane whose
// chunks already lie in memory the plugin can read (the shared-memory ring):
// a consumer that can work on the bytes where they are (compare them, copy
// them to a device) takes each piece in place, which saves one copy of every
// state byte. Consumers check for it with a type assertion; Read and Next may
// be mixed.
type ChunkReader interface {
	io.Reader
	// Next returns the next unread piece of the stream, never empty, valid
	// until the following call to Next or Read; io.EOF after the last.
	Next() ([]byte, error)
}

// RegionReader is a ChunkReader whose pieces all lie in one mapping that
// lives for the whole transfer (the shm ring): a GPU backend can pin it
// once and upload each piece to the device straight from the buffer the
// host read it into.
type RegionReader interface {
	ChunkReader
	Region() []byte
}

type transferChunkKey struct{}

// WithTransferChunk returns a context telling the data plane which chunk size
// to use for the transfer it carries (the host's state_chunk_size). StateGet
// takes it as an argument; for StatePut it is only a transport detail, so it
// rides on the context rather than in the Backend interface.
func WithTransferChunk(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, transferChunkKey{}, n)
}

// transferChunk returns the chunk size set by WithTransferChunk, or 0.
func transferChunk(ctx context.Context) int {
	n, _ := ctx.Value(transferChunkKey{}).(int)
	return n
}

type transferTraceKey struct{}

// TransferTrace collects where a state transfer's time went on the host's
// side of the data plane, so an operator can tell which end set the pace.
// BackendWait is the time the host spent waiting on the plugin: for a ring
// STATE_GET for a filled buffer, for a ring STATE_PUT for a free one, for a
// piped STATE_PUT for room in the pipe (it wakes as soon as a page is
// free, so a plugin slower than the socket shows there as many short waits
// between small splices, less than the time it costs). The rest of a
// transfer is the host's socket work or waiting on the client. The gRPC
// plane leaves it 0 (its flow control does not show who waited).
type TransferTrace struct {
	BackendWait time.Duration
	// AfterPayload (STATE_PUT, set by the host) is how long the restore took
	// after the payload's last byte came in: the plugin finishing the state.
	AfterPayload time.Duration
	// Path is the way the bytes went (Path*); the shm plane names every path
	// it takes, so an empty one is the gRPC plane's streams.
	Path string
}

// The paths of TransferTrace.Path.
const (
	PathRing      = "shm-ring"       // the ring's buffers, filled by the plugin or the host
	PathRingRelay = "shm-ring-relay" // a TCP restore spliced into the host's pipes, then copied into the ring
	PathPipes     = "shm-pipes"      // a restore spliced from the client's socket into pipes the plugin reads
	PathGRPC      = "grpc"           // gRPC stream messages
	PathShared    = "shm-shared"     // another engine's shared ring (a handoff), the plugin filling or reading it in place
)

// WithTransferTrace returns a context on which the data plane records the
// transfer it carries into t. t is written until the call returns.
func WithTransferTrace(ctx context.Context, t *TransferTrace) context.Context {
	return context.WithValue(ctx, transferTraceKey{}, t)
}

// waitClock times the host's waits on the plugin into a TransferTrace; its
// methods do nothing without one.
type waitClock struct{ t *TransferTrace }

func traceOf(ctx context.Context) waitClock {
	t, _ := ctx.Value(transferTraceKey{}).(*TransferTrace)
	return waitClock{t}
}

// since adds the time since start (from now()) to BackendWait.
func (c waitClock) since(start time.Time) {
	if c.t != nil {
		c.t.BackendWait += time.Since(start)
	}
}

// path records the transfer's path.
func (c waitClock) path(p string) {
	if c.t != nil {
		c.t.Path = p
	}
}

// now is the start of a wait, the zero time without a trace.
func (c waitClock) now() time.Time {
	if c.t == nil {
		return time.Time{}
	}
	return time.Now()
}

// SocketSource is implemented by StatePut sources whose bytes lie in a socket
// (the client's TCP or Unix connection) once the few the source buffered are
// read. The plane then splices them from the socket into pipes the plugin
// reads, so the host never copies a state byte, or, for a restore that goes
// to the ring from a TCP socket, into pipes of the host's own that another
// thread copies into the ring (the relay). Sources without a spliceable
// socket (TLS) do not implement it.
type SocketSource interface {
	io.Reader
	// Buffered is how many bytes Read returns from memory before it reads
	// the socket.
	Buffered() int
	// ReadSocket calls f with the socket's descriptor, again after the socket
	// becomes readable each time f returns done false (as syscall.RawConn's
	// Read), under the read deadline the source applies to each of its own
	// reads. f returns the bytes it took off the socket, which the source
	// counts as read, and the socket's error, if any (io.ErrUnexpectedEOF:
	// the peer closed), which the source records as its own and returns.
	// It fails if bytes are still buffered.
	ReadSocket(f func(fd uintptr) (moved int, done bool, err error)) error
	// Network is the socket's kind, "tcp" or "unix": only TCP restores onto
	// the ring are relayed, a Unix socket's the host reads itself.
	Network() string
}

// ReadRawConn is ReadSocket for a SocketSource over a syscall.RawConn: f
// again each time the socket becomes readable while it returns done false.
// It returns the bytes f took, and f's error, else the RawConn's.
func ReadRawConn(raw syscall.RawConn, f func(fd uintptr) (moved int, done bool, err error)) (int64, error) {
	var n int64
	var ferr error
	err := raw.Read(func(fd uintptr) bool {
		k, done, e := f(fd)
		n += int64(k)
		ferr = e
		return done
	})
	if err == nil {
		err = ferr
	}
	return n, err
}

// PipePutter is implemented by backends that say for which restores they
// take a pipe (the host splices the client's socket into it) rather than the
// ring: PipePutMaxChunk is the largest state_chunk_size at which they do, 0
// for none, < 0 for any. A pipe pays when the backend's consumer is light; a
// backend whose restore already keeps its core busy (a GPU backend copying
// to the device) does better on a ring of large chunks, whose socket copy the
// host's core makes in parallel. Backends without the method take pipes at
// any chunk size.
type PipePutter interface {
	PipePutMaxChunk() int
}

// A spliced restore fills splicePipes pipes in turn, so the plugin reads one
// while the host splices into the other: with one, the two contend for the
// pipe's lock. maxPipes is the most a plugin reads (DataPlaneResponse).
const (
	splicePipes = 2
	maxPipes    = 4
)

// The ring of a transfer holds defaultDepth buffers, or at chunks under 1 MiB
// as many as hold autoRingBytes, so small chunks keep as many bytes in flight
// as large ones (each buffer costs a message and a wake-up, and a deeper ring
// lets the host send several filled buffers in one write). maxDepth is the
// deepest ring a plugin maps (checkGeometry).
const (
	defaultDepth  = 4
	maxDepth      = 64
	autoRingBytes = 4 << 20
)

// ringDepth is the number of chunk-byte buffers of a transfer's ring for a
// depth set by a test (0: the rule above). size > 0 is the state's size
// where it is known (a restore): the ring is never deeper than it needs.
func ringDepth(depth, chunk int, size int64) int {
	if depth > 0 {
		return min(depth, maxDepth)
	}
	d := defaultDepth
	if chunk > 0 {
		d = max(d, (autoRingBytes+chunk-1)/chunk)
	}
	if size > 0 && chunk > 0 {
		d = min(d, int(max((size+int64(chunk)-1)/int64(chunk), defaultDepth)))
	}
	return min(d, maxDepth)
}

// castagnoli is the CRC-32C table (the SSE 4.2 / ARMv8 instruction's
// polynomial, as transport's blob trailer).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SumReader is a StatePut source whose bytes are summed as the data plane
// takes them, so that the host can check a blob's integrity trailer: the
// CRC-32C of every byte, continued from the wrapper's, and their count.
// Read sums what it returns and ends after Limit bytes; a plane that moves
// the bytes without Read (the shm Client: splices into pipes, reads into
// the ring) unwraps it and sums them where they land, or marks them Lost.
// A backend that reads r sums them by reading.
type SumReader struct {
	R     io.Reader
	CRC   uint32 // the sum so far
	N     int64  // bytes summed
	Limit int64  // the bytes of the restore: Read ends there
	// Lost: bytes left the source that no one summed (a plugin that stopped
	// reading its pipes early): the sum can no longer be completed.
	Lost bool
}

// Add sums p, bytes taken from R.
func (s *SumReader) Add(p []byte) {
	s.CRC = crc32.Update(s.CRC, castagnoli, p)
	s.N += int64(len(p))
}

func (s *SumReader) Read(p []byte) (int, error) {
	if s.N >= s.Limit {
		return 0, io.EOF
	}
	if rem := s.Limit - s.N; int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := s.R.Read(p)
	s.Add(p[:n])
	return n, err
}

// sumOf unwraps a SumReader: the reader under it and the sum, or r and nil.
func sumOf(r io.Reader) (io.Reader, *SumReader) {
	if s, ok := r.(*SumReader); ok {
		return s.R, s
	}
	return r, nil
}

// sumMetaKey is the StatePutShm trailer metadata that carries the plugin's
// sum of a piped restore, "CRC:COUNT" (CRC in hex).
const sumMetaKey = "hydra-sum"
