//go:build !unix

package promptcache

// Mapped allocates from the Go heap where there are no anonymous mappings;
// Pin is not called.
type Mapped struct {
	Pin func([]byte) (unpin func())
}

// Size is n: what a slice of n bytes holds, less the allocator's rounding.
func (Mapped) Size(n int64) int64 { return max(n, 1) }

// Alloc makes a slice of Size(n) bytes.
func (m Mapped) Alloc(n int64) (Memory, error) { return &heapMem{b: make([]byte, m.Size(n))}, nil }

type heapMem struct{ b []byte }

func (m *heapMem) Bytes() []byte { return m.b }
func (m *heapMem) Free()         { m.b = nil }
