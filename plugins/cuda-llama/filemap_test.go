package cudallama

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// TestFileOf: bytes inside one file mapping, or across adjacent mappings of
// one file at consecutive offsets, name the file and offset; anonymous
// memory, a gap, another file or a deleted one do not.
func TestFileOf(t *testing.T) {
	maps, err := readMappings(strings.NewReader(`
7f0000000000-7f0000001000 r--p 00000000 08:01 11 /models/a b.gguf
7f0000001000-7f0000003000 r--p 00001000 08:01 11 /models/a b.gguf
7f0000003000-7f0000004000 rw-p 00000000 00:00 0
7f0000004000-7f0000005000 r--p 00009000 08:01 12 /models/c.gguf
7f0000005000-7f0000006000 r--p 0000a000 08:01 13 /models/d.gguf
7f0000006000-7f0000007000 r--p 00000000 08:01 14 /models/e.gguf (deleted)
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr uintptr
		size int64
		path string
		off  int64
	}{
		{0x7f0000000010, 16, "/models/a b.gguf", 0x10},
		{0x7f0000000ff0, 0x20, "/models/a b.gguf", 0xff0}, // across the two mappings of one file
		{0x7f0000002ff0, 0x20, "", 0},                     // into anonymous memory
		{0x7f0000003010, 4, "", 0},                        // anonymous
		{0x7f0000004ff0, 0x20, "", 0},                     // across two files
		{0x7f0000004010, 4, "/models/c.gguf", 0x9010},
		{0x7f0000006010, 4, "", 0}, // deleted
		{0x7ffd00000010, 4, "", 0},
		{0x10, 4, "", 0},
	} {
		path, off, ok := fileOf(maps, tc.addr, tc.size)
		if ok != (tc.path != "") || path != tc.path || off != tc.off {
			t.Errorf("%#x+%d: %q %#x %v, want %q %#x", tc.addr, tc.size, path, off, ok, tc.path, tc.off)
		}
	}
}

// TestOwnMappings: a file this process maps is found where it is.
func TestOwnMappings(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "map")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(3 << 12); err != nil {
		t.Fatal(err)
	}
	b, err := syscall.Mmap(int(f.Fd()), 4096, 2<<12, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	maps, err := ownMappings()
	if err != nil {
		t.Fatal(err)
	}
	addr := uintptr(sliceAddr(b)) + 100
	path, off, ok := fileOf(maps, addr, 4096)
	if !ok || path != f.Name() || off != 4096+100 {
		t.Fatalf("%q %d %v, want %q %d", path, off, ok, f.Name(), 4096+100)
	}
}

// sliceAddr is the address of b's first byte.
func sliceAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
