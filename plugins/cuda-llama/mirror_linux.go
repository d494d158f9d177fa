package cudallama

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mirror is a ring buffer whose memory is mapped again right after itself:
// the byte at offset i is also at i+size for i < tail, so every span of up to
// tail bytes starting anywhere in the ring is contiguous. llama.cpp reads
// each K or V block of a restore in one piece; with a mirror the prefetcher
// fills the ring right behind the block being uploaded, and no block ever
// has to be moved to be contiguous.
//
// The memory is size bytes of a memfd, not Go memory: C may keep pointers
// into it. Resident set counters count a page once per mapping, so VmRSS
// shows up to size+tail bytes for the size the mirror really uses; the tail
// is only as long as the largest block, not the whole ring.
type mirror struct {
	mem        []byte // size+tail bytes: the memory, then its first tail bytes again
	size, tail int
	unpin      func() // set when the memory was pinned for DMA
}

// newMirror maps a mirror of size bytes with a tail of tail bytes (both
// multiples of the page size, tail ≤ size).
func newMirror(size, tail int) (*mirror, error) {
	page := unix.Getpagesize()
	if size <= 0 || tail <= 0 || tail > size || size%page != 0 || tail%page != 0 {
		return nil, fmt.Errorf("mirror of %d bytes with a tail of %d: want positive multiples of the page size, tail ≤ size", size, tail)
	}
	fd, err := unix.MemfdCreate("hydra-restore", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	defer unix.Close(fd) // the mappings keep the memory
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("sizing the restore ring: %w", err)
	}
	// Reserve the address space, then map the memfd over it twice.
	base, err := unix.MmapPtr(-1, 0, nil, uintptr(size+tail), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("reserving %d bytes of address space: %w", size+tail, err)
	}
	for _, m := range [][2]int{{0, size}, {size, tail}} {
		if _, err := unix.MmapPtr(fd, 0, unsafe.Add(base, m[0]), uintptr(m[1]), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			_ = unix.MunmapPtr(base, uintptr(size+tail))
			return nil, fmt.Errorf("mapping the restore ring: %w", err)
		}
	}
	return &mirror{mem: unsafe.Slice((*byte)(base), size+tail), size: size, tail: tail}, nil
}

// contig is how many bytes from stream offset off are contiguous in memory.
func (m *mirror) contig(off int64) int { return m.size + m.tail - int(off%int64(m.size)) }

// span returns the n bytes at stream offset off (n ≤ contig(off)).
func (m *mirror) span(off int64, n int) []byte {
	i := int(off % int64(m.size))
	return m.mem[i : i+n : i+n]
}

// close unmaps the memory; nothing may use it afterwards.
func (m *mirror) close() error {
	if m == nil || m.mem == nil {
		return nil
	}
	if m.unpin != nil {
		m.unpin()
		m.unpin = nil
	}
	err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(m.mem)), uintptr(len(m.mem)))
	m.mem = nil
	return err
}
