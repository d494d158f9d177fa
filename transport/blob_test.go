package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"testing"
)

func TestBlobHeaderRoundTrip(t *testing.T) {
	toks := []int32{1, 2, 3, -5, 1 << 30}
	b := AppendBlobHeader(nil, 7, toks)
	if int64(len(b)) != BlobHeaderSize(len(toks)) {
		t.Fatalf("size %d, want %d", len(b), BlobHeaderSize(len(toks)))
	}
	payload := append(bytes.Clone(b), "STATE"...)
	r := bytes.NewReader(payload)
	h, err := ReadBlobHeader(r, int64(len(payload)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != 2 || h.NPast != 7 || h.Size != int64(len(b)) || h.HasCheckpoint {
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
	if got := AppendBlobHeader(nil, 0, nil); !bytes.Equal(got, want) {
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
	// v2 with a checkpoint: skipped whole.
	b := AppendBlobHeader(nil, 1, []int32{9})
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
	if err != nil || !h.HasCheckpoint || h.Size != int64(size) {
		t.Fatalf("checkpoint: %+v %v", h, err)
	}
}

func TestBlobMalformed(t *testing.T) {
	huge := AppendBlobHeader(nil, 0, nil)
	binary.LittleEndian.PutUint32(huge[5:], 1<<30) // n_tok far beyond the payload
	ck := AppendBlobHeader(nil, 0, nil)
	ck[len(ck)-1] = blobFlagCheckpoint
	ck = append(ck, make([]byte, 16)...)
	ck = binary.LittleEndian.AppendUint64(ck, 1<<40)
	for name, p := range map[string][]byte{
		"empty": {}, "short v2": {2, 1, 0}, "short v1": {1, 0, 0, 0, 5}, "huge n_tok": huge, "huge checkpoint": ck,
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
	b := AppendBlobHeader(nil, 9, toks)
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
	huge := AppendBlobHeader(nil, 0, nil)
	binary.LittleEndian.PutUint32(huge[5:], maxBlobTokens)
	if _, err := ReadBlobHeader(bytes.NewReader(huge), 1<<32, 32768); !errors.Is(err, ErrMalformedBlob) {
		t.Fatalf("16 M tokens against n_ctx 32768: %v", err)
	}
}

// fuzzTokenLimit is the n_ctx FuzzReadBlobHeader checks the limit with.
const fuzzTokenLimit = 3

func FuzzReadBlobHeader(f *testing.F) {
	f.Add(AppendBlobHeader(nil, 3, []int32{1, 2, 3}))
	f.Add(AppendBlobHeader(nil, 4, []int32{1, 2, 3, 4}))
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0})
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
		if h.Version == 2 && !h.HasCheckpoint {
			// Equal but for unknown flag bits, which are ignored.
			re := AppendBlobHeader(nil, int(h.NPast), h.Tokens)
			if !bytes.Equal(re[:len(re)-1], p[:h.Size-1]) || p[h.Size-1]&blobFlagCheckpoint != 0 {
				t.Fatalf("re-encoding differs")
			}
		}
	})
}
