package cudallama

import (
	"io"
	"runtime"
	"sync"

	"github.com/hydra-engine/hydra-engine/iface"
)

// pieceCopier reads a ChunkReader (the shm ring) with copies split across
// goroutines (option copy_threads). llama.cpp takes every KV row block as one
// contiguous read into the staging buffer, so a restore is one long memmove
// out of the ring, and a single core's memmove into memory it has not
// touched (~6.5 GB/s on the H200 box) can be slower than the socket feeding
// the ring. Where the host's socket read is the slower stage, as on the H200
// box, the extra goroutines only cost CPU: the default is one.
type pieceCopier struct {
	cr      iface.ChunkReader
	threads int
	rest    []byte // the unread part of the last piece
}

// readerFor returns r, or r wrapped in a pieceCopier copying with up to
// threads goroutines when it lends its pieces.
func readerFor(r io.Reader, threads int) io.Reader {
	if cr, ok := r.(iface.ChunkReader); ok && threads > 1 {
		return &pieceCopier{cr: cr, threads: threads}
	}
	return r
}

func (p *pieceCopier) Read(dst []byte) (int, error) {
	if len(dst) == 0 {
		return 0, nil
	}
	if len(p.rest) == 0 {
		b, err := p.cr.Next()
		if err != nil {
			return 0, err
		}
		p.rest = b
	}
	n := parallelCopy(dst, p.rest, p.threads)
	p.rest = p.rest[n:]
	return n, nil
}

// parallelMin is the copy size below which one goroutine does it all: below
// it, waking helpers costs about what they save.
const parallelMin = 512 << 10

// parallelCopy is copy(dst, src) by up to threads goroutines.
func parallelCopy(dst, src []byte, threads int) int {
	n := min(len(dst), len(src))
	workers := min(threads, runtime.GOMAXPROCS(0), n/(parallelMin/2))
	if n < parallelMin || workers < 2 {
		return copy(dst, src[:n])
	}
	part := (n/workers + 63) &^ 63 // cache-line aligned cuts
	var wg sync.WaitGroup
	for off := part; off < n; off += part {
		end := min(off+part, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(dst[off:end], src[off:end])
		}()
	}
	copy(dst[:part], src[:part])
	wg.Wait()
	return n
}
