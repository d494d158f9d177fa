package host

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

// maxBlobTokens bounds n_tok before anything is allocated for it.
const maxBlobTokens = 1 << 24

// BlobHeader is a parsed blob wrapper.
type BlobHeader struct {
	Version       int
	NPast         uint32
	Tokens        []int32
	HasCheckpoint bool
	Size          int64 // bytes of wrapper consumed
}

// blobHeaderSize is the size of the v2 wrapper AppendBlobHeader writes.
func blobHeaderSize(nTokens int) int64 { return 1 + 4 + 4 + 4*int64(nTokens) + 1 }

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

// errBlob marks a malformed wrapper.
var errBlob = errors.New("malformed KV blob")

// ReadBlobHeader reads the wrapper from r, which holds avail bytes in all. It
// reads no further than the wrapper, so r is left at the first state byte. A
// checkpoint is read and discarded (its length is checked against avail first).
func ReadBlobHeader(r io.Reader, avail int64) (BlobHeader, error) {
	var h BlobHeader
	var buf [16]byte
	read := func(n int, what string) ([]byte, error) {
		if h.Size+int64(n) > avail {
			return nil, fmt.Errorf("%w: payload of %d bytes ends inside %s", errBlob, avail, what)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return nil, fmt.Errorf("reading blob %s: %w", what, err)
		}
		h.Size += int64(n)
		return buf[:n], nil
	}
	first, err := read(1, "version")
	if err != nil {
		return h, err
	}
	var head []byte
	if first[0] == blobVersion2 {
		h.Version = 2
		if head, err = read(8, "header"); err != nil {
			return h, err
		}
	} else {
		// v1 has no version byte: the byte read is n_past's lowest.
		h.Version = 1
		b0 := first[0]
		rest, err := read(7, "header")
		if err != nil {
			return h, err
		}
		head = append([]byte{b0}, rest...)
	}
	h.NPast = binary.LittleEndian.Uint32(head[0:4])
	nTok := int64(binary.LittleEndian.Uint32(head[4:8]))
	if nTok > maxBlobTokens || h.Size+4*nTok > avail {
		return h, fmt.Errorf("%w: n_tok %d does not fit a payload of %d bytes", errBlob, nTok, avail)
	}
	raw := make([]byte, 4*nTok)
	if _, err := io.ReadFull(r, raw); err != nil {
		return h, fmt.Errorf("reading blob tokens: %w", err)
	}
	h.Size += 4 * nTok
	h.Tokens = make([]int32, nTok)
	for i := range h.Tokens {
		h.Tokens[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	if h.Version == 1 {
		return h, nil
	}
	flags, err := read(1, "flags")
	if err != nil {
		return h, err
	}
	if flags[0]&blobFlagCheckpoint == 0 {
		return h, nil
	}
	h.HasCheckpoint = true
	if _, err := read(16, "checkpoint header"); err != nil { // pos_min, pos_max, n_tokens
		return h, err
	}
	for _, what := range []string{"checkpoint target", "checkpoint draft"} {
		szb, err := read(8, what+" size")
		if err != nil {
			return h, err
		}
		sz := binary.LittleEndian.Uint64(szb)
		if sz > uint64(avail-h.Size) {
			return h, fmt.Errorf("%w: %s of %d bytes does not fit the payload", errBlob, what, sz)
		}
		if _, err := io.CopyN(io.Discard, r, int64(sz)); err != nil {
			return h, fmt.Errorf("reading blob %s: %w", what, err)
		}
		h.Size += int64(sz)
	}
	return h, nil
}
