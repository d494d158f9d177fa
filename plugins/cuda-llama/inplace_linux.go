package cudallama

import (
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// restoreSource lends a restore's bytes to llama.cpp's reader (shim.cpp's
// load_reader, through hydraLoadNext): the prefetcher's restore ring, or the
// data plane's own buffers (inPlace).
type restoreSource interface {
	// Next (llama.StateSource) releases the release bytes the reader is
	// done with and returns the unreleased bytes that follow, at least need
	// of them, contiguous and outside Go memory; valid until the next call.
	Next(release, need int) ([]byte, error)
	// releaseTo marks the first off bytes of the stream consumed.
	releaseTo(off int64) error
	// Read reads on after what was released, releasing what it returns.
	io.Reader
}

var (
	_ restoreSource = (*prefetcher)(nil)
	_ restoreSource = (*inPlace)(nil)
)

// minStage is the staging buffer an inPlace starts with: field reads are a
// few bytes, blocks below the streaming threshold at most 1 MiB.
const minStage = 2 << 20

// inPlace lends llama.cpp a restore's bytes where the data plane put them:
// each buffer of the shared-memory ring in turn (pinned for DMA by the
// caller on a GPU), so a streamed restore uploads every piece straight from
// the buffer the host read the socket into, and the plugin's CPU copies
// nothing, nor reads the buffers the host is about to fill again. Only a
// read that spans two buffers (a small field, a block below the streaming
// threshold) is assembled in a staging buffer of its own.
//
// The prefetcher's restore ring is what a reader that cannot be lent in
// place (a pipe, the gRPC plane) gets instead.
type inPlace struct {
	cr    shm.ChunkReader
	stage []byte // mmap'd, not Go memory: C keeps pointers into it

	lent    []byte // what the reader was last lent
	lentOff int64  // its stream offset
	rest    []byte // in the current buffer, after lent when lent is staged
	left    int64  // bytes cr has still to give

	waitData time.Duration // in cr.Next: the host had not filled a buffer yet
}

// newInPlace serves size bytes: head (already read from cr, in Go memory,
// so it is staged), then the rest of cr.
func newInPlace(cr shm.ChunkReader, head []byte, size int64) (*inPlace, error) {
	if int64(len(head)) > size {
		return nil, fmt.Errorf("restore: a %d-byte head in a %d-byte payload", len(head), size)
	}
	s := &inPlace{cr: cr, left: size - int64(len(head))}
	if err := s.grow(max(len(head), minStage), nil); err != nil {
		return nil, err
	}
	s.lent = s.stage[:copy(s.stage, head)]
	return s, nil
}

// grow replaces the stage with one of at least n bytes that starts with keep.
func (s *inPlace) grow(n int, keep []byte) error {
	page := unix.Getpagesize()
	n = (n + page - 1) / page * page
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("restore staging buffer of %d bytes: %w", n, err)
	}
	copy(m, keep)
	if s.stage != nil {
		_ = unix.Munmap(s.stage)
	}
	s.stage = m
	return nil
}

func (s *inPlace) Next(release, need int) ([]byte, error) {
	if release < 0 || release > len(s.lent) {
		return nil, fmt.Errorf("restore: releasing %d bytes, %d were lent", release, len(s.lent))
	}
	s.lentOff += int64(release)
	u := s.lent[release:]
	if have := int64(len(u)+len(s.rest)) + s.left; int64(need) > have {
		end := s.lentOff + have
		return nil, fmt.Errorf("%w: state truncated at offset %d: llama.cpp needs %d bytes more than the payload holds: %w",
			iface.ErrBadRequest, end, int64(need)-have, io.ErrUnexpectedEOF)
	}
	if len(u) == 0 { // a staged lend leaves the current buffer's rest; in place, nothing
		u, s.rest = s.rest, nil
		if len(u) == 0 && need > 0 {
			p, err := s.piece()
			if err != nil {
				return nil, err
			}
			u = p
		}
	}
	if len(u) >= need {
		s.lent = u
		return u, nil
	}
	// Assemble need bytes in the stage: u, then the buffers after it. u
	// is copied first (it may be the rest of a buffer the next piece frees,
	// or lie in the stage already: copy moves overlapping bytes right).
	if need > len(s.stage) {
		if err := s.grow(need, u); err != nil {
			return nil, err
		}
	} else {
		copy(s.stage, u)
	}
	have := len(u)
	for have < need {
		p := s.rest
		if len(p) == 0 {
			var err error
			if p, err = s.piece(); err != nil {
				return nil, err
			}
		}
		k := copy(s.stage[have:need], p)
		have += k
		s.rest = p[k:]
	}
	s.lent = s.stage[:need]
	return s.lent, nil
}

// piece is the data plane's next buffer; the one before is freed for the
// host to fill again.
func (s *inPlace) piece() ([]byte, error) {
	start := time.Now()
	p, err := s.cr.Next()
	s.waitData += time.Since(start)
	switch {
	case err == io.EOF:
		return nil, fmt.Errorf("restore: the data plane ended %d bytes early: %w", s.left, io.ErrUnexpectedEOF)
	case err != nil:
		return nil, err
	case int64(len(p)) > s.left:
		return nil, fmt.Errorf("restore: the data plane gave %d bytes more than announced", int64(len(p))-s.left)
	}
	s.left -= int64(len(p))
	return p, nil
}

func (s *inPlace) releaseTo(off int64) error {
	if off < s.lentOff || off > s.lentOff+int64(len(s.lent)) {
		return fmt.Errorf("restore: consumed up to %d, lent %d bytes from %d", off, len(s.lent), s.lentOff)
	}
	s.lent = s.lent[off-s.lentOff:]
	s.lentOff = off
	return nil
}

func (s *inPlace) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if len(s.lent) == 0 {
		s.lent, s.rest = s.rest, nil
		if len(s.lent) == 0 {
			if s.left == 0 {
				return 0, io.EOF
			}
			p, err := s.piece()
			if err != nil {
				return 0, err
			}
			s.lent = p
		}
	}
	n := copy(b, s.lent)
	s.lent = s.lent[n:]
	s.lentOff += int64(n)
	return n, nil
}

// close unmaps the stage; nothing lent may be used after it.
func (s *inPlace) close() {
	if s.stage != nil {
		_ = unix.Munmap(s.stage)
		s.stage, s.lent, s.rest = nil, nil, nil
	}
}
