package cudallama

import (
	"io"
	"runtime"
	"sync"

	"github.com/hydra-engine/hydra-engine/iface"
)

// pieceCopier reads a ChunkReader (the shm ring) with copies split across
// goroutines. llama.cpp takes every KV row block as one contiguous read into
// the staging buffer, so a restore is one long memmove out of the ring, and a
// single core's memmove into memory it has not touched (~6 GB/s on the H200
// box) is slower than the socket feeding the ring.
type pieceCopier struct {
	cr   iface.ChunkReader
	rest []byte // the unread part of the last piece
}

// readerFor returns r, or r wrapped in a pieceCopier when it lends its pieces.
func readerFor(r io.Reader) io.Reader {
	if cr, ok := r.(iface.ChunkReader); ok {
		return &pieceCopier{cr: cr}
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
	n := parallelCopy(dst, p.rest)
	p.rest = p.rest[n:]
	return n, nil
}

// parallelMin is the copy size below which one goroutine does it all: below
// it, waking helpers costs about what they save.
const parallelMin = 512 << 10

// parallelCopy is copy(dst, src) by up to four goroutines.
func parallelCopy(dst, src []byte) int {
	n := min(len(dst), len(src))
	workers := min(4, runtime.GOMAXPROCS(0), n/(parallelMin/2))
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
