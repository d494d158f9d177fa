package mock

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"slices"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// The per-sequence state, loosely modelled on llama.cpp's. All fields are
// little-endian:
//
//	off 0   u32 magic = StateMagic (wire bytes "MOCK")
//	off 4   u32 format version = 2
//	off 8   i32 seq_id: the source slot, informational (a restore uses its target slot)
//	off 12  u32 n_cells: the sequence's length
//	off 16  u32 kv_bytes_per_token
//	off 20  n_cells × { i32 pos (= cell index), i32 token }
//	        n_cells × kv_bytes_per_token bytes of fake KV (see below)
//	        u64 checksum
//
// Cell i's KV is its key k_i = mix64(h_i ^ kvSalt) as a u64, h_i being the
// running hash of tokens 0..i, followed by kv_bytes_per_token−8 bytes of the
// backend's pattern (see newPattern) from byte offset 8·(k_i >> 51) on. So the
// KV is a function of the sequence up to and including the cell, as real KV
// is, yet producing it is a memmove from a table that stays in cache and
// checking it a memcmp: the mock moves bytes at memory speed, and a benchmark
// of it measures the data plane, not the mock.
//
// The checksum folds every header and cell field and every cell's key in
// order, c = rotl(c, 5) ^ v, starting from checksumSeed, v zero-extended to 64
// bits; the stored value is mix64(c). It catches a truncated or misordered
// state; StatePut compares every KV byte with the regenerated one besides.
const (
	StateMagic   = 0x4B434F4D // "MOCK" in wire order
	stateVersion = 2

	stateHeaderSize = 20
	stateCellSize   = 8
	stateSumSize    = 8
	minStateSize    = stateHeaderSize + stateSumSize

	checksumSeed = 0x6D6F636B2D73756D // "mock-sum"
	patternSeed  = 0x6D6F636B2D706174 // "mock-pat"

	// patternSpan is how far the cells' windows into the pattern may start
	// from one another: 8192 offsets, the key's top 13 bits.
	patternSpan  = 64 << 10
	patternShift = 64 - 13

	// putChunk bounds StatePut's buffers: big enough that per-read overhead
	// vanishes, small enough to stay in cache.
	putChunk = 1 << 18
)

// StateSize is the exact size of the state of a sequence of n tokens.
func StateSize(kvBytes, n int) int64 {
	return minStateSize + int64(n)*(stateCellSize+int64(kvBytes))
}

// newPattern is the table cells' KV is cut from: kvBytes−8+patternSpan bytes,
// word k being w = s ^ s>>29 with s = mix64(patternSeed) + k·golden.
func newPattern(kvBytes int) []byte {
	p := make([]byte, kvBytes-8+patternSpan)
	s := mix64(patternSeed)
	for k := 0; k+8 <= len(p); k += 8 {
		binary.LittleEndian.PutUint64(p[k:], s^s>>29)
		s += golden
	}
	return p
}

// cellKey is the key of the cell whose running hash is h, and where its
// window into the pattern starts.
func cellKey(h uint64) (key uint64, off int) {
	key = mix64(h ^ kvSalt)
	return key, int(key>>patternShift) * 8
}

// Phases of stateGen.
const (
	phHeader = iota
	phCells
	phKV
	phSum
	phDone
)

// stateGen produces a state as an io.Reader, generating the KV as it goes so
// that memory stays O(1) whatever the state's size. Read fills p completely
// until the state ends.
type stateGen struct {
	tokens  []int32
	seqID   int32
	kvBytes int
	pat     []byte

	phase int
	i     int    // cell being produced
	j     int    // next KV byte of cell i
	h     uint64 // running hash through cell i
	win   []byte // cell i's window into pat: its KV from byte 8 on
	c     uint64 // checksum so far

	small [stateHeaderSize]byte // a field split across two Reads
	pend  []byte                // what of small is still to be returned
}

func newStateGen(tokens []int32, seqID int32, kvBytes int, pat []byte) *stateGen {
	return &stateGen{tokens: tokens, seqID: seqID, kvBytes: kvBytes, pat: pat, h: hashSeed, c: checksumSeed}
}

func (g *stateGen) size() int64 { return StateSize(g.kvBytes, len(g.tokens)) }

func (g *stateGen) fold(v uint64) { g.c = bits.RotateLeft64(g.c, 5) ^ v }

func (g *stateGen) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(g.pend) > 0 {
			k := copy(p[n:], g.pend)
			g.pend = g.pend[k:]
			n += k
			continue
		}
		switch g.phase {
		case phHeader:
			hdr := [5]uint32{StateMagic, stateVersion, uint32(g.seqID), uint32(len(g.tokens)), uint32(g.kvBytes)}
			for k, v := range hdr {
				binary.LittleEndian.PutUint32(g.small[4*k:], v)
				g.fold(uint64(v))
			}
			g.pend = g.small[:stateHeaderSize]
			g.phase = phCells
		case phCells:
			if g.i == len(g.tokens) {
				// Park on a finished pseudo-cell −1 so phKV starts cell 0.
				g.phase, g.i, g.j = phKV, -1, g.kvBytes
				continue
			}
			d := p[n:]
			if len(d) < stateCellSize {
				g.putCell(g.small[:stateCellSize])
				g.pend = g.small[:stateCellSize]
				continue
			}
			for len(d) >= stateCellSize && g.i < len(g.tokens) {
				g.putCell(d[:stateCellSize])
				d = d[stateCellSize:]
				n += stateCellSize
			}
		case phKV:
			if g.j == g.kvBytes {
				g.i++
				if g.i == len(g.tokens) {
					g.phase = phSum
					continue
				}
				g.h = step(g.h, g.tokens[g.i])
				key, off := cellKey(g.h)
				g.fold(key)
				g.win = g.pat[off : off+g.kvBytes-8]
				binary.LittleEndian.PutUint64(g.small[:8], key)
				g.pend, g.j = g.small[:8], 8
				continue
			}
			k := copy(p[n:], g.win[g.j-8:])
			g.j += k
			n += k
		case phSum:
			binary.LittleEndian.PutUint64(g.small[:8], mix64(g.c))
			g.pend = g.small[:8]
			g.phase = phDone
		case phDone:
			if n == 0 {
				return 0, io.EOF
			}
			return n, nil
		}
	}
	return n, nil
}

func (g *stateGen) putCell(d []byte) {
	pos, tok := uint32(g.i), uint32(g.tokens[g.i])
	binary.LittleEndian.PutUint32(d[0:4], pos)
	binary.LittleEndian.PutUint32(d[4:8], tok)
	g.fold(uint64(pos))
	g.fold(uint64(tok))
	g.i++
}

// StateGet writes the slot's state to w in pieces of exactly chunkSize bytes
// but the last, from one reused buffer, never holding the state in memory.
func (b *Backend) StateGet(ctx context.Context, i int, chunkSize int, w io.Writer) (int64, error) {
	e, s, err := b.slot(i)
	if err != nil {
		return 0, err
	}
	if chunkSize <= 0 {
		return 0, fmt.Errorf("%w: chunk size %d is not positive", iface.ErrBadRequest, chunkSize)
	}
	if err := s.acquire(i); err != nil {
		return 0, err
	}
	defer s.release()
	toks, _ := s.snapshot()
	g := newStateGen(toks, int32(i), e.kvBytes, e.pat)
	size := g.size()
	if cw, ok := w.(shm.ChunkWriter); ok {
		return writeChunks(ctx, g, size, cw)
	}
	buf := make([]byte, min(int64(chunkSize), size))
	var done int64
	for done < size {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		n, _ := g.Read(buf) // cannot fail; fills buf but for the last piece
		wn, err := w.Write(buf[:n])
		done += int64(wn)
		if err != nil {
			return done, err
		}
		if wn != n {
			return done, io.ErrShortWrite
		}
	}
	return done, nil
}

// writeChunks generates the state straight into the data plane's buffers,
// saving the copy a Write would make.
func writeChunks(ctx context.Context, g *stateGen, size int64, cw shm.ChunkWriter) (int64, error) {
	var done int64
	for done < size {
		if err := ctx.Err(); err != nil {
			return done, err
		}
		b, err := cw.Buffer()
		if err != nil {
			return done, err
		}
		n, _ := g.Read(b[:min(int64(len(b)), size-done)]) // cannot fail
		if err := cw.Commit(n); err != nil {
			return done, err
		}
		done += int64(n)
	}
	return done, nil
}

// StatePut restores slot i from r, which must hold a state of tokens made by
// a backend with the same kv_bytes_per_token (any slot, any instance). The
// slot is emptied first and filled only once the whole state has been checked
// and r drained, so a failure at any point leaves it empty. r is drained even
// after a bad state (the host's framing depends on it), but not after r itself
// fails or ctx ends: then the stream is lost anyway.
func (b *Backend) StatePut(ctx context.Context, i int, tokens []int32, r io.Reader, size int64) (int64, error) {
	e, s, err := b.slot(i)
	if err == nil {
		if err = s.acquire(i); err == nil {
			defer s.release()
			s.clear()
		}
	}
	src := newStateSource(ctx, r, size)
	var consumed int64
	stop := false
	if err == nil && len(tokens) <= e.nCtx { // more is checkRestoreRequest's error
		if err = e.claimCells(i, len(tokens)); err == nil {
			defer e.unclaim(i)
		}
	}
	if err == nil {
		consumed, stop, err = restore(e, tokens, src, size)
	}
	if stop {
		return 0, err
	}
	trailing, derr := src.drain()
	if err != nil {
		return 0, err
	}
	if derr != nil {
		return 0, derr
	}

	switch {
	case consumed+trailing != size:
		b.log.Warn("state_put: reader length differs from the announced size",
			"slot", i, "size", size, "state", consumed, "trailing", trailing)
	case trailing == NVocab*4:
		b.log.Trace("state_put: ignoring trailing logits: the next token follows from the sequence", "slot", i)
	case trailing > 0:
		b.log.Debug("state_put: ignoring trailing bytes", "slot", i, "trailing", trailing)
	}
	toks := slices.Clone(tokens)
	s.set(toks, seqHash(toks))
	return consumed, nil
}

// restore parses a state for tokens from src, checking every field and
// comparing each KV byte with the regenerated one. stop reports that the
// reader failed or ctx ended, so it must not be read further.
func restore(e *engine, tokens []int32, src *stateSource, size int64) (int64, bool, error) {
	if err := checkRestoreRequest(e, tokens, size); err != nil {
		return 0, false, err
	}
	r := &restorer{e: e, tokens: tokens, src: src, c: checksumSeed}
	want, err := r.header()
	if err == nil {
		err = r.cells()
	}
	if err == nil {
		err = r.kv()
	}
	if err == nil {
		err = r.checksum()
	}
	if err != nil {
		return 0, r.stop, err
	}
	return want, false, nil
}

// checkRestoreRequest checks what StatePut was given before reading a byte:
// the tokens against n_ctx and the vocabulary, the size against the state
// those tokens make.
func checkRestoreRequest(e *engine, tokens []int32, size int64) error {
	if len(tokens) > e.nCtx {
		return badState("%d tokens exceed n_ctx %d", len(tokens), e.nCtx)
	}
	for k, t := range tokens {
		if t < 0 || t > EOS {
			return badState("tokens[%d] = %d is outside the vocabulary [0, %d]", k, t, EOS)
		}
	}
	if size < minStateSize {
		return badState("size %d is below the smallest state (%d bytes)", size, minStateSize)
	}
	if want := StateSize(e.kvBytes, len(tokens)); size < want {
		return badState("state of %d cells needs %d bytes, size is %d", len(tokens), want, size)
	}
	return nil
}

// restorer reads a state in order, header, cells, KV and checksum, folding
// every field into the checksum as it goes.
type restorer struct {
	e      *engine
	tokens []int32
	src    *stateSource
	c      uint64 // the checksum so far
	stop   bool   // the reader failed or ctx ended: read no further
}

func (r *restorer) fold(v uint64) { r.c = bits.RotateLeft64(r.c, 5) ^ v }

// fill reads len(p) bytes, noting whether a failure was the reader's.
func (r *restorer) fill(p []byte) error {
	if err := r.src.fill(p); err != nil {
		r.stop = isStreamErr(err)
		return r.src.readErr(err)
	}
	return nil
}

// header checks the header against the backend and the request, and
// returns the state's size without trailing bytes.
func (r *restorer) header() (int64, error) {
	var hdr [stateHeaderSize]byte
	if err := r.fill(hdr[:]); err != nil {
		return 0, err
	}
	var fields [5]uint32
	for k := range fields {
		fields[k] = binary.LittleEndian.Uint32(hdr[4*k:])
		r.fold(uint64(fields[k]))
	}
	magic, version, nCells, kvBytes := fields[0], fields[1], fields[3], fields[4]
	switch {
	case magic != StateMagic:
		return 0, badState("header: magic %#08x, want %#08x", magic, StateMagic)
	case version != stateVersion:
		return 0, badState("header: format version %d, want %d", version, stateVersion)
	case kvBytes != uint32(r.e.kvBytes):
		return 0, badState("header: kv_bytes_per_token %d, this backend uses %d", kvBytes, r.e.kvBytes)
	case uint64(nCells) > uint64(r.e.nCtx):
		return 0, badState("header: n_cells %d exceeds n_ctx %d", nCells, r.e.nCtx)
	case int(nCells) != len(r.tokens):
		return 0, badState("header: n_cells %d, but %d tokens were given", nCells, len(r.tokens))
	}
	// checkRestoreRequest made sure size holds this much.
	return StateSize(r.e.kvBytes, len(r.tokens)), nil
}

// cells checks that cell i holds position i and tokens[i].
func (r *restorer) cells() error {
	var w [stateCellSize]byte
	for cell, want := range r.tokens {
		if err := r.fill(w[:]); err != nil {
			return err
		}
		pos, tok := binary.LittleEndian.Uint32(w[:]), binary.LittleEndian.Uint32(w[4:])
		if int32(pos) != int32(cell) {
			return badState("cell %d: pos %d, want %d", cell, int32(pos), cell)
		}
		if int32(tok) != want {
			return badState("cell %d: token %d, want tokens[%d] = %d", cell, int32(tok), cell, want)
		}
		r.fold(uint64(pos))
		r.fold(uint64(tok))
	}
	return nil
}

// kv compares every cell's KV, its key and then its window into the
// pattern, with the one the tokens up to it give.
func (r *restorer) kv() error {
	h := uint64(hashSeed)
	var w [8]byte
	for cell, tok := range r.tokens {
		at := r.src.off
		h = step(h, tok)
		key, o := cellKey(h)
		r.fold(key)
		if err := r.fill(w[:]); err != nil {
			return err
		}
		if binary.LittleEndian.Uint64(w[:]) != key {
			return kvMismatch(cell, 0, at, w[:], binary.LittleEndian.AppendUint64(nil, key))
		}
		if err := r.window(cell, r.e.pat[o:o+r.e.kvBytes-8]); err != nil {
			return err
		}
	}
	return nil
}

// window compares the rest of a cell's KV with win where it lies: in the
// shm ring when the data plane offers it, so no byte is copied.
func (r *restorer) window(cell int, win []byte) error {
	for len(win) > 0 {
		at := r.src.off
		p, err := r.src.piece(len(win))
		if err != nil {
			r.stop = isStreamErr(err)
			return r.src.readErr(err)
		}
		if !bytes.Equal(p, win[:len(p)]) {
			return kvMismatch(cell, r.e.kvBytes-len(win), at, p, win)
		}
		win = win[len(p):]
	}
	return nil
}

// checksum compares the stored checksum with the one folded so far.
func (r *restorer) checksum() error {
	var w [stateSumSize]byte
	if err := r.fill(w[:]); err != nil {
		return err
	}
	if got, exp := binary.LittleEndian.Uint64(w[:]), mix64(r.c); got != exp {
		return badState("checksum %#016x, want %#016x", got, exp)
	}
	return nil
}

// kvMismatch reports the first byte where got, cell's KV from byte j on
// (state offset at), differs from exp.
func kvMismatch(cell, j int, at int64, got, exp []byte) error {
	b := 0
	for b < len(got) && got[b] == exp[b] {
		b++
	}
	return badState("cell %d: KV byte %d differs (state offset %d): %#02x, want %#02x",
		cell, j+b, at+int64(b), got[b], exp[b])
}

func badState(format string, args ...any) error {
	return fmt.Errorf("%w: mock state: %s", iface.ErrBadRequest, fmt.Sprintf(format, args...))
}

// isStreamErr tells a failing reader from a state that merely ends early.
func isStreamErr(err error) bool {
	return !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF)
}

// stateSource is StatePut's view of its reader: pieces in place when the
// reader is an shm.ChunkReader (the shm ring), else read into one reused
// buffer of putChunk bytes. It counts what it hands out, for error offsets.
type stateSource struct {
	ctx  context.Context
	r    io.Reader
	cr   shm.ChunkReader // nil: r is read into buf
	buf  []byte
	cur  []byte // what of the last piece is not handed out yet
	rerr error  // an error r returned along with data, due after it
	off  int64  // bytes handed out
}

func newStateSource(ctx context.Context, r io.Reader, size int64) *stateSource {
	s := &stateSource{ctx: ctx, r: r}
	if cr, ok := r.(shm.ChunkReader); ok {
		s.cr = cr
	} else {
		s.buf = make([]byte, max(min(int64(putChunk), size), 8))
	}
	return s
}

// piece returns the next 1 to max bytes of the stream, valid until the next
// call; io.EOF at its end.
func (s *stateSource) piece(max int) ([]byte, error) {
	for len(s.cur) == 0 {
		if s.rerr != nil {
			return nil, s.rerr
		}
		if err := s.ctx.Err(); err != nil {
			return nil, err
		}
		if s.cr != nil {
			s.cur, s.rerr = s.cr.Next()
		} else {
			var n int
			n, s.rerr = s.r.Read(s.buf)
			s.cur = s.buf[:n]
		}
	}
	p := s.cur[:min(max, len(s.cur))]
	s.cur = s.cur[len(p):]
	s.off += int64(len(p))
	return p, nil
}

// fill reads exactly len(p) bytes into p, across pieces.
func (s *stateSource) fill(p []byte) error {
	for len(p) > 0 {
		q, err := s.piece(len(p))
		if err != nil {
			return err
		}
		p = p[copy(p, q):]
	}
	return nil
}

// drain reads to the end of the stream, returning how many bytes were left.
func (s *stateSource) drain() (int64, error) {
	start := s.off
	for {
		p, err := s.piece(1 << 30)
		if err == io.EOF {
			return s.off - start, nil
		}
		if err != nil {
			return s.off - start + int64(len(p)), fmt.Errorf("mock: draining state: %w", err)
		}
	}
}

// readErr describes err from the reader at the current offset: a stream
// failure, or a state that ends early.
func (s *stateSource) readErr(err error) error {
	if isStreamErr(err) {
		return fmt.Errorf("mock: reading state at offset %d: %w", s.off, err)
	}
	return fmt.Errorf("%w: mock state truncated at offset %d: %w", iface.ErrBadRequest, s.off, io.ErrUnexpectedEOF)
}
