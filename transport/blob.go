package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// The KV blob wraps a backend's per-sequence state (protocol §6):
//
//	v2: u8 0x02, u32 n_past, u32 n_tok, i32 tokens[n_tok], u8 flags,
//	    [flags bit0: i32 pos_min, i32 pos_max, i64 n_tokens, u64 tgt_sz, tgt, u64 dft_sz, dft]
//	    [flags bit1: u32 layout_len, layout_len bytes of JSON: the state's layout and source]
//	v1: u32 n_past, u32 n_tok, i32 tokens[n_tok]   (legacy, STATE_PUT only)
//
// followed by the state and, in PREFILL replies, the logits; with flags bit2
// a 16-byte integrity trailer ends the payload: "HYCK", the CRC-32C of every
// payload byte before it, and their count (u64). Bits 1 and 2 are this
// engine's (docs/protocol.md); the reference engine reads neither.
const blobVersion2 = 0x02

// The v2 flags.
const (
	blobFlagCheckpoint = 0x01 // a context checkpoint follows the flags byte
	blobFlagLayout     = 0x02 // the state's layout follows (and the checkpoint, if any)
	blobFlagTrailer    = 0x04 // an integrity trailer ends the payload
)

// MaxBlobLayout bounds a wrapper's layout before it is read.
const MaxBlobLayout = 64 << 10

// TrailerSize is the integrity trailer's size.
const TrailerSize = 16

// trailerMagic opens the trailer.
var trailerMagic = [4]byte{'H', 'Y', 'C', 'K'}

// Castagnoli is the CRC-32C table of the trailer's checksum (the SSE 4.2 and
// ARMv8 instruction's polynomial: tens of GB/s on one core).
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendTrailer appends the trailer of a payload of n bytes with checksum crc.
func AppendTrailer(b []byte, crc uint32, n uint64) []byte {
	b = append(b, trailerMagic[:]...)
	b = binary.LittleEndian.AppendUint32(b, crc)
	return binary.LittleEndian.AppendUint64(b, n)
}

// ErrIntegrity: a payload's bytes are not those its trailer sums.
var ErrIntegrity = errors.New("KV blob integrity check failed")

// CheckTrailer checks that t is a trailer of n bytes summing to crc.
func CheckTrailer(t []byte, crc uint32, n uint64) error {
	switch {
	case len(t) != TrailerSize || !bytes.Equal(t[:4], trailerMagic[:]):
		return fmt.Errorf("%w: the payload does not end in the integrity trailer its flags announce", ErrIntegrity)
	case binary.LittleEndian.Uint64(t[8:]) != n:
		return fmt.Errorf("%w: the trailer sums %d bytes, the payload has %d before it", ErrIntegrity, binary.LittleEndian.Uint64(t[8:]), n)
	case binary.LittleEndian.Uint32(t[4:]) != crc:
		return fmt.Errorf("%w: CRC-32C %08x, the trailer says %08x: bytes changed on the way", ErrIntegrity, crc, binary.LittleEndian.Uint32(t[4:]))
	}
	return nil
}

// maxBlobTokens bounds n_tok before anything is allocated for it, whatever
// the caller allows.
const maxBlobTokens = 1 << 24

// MaxBlobCheckpoint bounds a wrapper's checkpoint (target and draft bytes
// together) before it is read into memory: a hybrid's recurrent state is
// tens of MiB (the production qwen35moe's 63 MiB); one message between host
// and plugin carries it whole (iface.MaxMessageSize, 128 MiB).
const MaxBlobCheckpoint = 120 << 20

// BlobCheckpoint is a context checkpoint as a blob carries it (flags bit0):
// the part of the sequence's memory that cannot be cut back, saved when it
// held NTokens tokens at positions PosMin..PosMax. Target is the model's
// partial state as llama.cpp writes it (llama_state_seq_get_data_ext with
// LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY), Draft a draft model's (empty: none).
type BlobCheckpoint struct {
	PosMin, PosMax int32
	NTokens        int64
	Target, Draft  []byte
}

// size is the checkpoint's bytes in the wrapper.
func (c *BlobCheckpoint) size() int64 { return 16 + 8 + int64(len(c.Target)) + 8 + int64(len(c.Draft)) }

// BlobHeader is a parsed blob wrapper.
type BlobHeader struct {
	Version int
	NPast   uint32
	Tokens  []int32
	// Checkpoint is the context checkpoint the wrapper carries (flag bit0);
	// nil for none.
	Checkpoint *BlobCheckpoint
	// Layout is the state's layout and source the wrapper names (flag bit1),
	// nil when it names none; HasTrailer: an integrity trailer ends the
	// payload (bit2).
	Layout     []byte
	HasTrailer bool
	Size       int64  // bytes of wrapper consumed
	CRC        uint32 // the CRC-32C of those bytes, the start of the trailer's sum
}

// BlobExtras are what a wrapper carries beyond the tokens: the reference
// engine's checkpoint, and this engine's layout and trailer.
type BlobExtras struct {
	Checkpoint *BlobCheckpoint // the slot's newest context checkpoint (nil: none)
	Layout     []byte          // the state's layout and source, JSON (nil: none)
	Trailer    bool            // the payload ends in an integrity trailer
}

// BlobHeaderSize is the size of the v2 wrapper AppendBlobHeader writes for
// nTokens tokens and x.
func BlobHeaderSize(nTokens int, x BlobExtras) int64 {
	n := int64(1 + 4 + 4 + 4*nTokens + 1)
	if x.Checkpoint != nil {
		n += x.Checkpoint.size()
	}
	if x.Layout != nil {
		n += 4 + int64(len(x.Layout))
	}
	return n
}

// AppendBlobHeader appends a v2 wrapper with the extras x.
func AppendBlobHeader(b []byte, nPast int, tokens []int32, x BlobExtras) []byte {
	b = append(b, blobVersion2)
	b = binary.LittleEndian.AppendUint32(b, uint32(nPast))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(tokens)))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	var flags byte
	if x.Checkpoint != nil {
		flags |= blobFlagCheckpoint
	}
	if x.Layout != nil {
		flags |= blobFlagLayout
	}
	if x.Trailer {
		flags |= blobFlagTrailer
	}
	b = append(b, flags)
	if c := x.Checkpoint; c != nil {
		b = binary.LittleEndian.AppendUint32(b, uint32(c.PosMin))
		b = binary.LittleEndian.AppendUint32(b, uint32(c.PosMax))
		b = binary.LittleEndian.AppendUint64(b, uint64(c.NTokens))
		b = binary.LittleEndian.AppendUint64(b, uint64(len(c.Target)))
		b = append(b, c.Target...)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(c.Draft)))
		b = append(b, c.Draft...)
	}
	if x.Layout != nil {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x.Layout)))
		b = append(b, x.Layout...)
	}
	return b
}

// ErrMalformedBlob marks a wrapper that does not parse or does not fit its
// payload.
var ErrMalformedBlob = errors.New("malformed KV blob")

// ReadBlobHeader reads the wrapper from r, which holds avail bytes in all. It
// reads no further than the wrapper, so r is left at the first state byte. A
// checkpoint is read into memory, its sizes checked against avail and
// MaxBlobCheckpoint first.
// n_tok is checked against maxTokens (the backend's n_ctx; ≤ 0: no limit but
// the format's) and against avail before anything is allocated for the
// tokens, so a header cannot make the reader allocate more than the backend
// could ever hold.
func ReadBlobHeader(r io.Reader, avail int64, maxTokens int) (BlobHeader, error) {
	return ReadBlobHeaderAdmit(r, avail, maxTokens, nil)
}

// ReadBlobHeaderAdmit is ReadBlobHeader asking admit (if not nil) for a
// checkpoint's bytes once their size is known to fit, before they are
// allocated: an error from it refuses the blob, the rest unread.
func ReadBlobHeaderAdmit(r io.Reader, avail int64, maxTokens int, admit func(n int64) error) (BlobHeader, error) {
	cr := &crcReader{r: r}
	br := &blobReader{r: cr, avail: avail, admit: admit}
	h, err := br.head()
	if err == nil {
		err = checkTokenCount(h.nTok, maxTokens)
	}
	if err == nil {
		h.Tokens, err = br.tokens(h.nTok)
	}
	if err == nil && h.Version == 2 {
		err = br.flags(&h.BlobHeader)
	}
	if err == nil && h.HasTrailer && avail-br.size < TrailerSize {
		err = fmt.Errorf("%w: payload of %d bytes ends before its integrity trailer", ErrMalformedBlob, avail)
	}
	h.Size, h.CRC = br.size, cr.crc
	return h.BlobHeader, err
}

// crcReader sums what it reads.
type crcReader struct {
	r   io.Reader
	crc uint32
}

func (c *crcReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.crc = crc32.Update(c.crc, Castagnoli, p[:n])
	return n, err
}

// checkTokenCount refuses an n_tok beyond what the reader's caller holds.
func checkTokenCount(n int64, maxTokens int) error {
	if maxTokens > 0 && n > int64(maxTokens) {
		return fmt.Errorf("%w: n_tok %d exceeds the backend's context of %d tokens", ErrMalformedBlob, n, maxTokens)
	}
	return nil
}

// blobReader reads a wrapper field by field, never past avail bytes.
type blobReader struct {
	r     io.Reader
	avail int64
	size  int64 // bytes consumed
	buf   [16]byte
	admit func(n int64) error // asked before a checkpoint's bytes are allocated; nil: none
}

// tokenBatch is how many token ids tokens reads at a time.
const tokenBatch = 1024

// read reads the next n (≤ 16) bytes, what naming them in errors.
func (br *blobReader) read(n int, what string) ([]byte, error) {
	if br.size+int64(n) > br.avail {
		return nil, fmt.Errorf("%w: payload of %d bytes ends inside %s", ErrMalformedBlob, br.avail, what)
	}
	if _, err := io.ReadFull(br.r, br.buf[:n]); err != nil {
		return nil, fmt.Errorf("reading blob %s: %w", what, err)
	}
	br.size += int64(n)
	return br.buf[:n], nil
}

// blobHead is the version, n_past and n_tok.
type blobHead struct {
	BlobHeader
	nTok int64
}

// head reads the version byte (v2) or recognises its absence (v1: the byte
// read is n_past's lowest), then n_past and n_tok.
func (br *blobReader) head() (blobHead, error) {
	var h blobHead
	first, err := br.read(1, "version")
	if err != nil {
		return h, err
	}
	var fields [8]byte
	if first[0] == blobVersion2 {
		h.Version = 2
		rest, err := br.read(8, "header")
		if err != nil {
			return h, err
		}
		copy(fields[:], rest)
	} else {
		h.Version = 1
		fields[0] = first[0]
		rest, err := br.read(7, "header")
		if err != nil {
			return h, err
		}
		copy(fields[1:], rest)
	}
	h.NPast = binary.LittleEndian.Uint32(fields[0:4])
	h.nTok = int64(binary.LittleEndian.Uint32(fields[4:8]))
	return h, nil
}

// tokens reads n token ids, once n is known to fit the payload, a batch at a
// time through one small buffer: memory is the ids' own, not twice that.
func (br *blobReader) tokens(n int64) ([]int32, error) {
	if n > maxBlobTokens || br.size+4*n > br.avail {
		return nil, fmt.Errorf("%w: n_tok %d does not fit a payload of %d bytes", ErrMalformedBlob, n, br.avail)
	}
	toks := make([]int32, n)
	var raw [4 * tokenBatch]byte
	for done := 0; done < len(toks); {
		k := min(len(toks)-done, tokenBatch)
		if _, err := io.ReadFull(br.r, raw[:4*k]); err != nil {
			return nil, fmt.Errorf("reading blob tokens: %w", err)
		}
		for i := range k {
			toks[done+i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		done += k
		br.size += 4 * int64(k)
	}
	return toks, nil
}

// flags reads v2's flags byte and the checkpoint and layout it announces
// into h. Unknown flag bits are refused: they would
// announce bytes this reader cannot place.
func (br *blobReader) flags(h *BlobHeader) error {
	fb, err := br.read(1, "flags")
	if err != nil {
		return err
	}
	flags := fb[0]
	if unknown := flags &^ (blobFlagCheckpoint | blobFlagLayout | blobFlagTrailer); unknown != 0 {
		return fmt.Errorf("%w: unknown flags %#02x", ErrMalformedBlob, unknown)
	}
	h.HasTrailer = flags&blobFlagTrailer != 0
	if flags&blobFlagCheckpoint != 0 {
		if h.Checkpoint, err = br.checkpoint(); err != nil {
			return err
		}
	}
	if flags&blobFlagLayout != 0 {
		if h.Layout, err = br.layout(); err != nil {
			return err
		}
	}
	return nil
}

// checkpoint reads a checkpoint, each size checked against the payload and
// MaxBlobCheckpoint before anything is allocated for it.
func (br *blobReader) checkpoint() (*BlobCheckpoint, error) {
	hb, err := br.read(16, "checkpoint header")
	if err != nil {
		return nil, err
	}
	c := &BlobCheckpoint{PosMin: int32(binary.LittleEndian.Uint32(hb[0:])), PosMax: int32(binary.LittleEndian.Uint32(hb[4:])),
		NTokens: int64(binary.LittleEndian.Uint64(hb[8:]))}
	if c.NTokens < 0 || c.PosMin > c.PosMax {
		return nil, fmt.Errorf("%w: checkpoint of %d tokens at positions %d..%d", ErrMalformedBlob, c.NTokens, c.PosMin, c.PosMax)
	}
	var held int64
	for _, part := range []struct {
		what string
		to   *[]byte
	}{{"checkpoint target", &c.Target}, {"checkpoint draft", &c.Draft}} {
		szb, err := br.read(8, part.what+" size")
		if err != nil {
			return nil, err
		}
		sz := binary.LittleEndian.Uint64(szb)
		if sz > uint64(br.avail-br.size) || sz > uint64(MaxBlobCheckpoint-held) {
			return nil, fmt.Errorf("%w: %s of %d bytes does not fit the payload (or the %d bytes a checkpoint may hold)",
				ErrMalformedBlob, part.what, sz, MaxBlobCheckpoint)
		}
		if br.admit != nil && sz > 0 {
			if err := br.admit(int64(sz)); err != nil {
				return nil, err
			}
		}
		*part.to = make([]byte, sz)
		if _, err := io.ReadFull(br.r, *part.to); err != nil {
			return nil, fmt.Errorf("reading blob %s: %w", part.what, err)
		}
		br.size += int64(sz)
		held += int64(sz)
	}
	return c, nil
}

// layout reads a layout of at most MaxBlobLayout bytes.
func (br *blobReader) layout() ([]byte, error) {
	szb, err := br.read(4, "layout size")
	if err != nil {
		return nil, err
	}
	sz := int64(binary.LittleEndian.Uint32(szb))
	if sz > MaxBlobLayout || sz > br.avail-br.size {
		return nil, fmt.Errorf("%w: a layout of %d bytes (at most %d, and within the payload)", ErrMalformedBlob, sz, MaxBlobLayout)
	}
	l := make([]byte, sz)
	if _, err := io.ReadFull(br.r, l); err != nil {
		return nil, fmt.Errorf("reading blob layout: %w", err)
	}
	br.size += sz
	return l, nil
}
