//go:build unix

package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/transport"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// handoffRing is the file of a state handed from one engine to another on
// this host, with one writer and one reader, each in its own process: depth
// buffers of chunk bytes at the file's start, used in turn and each filled
// from its start, then the blob's header and trailer, which the hosts write
// and read themselves, then a control page, the file's last. The buffers sit
// where a data plane's ring does (shm.SharedRing), so the exporting engine's
// plugin fills them in place and the importing engine's plugin reads them in
// place: the state's bytes are copied once out of one plugin and once into
// the other (a host whose backend cannot take the ring copies them in or out
// itself). The buffers are written over and over, so a transfer of any size
// touches no more memory than the ring. Control page, little-endian:
//
//	[0:8)      magic "HYDRING2"
//	[8:16)     total: the blob's bytes (header, state, trailer)
//	[16:24)    chunk
//	[24:32)    depth (at most maxRingDepth)
//	[32:40)    head: the header's bytes
//	[40:48)    tail: the trailer's bytes (0 or transport.TrailerSize)
//	[64:72)    filled: buffers published so far (the writer's; atomic)
//	[128:136)  freed: buffers given back so far (the reader's; atomic)
//	[192:196)  state: ringGoing, ringWriterFailed, ringReaderGone or ringComplete (atomic)
//	[256:260)  claimed: 1 once a reader took the ring (atomic)
//	[512:1024) each buffer's byte count as last published
type handoffRing struct {
	file         *os.File // kept open: a plugin is given the ring through it
	mem          []byte
	ctrl         []byte // the control page
	chunk, depth int
	total        int64
	head, tail   int
}

const (
	ringMagic = "HYDRING2"
	ringPage  = 4096
	// ringMax is the buffers' bytes an export makes: big enough that neither
	// side waits on the other for long, small enough that what the writer
	// puts in is still in the CPU's cache when the reader takes it out (a
	// ring of several times the last-level cache loses to one that fits:
	// docs/design/data-plane.md).
	ringMax = 16 << 20
	// ringLimit is the most buffer bytes an import maps: an engine of
	// another version may make bigger rings.
	ringLimit = 64 << 20
	// maxRingDepth is the most buffers a ring has (the data plane's limit).
	maxRingDepth = 64

	ringGoing        = 0
	ringWriterFailed = 1
	ringReaderGone   = 2
	ringComplete     = 3 // the writer wrote every byte and freed the source slot

	offFilled, offFreed, offState, offClaimed, offLens = 64, 128, 192, 256, 512
)

// ringGeometry is the buffers of an export of a state of size bytes at the
// engine's chunk size: chunks up to half the ring, as many as fill it and
// no more than the state needs.
func ringGeometry(chunk int, size int64) (int, int) {
	chunk = min(max(chunk, ringPage), ringMax/2)
	if size < int64(chunk) {
		chunk = int(max((size+ringPage-1)/ringPage*ringPage, ringPage))
	}
	depth := min(ringMax/chunk, maxRingDepth, int(max((size+int64(chunk)-1)/int64(chunk), 2)))
	return chunk, max(depth, 2)
}

// pageUp rounds n up to whole pages.
func pageUp(n int64) int64 { return (n + ringPage - 1) / ringPage * ringPage }

// createRing makes f the ring of a blob of header hdr, state bytes and a
// trailer of tail bytes, at the engine's chunk size, its pages allocated and
// mapped at once (a fresh file's pages would otherwise fault one at a time
// under the first copies), the header written.
func createRing(f *os.File, hdr []byte, state int64, tail int, chunk int) (*handoffRing, error) {
	chunk, depth := ringGeometry(chunk, state)
	data := int64(chunk * depth)
	size := data + pageUp(int64(len(hdr)+tail)) + ringPage
	if err := reserve(f, size); err != nil {
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, populated)
	if err != nil {
		return nil, fmt.Errorf("mapping the export: %w", err)
	}
	r := &handoffRing{file: f, mem: mem, ctrl: mem[size-ringPage:], chunk: chunk, depth: depth,
		total: int64(len(hdr)) + state + int64(tail), head: len(hdr), tail: tail}
	copy(r.ctrl, ringMagic)
	for i, v := range []int64{r.total, int64(chunk), int64(depth), int64(r.head), int64(tail)} {
		binary.LittleEndian.PutUint64(r.ctrl[8+8*i:], uint64(v))
	}
	copy(mem[data:], hdr)
	return r, nil
}

// openRing maps a ring another process made in f, of fileSize bytes, once
// its control page shows a ring of that size.
func openRing(f *os.File, fileSize int64) (*handoffRing, error) {
	bad := errors.New("not an export's ring (its size and control page disagree)")
	if fileSize < 2*ringPage || fileSize%ringPage != 0 {
		return nil, fmt.Errorf("%d bytes: not an export's ring", fileSize)
	}
	var ctrl [48]byte
	if _, err := f.ReadAt(ctrl[:], fileSize-ringPage); err != nil {
		return nil, fmt.Errorf("reading the export's control page: %w", err)
	}
	if string(ctrl[:8]) != ringMagic {
		return nil, errors.New("not an export's ring (no ring's control page)")
	}
	u := func(i int) int64 { return int64(binary.LittleEndian.Uint64(ctrl[8+8*i:])) }
	total, chunk, depth, head, tail := u(0), u(1), u(2), u(3), u(4)
	switch {
	case chunk <= 0 || chunk > ringLimit || depth < 1 || depth > maxRingDepth || chunk*depth > ringLimit,
		head < 0 || head > fileSize || (tail != 0 && tail != transport.TrailerSize) || total < head+tail,
		chunk*depth+pageUp(head+tail)+ringPage != fileSize:
		return nil, bad
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(fileSize), syscall.PROT_READ|syscall.PROT_WRITE, populated)
	if err != nil {
		return nil, fmt.Errorf("mapping the export: %w", err)
	}
	return &handoffRing{file: f, mem: mem, ctrl: mem[fileSize-ringPage:], chunk: int(chunk), depth: int(depth),
		total: total, head: int(head), tail: int(tail)}, nil
}

// state is the bytes of the blob the buffers carry.
func (r *handoffRing) state() int64 { return r.total - int64(r.head+r.tail) }

// data is the buffers' bytes.
func (r *handoffRing) data() int { return r.chunk * r.depth }

// headBytes and tailBytes are the blob's header and trailer.
func (r *handoffRing) headBytes() []byte { return r.mem[r.data() : r.data()+r.head] }
func (r *handoffRing) tailBytes() []byte {
	return r.mem[r.data()+r.head : r.data()+r.head+r.tail]
}

// buf is buffer k.
func (r *handoffRing) buf(k int) []byte { return r.mem[k*r.chunk : (k+1)*r.chunk] }

// shared is the ring as the data plane gives it to a plugin.
func (r *handoffRing) shared() shm.SharedRing {
	return shm.SharedRing{File: r.file, Mem: r.mem[:r.data()], Chunk: r.chunk, Depth: r.depth}
}

func (r *handoffRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.ctrl[off])) }
func (r *handoffRing) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.ctrl[off])) }

func (r *handoffRing) filled() int      { return int(atomic.LoadUint64(r.u64(offFilled))) }
func (r *handoffRing) freed() int       { return int(atomic.LoadUint64(r.u64(offFreed))) }
func (r *handoffRing) status() uint32   { return atomic.LoadUint32(r.u32(offState)) }
func (r *handoffRing) claimed() bool    { return atomic.LoadUint32(r.u32(offClaimed)) == 1 }
func (r *handoffRing) room() bool       { return r.filled()-r.freed() < r.depth }
func (r *handoffRing) length(k int) int { return int(atomic.LoadUint64(r.u64(offLens + 8*k))) }

// setState records how a side ended, unless the other side did first, and
// wakes every waiter to look.
func (r *handoffRing) setState(s uint32) {
	atomic.CompareAndSwapUint32(r.u32(offState), ringGoing, s)
	for _, off := range []int{offFilled, offFreed, offState} {
		futexWake(r.u32(off))
	}
}

// ringWaitSlice bounds one wait on the other side, so a waiter also looks
// at its own deadlines and the other engine's life.
const ringWaitSlice = 10 * time.Millisecond

// waitFilled waits until the writer published more than seen buffers (or a
// state changed).
func (r *handoffRing) waitFilled(seen int) {
	if r.filled() == seen && r.status() == ringGoing {
		futexWait(r.u32(offFilled), uint32(seen), ringWaitSlice)
	}
}

// waitFreed waits until the reader gave back more than seen buffers (or a
// state changed).
func (r *handoffRing) waitFreed(seen int) {
	if r.freed() == seen && r.status() == ringGoing {
		futexWait(r.u32(offFreed), uint32(seen), ringWaitSlice)
	}
}

// waitState waits for the state to leave ringGoing.
func (r *handoffRing) waitState() {
	futexWait(r.u32(offState), ringGoing, ringWaitSlice)
}

// claim takes the ring for one reader; false when another has.
func (r *handoffRing) claim() bool { return atomic.CompareAndSwapUint32(r.u32(offClaimed), 0, 1) }

// publish hands the reader the next buffer in turn, holding n bytes.
func (r *handoffRing) publish(n int) {
	f := r.filled()
	atomic.StoreUint64(r.u64(offLens+8*(f%r.depth)), uint64(n))
	atomic.StoreUint64(r.u64(offFilled), uint64(f+1))
	futexWake(r.u32(offFilled))
}

// free gives the oldest buffer the reader took back to the writer.
func (r *handoffRing) free() {
	atomic.AddUint64(r.u64(offFreed), 1)
	futexWake(r.u32(offFreed))
}

// close unmaps the ring and closes its file.
func (r *handoffRing) close() {
	_ = syscall.Munmap(r.mem)
	if r.file != nil {
		r.file.Close()
	}
}
