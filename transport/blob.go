package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The KV blob wraps a backend's per-sequence state (protocol §6):
//
//	v2: u8 0x02, u32 n_past, u32 n_tok, i32 tokens[n_tok], u8 flags,
//	    [flags bit0: i32 pos_min, i32 pos_max, i64 n_tokens, u64 tgt_sz, tgt, u64 dft_sz, dft]
//	v1: u32 n_past, u32 n_tok, i32 tokens[n_tok]   (legacy, STATE_PUT only)
//
// followed by the state and, in PREFILL replies, the logits.
const blobVersion2 = 0x02

// blobFlagCheckpoint marks a speculative-decoding checkpoint after the flags byte.
const blobFlagCheckpoint = 0x01

// maxBlobTokens bounds n_tok before anything is allocated for it, whatever
// the caller allows.
const maxBlobTokens = 1 << 24

// BlobHeader is a parsed blob wrapper.
type BlobHeader struct {
	Version       int
	NPast         uint32
	Tokens        []int32
	HasCheckpoint bool
	Size          int64 // bytes of wrapper consumed
}

// BlobHeaderSize is the size of the v2 wrapper AppendBlobHeader writes for
// nTokens tokens.
func BlobHeaderSize(nTokens int) int64 { return 1 + 4 + 4 + 4*int64(nTokens) + 1 }

// AppendBlobHeader appends a v2 wrapper without a checkpoint: this engine
// keeps no speculative draft, and a restoring engine fabricates one.
func AppendBlobHeader(b []byte, nPast int, tokens []int32) []byte {
	b = append(b, blobVersion2)
	b = binary.LittleEndian.AppendUint32(b, uint32(nPast))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(tokens)))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return append(b, 0)
}

// ErrMalformedBlob marks a wrapper that does not parse or does not fit its
// payload.
var ErrMalformedBlob = errors.New("malformed KV blob")

// ReadBlobHeader reads the wrapper from r, which holds avail bytes in all. It
// reads no further than the wrapper, so r is left at the first state byte. A
// checkpoint is read and discarded (its length is checked against avail first).
// n_tok is checked against maxTokens (the backend's n_ctx; ≤ 0: no limit but
// the format's) and against avail before anything is allocated for the
// tokens, so a header cannot make the reader allocate more than the backend
// could ever hold.
func ReadBlobHeader(r io.Reader, avail int64, maxTokens int) (BlobHeader, error) {
	br := &blobReader{r: r, avail: avail}
	h, err := br.head()
	if err == nil {
		err = checkTokenCount(h.nTok, maxTokens)
	}
	if err == nil {
		h.Tokens, err = br.tokens(h.nTok)
	}
	if err == nil && h.Version == 2 {
		h.HasCheckpoint, err = br.flags()
	}
	h.Size = br.size
	return h.BlobHeader, err
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

// flags reads v2's flags byte and skips the checkpoint it announces, if any.
// Unknown flag bits are ignored.
func (br *blobReader) flags() (hasCheckpoint bool, err error) {
	flags, err := br.read(1, "flags")
	if err != nil || flags[0]&blobFlagCheckpoint == 0 {
		return false, err
	}
	if _, err := br.read(16, "checkpoint header"); err != nil { // pos_min, pos_max, n_tokens
		return true, err
	}
	for _, what := range []string{"checkpoint target", "checkpoint draft"} {
		szb, err := br.read(8, what+" size")
		if err != nil {
			return true, err
		}
		sz := binary.LittleEndian.Uint64(szb)
		if sz > uint64(br.avail-br.size) {
			return true, fmt.Errorf("%w: %s of %d bytes does not fit the payload", ErrMalformedBlob, what, sz)
		}
		if _, err := io.CopyN(io.Discard, br.r, int64(sz)); err != nil {
			return true, fmt.Errorf("reading blob %s: %w", what, err)
		}
		br.size += int64(sz)
	}
	return true, nil
}
