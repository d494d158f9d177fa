//go:build unix

package promptcache

import (
	"os"

	"golang.org/x/sys/unix"
)

// Mapped allocates anonymous private mappings: memory outside the Go heap,
// whole pages, given back to the kernel when freed, which C code may keep
// pointers into and a GPU backend may pin for DMA. Pin, when set, is
// called on each mapping and the function it returns (nil: not pinned)
// when it is freed.
type Mapped struct {
	Pin func([]byte) (unpin func())
}

// Size is n rounded up to whole pages.
func (Mapped) Size(n int64) int64 {
	page := int64(os.Getpagesize())
	return max((n+page-1)/page*page, page)
}

// Alloc maps Size(n) bytes.
func (m Mapped) Alloc(n int64) (Memory, error) {
	b, err := unix.Mmap(-1, 0, int(m.Size(n)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	mm := &mapping{b: b}
	if m.Pin != nil {
		mm.unpin = m.Pin(b)
	}
	return mm, nil
}

type mapping struct {
	b     []byte
	unpin func()
}

func (m *mapping) Bytes() []byte { return m.b }

// Pinned reports whether the mapping is pinned for DMA.
func (m *mapping) Pinned() bool { return m.unpin != nil }

func (m *mapping) Free() {
	if m.b == nil {
		return
	}
	if m.unpin != nil {
		m.unpin()
	}
	_ = unix.Munmap(m.b)
	m.b = nil
}
