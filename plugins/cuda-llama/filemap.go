package cudallama

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// A weight in host memory that llama.cpp uses in place from its model file
// (mmap) can be lent to a combined head of this host by naming the file
// and the offset of its bytes: the head maps the same pages. Which file a
// weight's bytes are in is read from the process's own mappings
// (/proc/self/maps), so that only bytes really mapped from a file are
// lent as such; repacked or copied weights are in anonymous memory.

// mapping is one line of /proc/PID/maps: [start, end) mapped from path at
// offset.
type mapping struct {
	start, end uint64
	offset     uint64
	path       string
}

// readMappings parses /proc/PID/maps lines; lines of anonymous memory are
// skipped.
func readMappings(r io.Reader) ([]mapping, error) {
	var out []mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[5], "/") {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			return nil, fmt.Errorf("maps line %q: no range", sc.Text())
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseUint(f[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || end < start {
			return nil, fmt.Errorf("maps line %q: bad numbers", sc.Text())
		}
		// A path with spaces is the rest of the line.
		path := strings.Join(f[5:], " ")
		if strings.HasSuffix(path, " (deleted)") {
			continue // the file is gone: a head could not map it
		}
		out = append(out, mapping{start: start, end: end, offset: off, path: path})
	}
	return out, sc.Err()
}

// fileOf is the file and offset whose mapping holds [addr, addr+size),
// across adjacent mappings of one file at consecutive offsets; ok false
// when the bytes are not all mapped from one file.
func fileOf(maps []mapping, addr uintptr, size int64) (path string, offset int64, ok bool) {
	a, end := uint64(addr), uint64(addr)+uint64(size)
	for i, m := range maps {
		if a < m.start || a >= m.end {
			continue
		}
		reach := m.end
		for j := i + 1; j < len(maps) && reach < end; j++ {
			n := maps[j]
			if n.start != reach || n.path != m.path || n.offset != m.offset+(n.start-m.start) {
				break
			}
			reach = n.end
		}
		if reach < end {
			return "", 0, false
		}
		return m.path, int64(m.offset + (a - m.start)), true
	}
	return "", 0, false
}

// ownMappings is this process's file mappings now.
func ownMappings() ([]mapping, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readMappings(f)
}
