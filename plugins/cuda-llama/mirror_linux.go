package cudallama

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mirror is a ring buffer whose memory is mapped twice, back to back: the
// byte at offset i of the first mapping is also at i+size, so every span of
// up to size bytes starting in the first mapping is contiguous. llama.cpp
// reads each K or V block of a restore in one piece; with a mirror the
// prefetcher fills the ring right behind the block being uploaded, and no
// block ever has to be moved to be contiguous.
//
// The memory is size bytes of a memfd, not Go memory: C may keep pointers
// into it. Resident set counters count each page once per mapping, so VmRSS
// shows twice the memory the mirror really uses.
type mirror struct {
	mem   []byte // 2×size bytes: the memory, twice
	size  int
	unpin func() // set when the memory was pinned for DMA
}

// newMirror maps a mirror of size bytes (a multiple of the page size).
func newMirror(size int) (*mirror, error) {
	if size <= 0 || size%unix.Getpagesize() != 0 {
		return nil, fmt.Errorf("mirror size %d is not a positive multiple of the page size", size)
	}
	fd, err := unix.MemfdCreate("hydra-restore", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	defer unix.Close(fd) // the mappings keep the memory
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, fmt.Errorf("sizing the restore ring: %w", err)
	}
	// Reserve 2×size of address space, then map the memfd over both halves.
	base, err := unix.MmapPtr(-1, 0, nil, uintptr(2*size), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("reserving %d bytes of address space: %w", 2*size, err)
	}
	for half := range 2 {
		at := unsafe.Add(base, half*size)
		if _, err := unix.MmapPtr(fd, 0, at, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			_ = unix.MunmapPtr(base, uintptr(2*size))
			return nil, fmt.Errorf("mapping the restore ring: %w", err)
		}
	}
	return &mirror{mem: unsafe.Slice((*byte)(base), 2*size), size: size}, nil
}

// span returns the n bytes at ring offset off (any non-negative position;
// n ≤ size).
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
