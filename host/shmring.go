//go:build unix

package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// shmRing is a byte ring in a file of shared memory with one writer and one
// reader, each in its own process (an exporting and an importing engine): a
// header page of counters, then the ring, whose few MiB are written over
// and over, so a transfer of any size touches no more memory than that.
// Header, little-endian:
//
//	[0:8)     magic "HYDRING1"
//	[8:16)    total: the bytes the writer writes in all
//	[16:24)   size: the ring's bytes, after the header page
//	[64:72)   written: bytes written so far (the writer's; atomic)
//	[128:136) read: bytes read so far (the reader's; atomic)
//	[192:196) state: ringGoing, ringWriterFailed or ringReaderGone (atomic)
//	[256:260) claimed: 1 once a reader took the ring (atomic)
type shmRing struct {
	mem         []byte
	total, size int64
}

const (
	ringHeader = 4096
	ringMagic  = "HYDRING1"
	// ringMax is the largest ring an export makes: big enough that neither
	// side waits on the other for long, small enough that what the writer
	// puts in is still in the CPU's cache when the reader takes it out (a
	// ring of several times the last-level cache loses to one that fits:
	// docs/design/data-plane.md).
	ringMax = 16 << 20
	// ringLimit is the largest ring an import maps: an engine of another
	// version may make bigger ones.
	ringLimit = 64 << 20

	ringGoing        = 0
	ringWriterFailed = 1
	ringReaderGone   = 2

	offWritten, offRead, offState, offClaimed = 64, 128, 192, 256
)

// createRing makes f the ring of a transfer of total bytes. Both sides map
// it with its pages populated: a fresh file's pages would otherwise fault
// one at a time under the first copies.
func createRing(f *os.File, total int64) (*shmRing, error) {
	size := min((max(total, 1)+ringHeader-1)/ringHeader*ringHeader, ringMax)
	if err := reserve(f, ringHeader+size); err != nil {
		return nil, err
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(ringHeader+size), syscall.PROT_READ|syscall.PROT_WRITE, populated)
	if err != nil {
		return nil, fmt.Errorf("mapping the export: %w", err)
	}
	copy(mem, ringMagic)
	binary.LittleEndian.PutUint64(mem[8:], uint64(total))
	binary.LittleEndian.PutUint64(mem[16:], uint64(size))
	return &shmRing{mem: mem, total: total, size: size}, nil
}

// openRing maps a ring another process made in f, of fileSize bytes.
func openRing(f *os.File, fileSize int64) (*shmRing, error) {
	if fileSize <= ringHeader || fileSize > ringHeader+ringLimit {
		return nil, fmt.Errorf("%d bytes: not an export's ring", fileSize)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(fileSize), syscall.PROT_READ|syscall.PROT_WRITE, populated)
	if err != nil {
		return nil, fmt.Errorf("mapping the export: %w", err)
	}
	r := &shmRing{mem: mem, total: int64(binary.LittleEndian.Uint64(mem[8:])), size: int64(binary.LittleEndian.Uint64(mem[16:]))}
	if string(mem[:8]) != ringMagic || r.size != fileSize-ringHeader || r.total < 0 {
		r.close()
		return nil, errors.New("not an export's ring (its header says otherwise)")
	}
	return r, nil
}

func (r *shmRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *shmRing) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

func (r *shmRing) written() int64 { return int64(atomic.LoadUint64(r.u64(offWritten))) }
func (r *shmRing) read() int64    { return int64(atomic.LoadUint64(r.u64(offRead))) }
func (r *shmRing) state() uint32  { return atomic.LoadUint32(r.u32(offState)) }
func (r *shmRing) claimed() bool  { return atomic.LoadUint32(r.u32(offClaimed)) == 1 }

// setState records how a side ended, unless the other side did first.
func (r *shmRing) setState(s uint32) { atomic.CompareAndSwapUint32(r.u32(offState), ringGoing, s) }

// claim takes the ring for one reader; false when another has.
func (r *shmRing) claim() bool { return atomic.CompareAndSwapUint32(r.u32(offClaimed), 0, 1) }

// put copies as much of p as the ring has room for and returns how much;
// 0 when the reader has not made room yet.
func (r *shmRing) put(p []byte) int {
	w := r.written()
	k := int(min(r.size-(w-r.read()), int64(len(p)), r.total-w))
	if k <= 0 {
		return 0
	}
	at := ringHeader + w%r.size
	c := copy(r.mem[at:ringHeader+r.size], p[:k])
	copy(r.mem[ringHeader:], p[c:k])
	atomic.StoreUint64(r.u64(offWritten), uint64(w+int64(k)))
	return k
}

// take copies as much of what was written and not read yet as p holds and
// returns how much; 0 when the writer has not written more yet.
func (r *shmRing) take(p []byte) int {
	rd := r.read()
	k := int(min(r.written()-rd, int64(len(p))))
	if k <= 0 {
		return 0
	}
	at := ringHeader + rd%r.size
	c := copy(p[:k], r.mem[at:ringHeader+r.size])
	copy(p[c:k], r.mem[ringHeader:])
	atomic.StoreUint64(r.u64(offRead), uint64(rd+int64(k)))
	return k
}

func (r *shmRing) close() { _ = syscall.Munmap(r.mem) }
