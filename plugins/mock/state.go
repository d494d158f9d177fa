package mock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"slices"

	"github.com/hydra-engine/hydra-engine/iface"
)

// The per-sequence state, loosely modelled on llama.cpp's. All fields are
// little-endian:
//
//	off 0   u32 magic = StateMagic (wire bytes "MOCK")
//	off 4   u32 format version = 1
//	off 8   i32 seq_id: the source slot, informational (a restore uses its target slot)
//	off 12  u32 n_cells: the sequence's length
//	off 16  u32 kv_bytes_per_token
//	off 20  n_cells × { i32 pos (= cell index), i32 token }
//	        n_cells × kv_bytes_per_token bytes of fake KV (see below)
//	        u64 checksum
//
// Cell i's KV is kv_bytes_per_token/8 u64 words w_j = s_j ^ (s_j >> 29) with
// s_j = mix64(h_i ^ kvSalt) + j·golden, h_i being the running hash of tokens
// 0..i: a function of the sequence up to and including the cell, as real KV
// is, yet one add, shift and xor a word to generate.
//
// The checksum folds every field in order, c = rotl(c, 5) ^ v, starting from
// checksumSeed, where v is each header and cell field zero-extended to 64 bits
// and each KV word; the stored value is mix64(c). A rotate-xor chain costs two
// cycles a word, so it does not slow the stream; it is a check against
// truncation and corruption, not an adversary (StatePut also compares every
// byte against the regenerated state).
const (
	StateMagic   = 0x4B434F4D // "MOCK" in wire order
	stateVersion = 1

	stateHeaderSize = 20
	stateCellSize   = 8
	stateSumSize    = 8
	minStateSize    = stateHeaderSize + stateSumSize

	checksumSeed = 0x6D6F636B2D73756D // "mock-sum"

	// putChunk bounds StatePut's buffers: big enough that per-read overhead
	// vanishes, small enough to stay in cache.
	putChunk = 1 << 18
)

// StateSize is the exact size of the state of a sequence of n tokens.
func StateSize(kvBytesPerToken, n int) int64 {
	return minStateSize + int64(n)*(stateCellSize+int64(kvBytesPerToken))
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
	kvWords int

	phase int
	i     int    // cell being produced
	j     int    // next KV word of cell i
	h     uint64 // running hash through cell i
	s     uint64 // Weyl state of KV word j
	c     uint64 // checksum so far

	small [stateHeaderSize]byte // a field split across two Reads
	pend  []byte                // what of small is still to be returned
}

func newStateGen(tokens []int32, seqID int32, kvBytes int) *stateGen {
	return &stateGen{tokens: tokens, seqID: seqID, kvBytes: kvBytes, kvWords: kvBytes / 8, h: hashSeed, c: checksumSeed}
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
				g.phase, g.i, g.j = phKV, -1, g.kvWords
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
			if g.j == g.kvWords {
				g.i++
				if g.i == len(g.tokens) {
					g.phase = phSum
					continue
				}
				g.h = step(g.h, g.tokens[g.i])
				g.s, g.j = mix64(g.h^kvSalt), 0
			}
			m := min(g.kvWords-g.j, (len(p)-n)/8)
			if m == 0 {
				// Less than a word of room: generate it aside.
				g.fillWords(g.small[:8])
				g.pend = g.small[:8]
				continue
			}
			g.fillWords(p[n : n+8*m])
			n += 8 * m
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

// kvWord is the KV word at Weyl state s.
func kvWord(s uint64) uint64 { return s ^ s>>29 }

// fillWords writes the next len(d)/8 KV words of the current cell.
func (g *stateGen) fillWords(d []byte) {
	g.j += len(d) / 8
	g.s, g.c = fillWords(d, g.s, g.c)
}

// fillWords is the hot loop of StateGet: it writes d's words from Weyl state
// s on and folds them into the checksum c. Two words a turn and a frame of its
// own (noinline: inlined into Read it spilled registers) keep it at the
// checksum chain's speed, two cycles a word.
//
//go:noinline
func fillWords(d []byte, s, c uint64) (uint64, uint64) {
	for len(d) >= 16 {
		s1 := s + golden
		w0, w1 := kvWord(s), kvWord(s1)
		binary.LittleEndian.PutUint64(d[0:8], w0)
		binary.LittleEndian.PutUint64(d[8:16], w1)
		c = bits.RotateLeft64(bits.RotateLeft64(c, 5)^w0, 5) ^ w1
		s = s1 + golden
		d = d[16:]
	}
	if len(d) >= 8 {
		w := kvWord(s)
		binary.LittleEndian.PutUint64(d[:8], w)
		c = bits.RotateLeft64(c, 5) ^ w
		s += golden
	}
	return s, c
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
	g := newStateGen(toks, int32(i), e.kvBytes)
	size := g.size()
	if cw, ok := w.(iface.ChunkWriter); ok {
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
func writeChunks(ctx context.Context, g *stateGen, size int64, cw iface.ChunkWriter) (int64, error) {
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
	bufSize := int64(putChunk)
	if size >= 0 && size < bufSize {
		bufSize = (size + 7) &^ 7 // the body is read in whole words
	}
	rbuf := make([]byte, max(bufSize, 8))

	var consumed int64
	stop := false
	if err == nil {
		consumed, stop, err = restore(ctx, e, tokens, r, size, rbuf)
	}
	if stop {
		return 0, err
	}
	trailing, derr := drain(ctx, r, rbuf)
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

// restore parses a state for tokens from r in bounded pieces, checking every
// field and regenerating each KV word to compare it with the one received.
// stop reports that r failed or ctx ended, so r must not be read further.
func restore(ctx context.Context, e *engine, tokens []int32, r io.Reader, size int64, buf []byte) (int64, bool, error) {
	if len(tokens) > e.nCtx {
		return 0, false, badState("%d tokens exceed n_ctx %d", len(tokens), e.nCtx)
	}
	for k, t := range tokens {
		if t < 0 || t > EOS {
			return 0, false, badState("tokens[%d] = %d is outside the vocabulary [0, %d]", k, t, EOS)
		}
	}
	if size < minStateSize {
		return 0, false, badState("size %d is below the smallest state (%d bytes)", size, minStateSize)
	}

	var hdr [stateHeaderSize]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, isStreamErr(err), readErr(err, int64(n))
	}
	c := uint64(checksumSeed)
	var fields [5]uint32
	for k := range fields {
		fields[k] = binary.LittleEndian.Uint32(hdr[4*k:])
		c = bits.RotateLeft64(c, 5) ^ uint64(fields[k])
	}
	magic, version, nCells, kvBytes := fields[0], fields[1], fields[3], fields[4]
	switch {
	case magic != StateMagic:
		return 0, false, badState("header: magic %#08x, want %#08x", magic, StateMagic)
	case version != stateVersion:
		return 0, false, badState("header: format version %d, want %d", version, stateVersion)
	case kvBytes != uint32(e.kvBytes):
		return 0, false, badState("header: kv_bytes_per_token %d, this backend uses %d", kvBytes, e.kvBytes)
	case uint64(nCells) > uint64(e.nCtx):
		return 0, false, badState("header: n_cells %d exceeds n_ctx %d", nCells, e.nCtx)
	case int(nCells) != len(tokens):
		return 0, false, badState("header: n_cells %d, but %d tokens were given", nCells, len(tokens))
	}
	n := int64(len(tokens))
	kvStart := stateHeaderSize + stateCellSize*n
	sumStart := kvStart + n*int64(e.kvBytes)
	want := sumStart + stateSumSize
	if size < want {
		return 0, false, badState("state of %d cells needs %d bytes, size is %d", nCells, want, size)
	}

	// next reads the piece [off, end) capped at len(buf). Pieces start at
	// stateHeaderSize + k·len(buf), len(buf) a multiple of 8, so no cell, KV
	// word or checksum straddles two pieces.
	off := int64(stateHeaderSize)
	next := func(end int64) ([]byte, bool, error) {
		if err := ctx.Err(); err != nil {
			return nil, true, err
		}
		p := buf[:min(int64(len(buf)), end-off)]
		if k, err := io.ReadFull(r, p); err != nil {
			return nil, isStreamErr(err), readErr(err, off+int64(k))
		}
		off += int64(len(p))
		return p, false, nil
	}

	for cell := 0; off < kvStart; {
		p, stop, err := next(kvStart)
		if err != nil {
			return 0, stop, err
		}
		for ; len(p) >= stateCellSize; p, cell = p[stateCellSize:], cell+1 {
			pos, tok := binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:])
			if int32(pos) != int32(cell) {
				return 0, false, badState("cell %d: pos %d, want %d", cell, int32(pos), cell)
			}
			if int32(tok) != tokens[cell] {
				return 0, false, badState("cell %d: token %d, want tokens[%d] = %d", cell, int32(tok), cell, tokens[cell])
			}
			c = bits.RotateLeft64(c, 5) ^ uint64(pos)
			c = bits.RotateLeft64(c, 5) ^ uint64(tok)
		}
	}

	kvWords := e.kvBytes / 8
	h := uint64(hashSeed)
	var s uint64           // Weyl state of KV word j of cell
	cell, j := -1, kvWords // parked on a finished pseudo-cell −1
	for off < sumStart {
		p, stop, err := next(sumStart)
		if err != nil {
			return 0, stop, err
		}
		for len(p) > 0 {
			if j == kvWords {
				cell++
				h = step(h, tokens[cell])
				s, j = mix64(h^kvSalt), 0
			}
			m := min(kvWords-j, len(p)/8)
			var bad int
			bad, s, c = checkWords(p[:8*m], s, c)
			if bad >= 0 {
				got, exp := binary.LittleEndian.Uint64(p[8*bad:]), kvWord(s)
				b := bits.TrailingZeros64(got^exp) / 8
				at := int64(j+bad)*8 + int64(b)
				return 0, false, badState("cell %d: KV byte %d differs (state offset %d): %#02x, want %#02x",
					cell, at, kvStart+int64(cell)*int64(e.kvBytes)+at, byte(got>>(8*b)), byte(exp>>(8*b)))
			}
			j += m
			p = p[8*m:]
		}
	}

	p, stop, err := next(want)
	if err != nil {
		return 0, stop, err
	}
	if got, exp := binary.LittleEndian.Uint64(p), mix64(c); got != exp {
		return 0, false, badState("checksum %#016x, want %#016x", got, exp)
	}
	return want, false, nil
}

// checkWords compares d's words with the KV words from Weyl state s on,
// folding them into the checksum c: the hot loop of StatePut. It returns the
// index of the first word that differs, or -1, with s and c at that word.
//
//go:noinline
func checkWords(d []byte, s, c uint64) (int, uint64, uint64) {
	d = d[:len(d)&^7]
	for i := 0; i < len(d); i += 8 {
		w := binary.LittleEndian.Uint64(d[i : i+8])
		if w != kvWord(s) {
			return i / 8, s, c
		}
		c = bits.RotateLeft64(c, 5) ^ w
		s += golden
	}
	return -1, s, c
}

// drain reads r to its end, returning how many bytes it held.
func drain(ctx context.Context, r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, err := r.Read(buf)
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("mock: draining state: %w", err)
		}
	}
}

func badState(format string, args ...any) error {
	return fmt.Errorf("%w: mock state: %s", iface.ErrBadRequest, fmt.Sprintf(format, args...))
}

// isStreamErr tells a failing reader from a state that merely ends early.
func isStreamErr(err error) bool {
	return !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF)
}

func readErr(err error, off int64) error {
	if isStreamErr(err) {
		return fmt.Errorf("mock: reading state at offset %d: %w", off, err)
	}
	return fmt.Errorf("%w: mock state truncated at offset %d: %w", iface.ErrBadRequest, off, io.ErrUnexpectedEOF)
}
