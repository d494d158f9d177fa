package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestBlobHeaderRoundTrip(t *testing.T) {
	toks := []int32{1, 2, 3, -5, 1 << 30}
	b := AppendBlobHeader(nil, 7, toks, BlobExtras{})
	if int64(len(b)) != BlobHeaderSize(len(toks), BlobExtras{}) {
		t.Fatalf("size %d, want %d", len(b), BlobHeaderSize(len(toks), BlobExtras{}))
	}
	payload := append(bytes.Clone(b), "STATE"...)
	r := bytes.NewReader(payload)
	h, err := ReadBlobHeader(r, int64(len(payload)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 2 || h.NPast != 7 || h.Size != int64(len(b)) || h.Checkpoint != nil {
		t.Fatalf("header %+v", h)
	}
	for i := range toks {
		if h.Tokens[i] != toks[i] {
			t.Fatalf("token %d: %d != %d", i, h.Tokens[i], toks[i])
		}
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "STATE" {
		t.Fatalf("reader not left at the state: %q", rest)
	}
}

func TestBlobEmptySlotVector(t *testing.T) {
	// §10: the v2 header of an empty slot.
	want := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if got := AppendBlobHeader(nil, 0, nil, BlobExtras{}); !bytes.Equal(got, want) {
		t.Fatalf("% x, want % x", got, want)
	}
}

func TestBlobV1AndCheckpoint(t *testing.T) {
	// v1: [u32 n_past][u32 n_tok][tokens]
	v1 := binary.LittleEndian.AppendUint32(nil, 3)
	v1 = binary.LittleEndian.AppendUint32(v1, 2)
	v1 = binary.LittleEndian.AppendUint32(v1, 10)
	v1 = binary.LittleEndian.AppendUint32(v1, 11)
	h, err := ReadBlobHeader(bytes.NewReader(v1), int64(len(v1)), 0)
	if err != nil || h.Version != 1 || len(h.Tokens) != 2 || h.Tokens[1] != 11 || h.Size != 16 {
		t.Fatalf("v1: %+v %v", h, err)
	}
	// v2 with a checkpoint in the reference engine's layout: read whole.
	b := AppendBlobHeader(nil, 1, []int32{9}, BlobExtras{})
	b[len(b)-1] = blobFlagCheckpoint
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, 1)
	b = binary.LittleEndian.AppendUint64(b, 3)
	b = append(b, "tgt"...)
	b = binary.LittleEndian.AppendUint64(b, 2)
	b = append(b, "df"...)
	size := len(b)
	b = append(b, "S"...)
	h, err = ReadBlobHeader(bytes.NewReader(b), int64(len(b)), 0)
	c := h.Checkpoint
	if err != nil || c == nil || h.Size != int64(size) || c.PosMin != 0 || c.PosMax != 0 || c.NTokens != 1 ||
		string(c.Target) != "tgt" || string(c.Draft) != "df" {
		t.Fatalf("checkpoint: %+v %+v %v", h, c, err)
	}
	// Written back, the same bytes.
	if re := AppendBlobHeader(nil, 1, []int32{9}, BlobExtras{Checkpoint: c}); !bytes.Equal(re, b[:size]) {
		t.Fatalf("the checkpoint written back differs:\n% x\n% x", re, b[:size])
	}
}

func TestBlobMalformed(t *testing.T) {
	huge := AppendBlobHeader(nil, 0, nil, BlobExtras{})
	binary.LittleEndian.PutUint32(huge[5:], 1<<30) // n_tok far beyond the payload
	ck := AppendBlobHeader(nil, 0, nil, BlobExtras{})
	ck[len(ck)-1] = blobFlagCheckpoint
	ck = append(ck, make([]byte, 16)...)
	ck = binary.LittleEndian.AppendUint64(ck, 1<<40)
	backwards := AppendBlobHeader(nil, 0, nil, BlobExtras{Checkpoint: &BlobCheckpoint{PosMin: 5, PosMax: 4, NTokens: 5}})
	negative := AppendBlobHeader(nil, 0, nil, BlobExtras{Checkpoint: &BlobCheckpoint{NTokens: -1}})
	for name, p := range map[string][]byte{
		"empty": {}, "short v2": {2, 1, 0}, "short v1": {1, 0, 0, 0, 5}, "huge n_tok": huge, "huge checkpoint": ck,
		"checkpoint ends before its positions begin": backwards, "checkpoint of negative tokens": negative,
	} {
		if _, err := ReadBlobHeader(bytes.NewReader(p), int64(len(p)), 0); !errors.Is(err, ErrMalformedBlob) {
			t.Errorf("%s: err = %v, want ErrMalformedBlob", name, err)
		}
	}
}

// TestBlobTokensOverContext: n_tok beyond the caller's limit (the backend's
// n_ctx) is refused before the tokens are read, however large the payload
// claims to be, and a count within it still parses.
func TestBlobTokensOverContext(t *testing.T) {
	toks := make([]int32, 9)
	b := AppendBlobHeader(nil, 9, toks, BlobExtras{})
	for _, tc := range []struct {
		limit int
		ok    bool
	}{{8, false}, {9, true}, {0, true}} {
		r := bytes.NewReader(b)
		h, err := ReadBlobHeader(r, int64(len(b)), tc.limit)
		if tc.ok != (err == nil) || (err == nil && len(h.Tokens) != 9) {
			t.Errorf("limit %d: %d tokens, %v", tc.limit, len(h.Tokens), err)
		}
		if !tc.ok && (!errors.Is(err, ErrMalformedBlob) || r.Len() != len(b)-9) {
			t.Errorf("limit %d: err %v after %d bytes; want ErrMalformedBlob after the 9-byte head", tc.limit, err, len(b)-r.Len())
		}
	}
	// A head claiming 2^24 tokens over a payload that says it holds them
	// all fails on the limit without reading (or allocating) any of them.
	huge := AppendBlobHeader(nil, 0, nil, BlobExtras{})
	binary.LittleEndian.PutUint32(huge[5:], maxBlobTokens)
	if _, err := ReadBlobHeader(bytes.NewReader(huge), 1<<32, 32768); !errors.Is(err, ErrMalformedBlob) {
		t.Fatalf("16 M tokens against n_ctx 32768: %v", err)
	}
}

// fuzzTokenLimit is the n_ctx FuzzReadBlobHeader checks the limit with.
const fuzzTokenLimit = 3

func FuzzReadBlobHeader(f *testing.F) {
	f.Add(AppendBlobHeader(nil, 3, []int32{1, 2, 3}, BlobExtras{}))
	f.Add(AppendBlobHeader(nil, 4, []int32{1, 2, 3, 4}, BlobExtras{}))
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0})
	f.Add(AppendBlobHeader(nil, 2, []int32{5, 6}, BlobExtras{Layout: []byte(`{"arch":"llama"}`), Trailer: true}))
	f.Add(AppendBlobHeader(nil, 2, []int32{5, 6}, BlobExtras{Checkpoint: &BlobCheckpoint{PosMin: 1, PosMax: 1, NTokens: 2, Target: []byte("rs")},
		Layout: []byte(`{}`), Trailer: true}))
	f.Fuzz(func(t *testing.T, p []byte) {
		r := bytes.NewReader(p)
		h, err := ReadBlobHeader(r, int64(len(p)), 0)
		// With a limit, the same bytes parse the same, or fail on the
		// limit exactly when they hold more tokens than it allows.
		hl, errl := ReadBlobHeader(bytes.NewReader(p), int64(len(p)), fuzzTokenLimit)
		if err == nil && (len(h.Tokens) > fuzzTokenLimit) == (errl == nil) {
			t.Fatalf("%d tokens under a limit of %d: %v", len(h.Tokens), fuzzTokenLimit, errl)
		}
		if errl == nil && (err != nil || hl.Size != h.Size || !slices.Equal(hl.Tokens, h.Tokens)) {
			t.Fatalf("the limit changed the parse: %+v %v, %+v", h, err, hl)
		}
		if err != nil {
			return
		}
		if h.Size > int64(len(p)) || h.Size != int64(len(p))-int64(r.Len()) {
			t.Fatalf("size %d inconsistent with consumed %d", h.Size, len(p)-r.Len())
		}
		if h.Version == 2 {
			x := BlobExtras{Checkpoint: h.Checkpoint, Layout: h.Layout, Trailer: h.HasTrailer}
			re := AppendBlobHeader(nil, int(h.NPast), h.Tokens, x)
			if !bytes.Equal(re, p[:h.Size]) || int64(len(re)) != BlobHeaderSize(len(h.Tokens), x) {
				t.Fatalf("re-encoding differs")
			}
		}
		if h.CRC != crc32.Checksum(p[:h.Size], Castagnoli) {
			t.Fatalf("the wrapper's CRC %08x is not its bytes'", h.CRC)
		}
	})
}

// TestBlobExtras: a wrapper with a layout and a trailer reads back as
// written, its CRC the wrapper's; the trailer checks its payload; unknown
// flags, an oversized layout and a payload too short for its trailer are
// refused.
func TestBlobExtras(t *testing.T) {
	layout := []byte(`{"arch":"qwen35moe","memory":"hybrid"}`)
	x := BlobExtras{Layout: layout, Trailer: true}
	w := AppendBlobHeader(nil, 3, []int32{7, 8, 9}, x)
	if int64(len(w)) != BlobHeaderSize(3, x) {
		t.Fatalf("size %d, want %d", len(w), BlobHeaderSize(3, x))
	}
	state := bytes.Repeat([]byte{0xab}, 100)
	payload := append(slices.Clone(w), state...)
	crc := crc32.Checksum(payload, Castagnoli)
	payload = AppendTrailer(payload, crc, uint64(len(payload)))
	r := bytes.NewReader(payload)
	h, err := ReadBlobHeader(r, int64(len(payload)), 0)
	if err != nil || !bytes.Equal(h.Layout, layout) || !h.HasTrailer || h.Size != int64(len(w)) || h.CRC != crc32.Checksum(w, Castagnoli) {
		t.Fatalf("read back %+v, %v", h, err)
	}
	rest, _ := io.ReadAll(r)
	body, trailer := rest[:len(rest)-TrailerSize], rest[len(rest)-TrailerSize:]
	if err := CheckTrailer(trailer, crc32.Update(h.CRC, Castagnoli, body), uint64(h.Size)+uint64(len(body))); err != nil {
		t.Fatalf("the trailer of the bytes as written: %v", err)
	}
	body[42] ^= 1
	if err := CheckTrailer(trailer, crc32.Update(h.CRC, Castagnoli, body), uint64(h.Size)+uint64(len(body))); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("a flipped bit: %v", err)
	}
	if err := CheckTrailer(trailer[:8], 0, 0); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("a cut trailer: %v", err)
	}
	bad := slices.Clone(w)
	bad[len(w)-len(layout)-5] |= 0x80 // the flags byte
	if _, err := ReadBlobHeader(bytes.NewReader(bad), int64(len(bad)+TrailerSize), 0); !errors.Is(err, ErrMalformedBlob) || !strings.Contains(err.Error(), "unknown flags") {
		t.Fatalf("unknown flags: %v", err)
	}
	big := AppendBlobHeader(nil, 0, nil, BlobExtras{Layout: make([]byte, MaxBlobLayout+1)})
	if _, err := ReadBlobHeader(bytes.NewReader(big), int64(len(big)), 0); !errors.Is(err, ErrMalformedBlob) {
		t.Fatalf("a layout over the limit: %v", err)
	}
	if _, err := ReadBlobHeader(bytes.NewReader(w), int64(len(w))+TrailerSize-1, 0); !errors.Is(err, ErrMalformedBlob) {
		t.Fatalf("no room for the trailer: %v", err)
	}
}
