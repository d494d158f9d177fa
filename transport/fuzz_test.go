package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// The seed corpora live in testdata/fuzz/<FuzzName>/ and hold the §10
// vectors; the f.Add seeds below repeat them so plain `go test` covers them
// even if the files are pruned.

func FuzzParseRequestHeader(f *testing.F) {
	for _, v := range requestVectors {
		f.Add(unhex(f, v.wire))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseRequestHeader(b)
		switch {
		case len(b) < RequestHeaderSize:
			if err == nil {
				t.Fatalf("%d-byte header accepted", len(b))
			}
			return
		case binary.LittleEndian.Uint16(b) != Magic:
			if !errors.Is(err, ErrBadMagic) {
				t.Fatalf("bad magic: err = %v", err)
			}
			return
		case err != nil:
			t.Fatalf("valid header rejected: %v", err)
		}
		if enc := AppendRequestHeader(nil, h); !bytes.Equal(enc, b[:RequestHeaderSize]) {
			t.Fatalf("re-encoded % x, want % x", enc, b[:RequestHeaderSize])
		}
		// Reading a whole message must not panic, whatever the lengths claim.
		r := bytes.NewReader(b)
		h2, err := ReadRequestHeader(r)
		if err != nil || h2 != h {
			t.Fatalf("ReadRequestHeader = %+v, %v; want %+v", h2, err, h)
		}
		key, trace, err := ReadKeyTrace(r, h)
		if err == nil {
			var buf bytes.Buffer
			if err := WriteRequest(&buf, h.Op, key, trace, h.PayloadLen); err != nil {
				t.Fatal(err)
			}
			want := b[:RequestHeaderSize+len(key)+len(trace)]
			if h.Flags == 0 && !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("WriteRequest = % x, want % x", buf.Bytes(), want)
			}
		}
	})
}

func FuzzParseResponseHeader(f *testing.F) {
	for _, v := range responseVectors {
		f.Add(unhex(f, v.wire))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseResponseHeader(b)
		if len(b) < ResponseHeaderSize {
			if err == nil {
				t.Fatalf("%d-byte header accepted", len(b))
			}
			return
		}
		if err != nil {
			t.Fatalf("valid header rejected: %v", err)
		}
		if h.MetaLen > MaxMetaLen {
			t.Fatalf("meta_len %d over the 24-bit limit", h.MetaLen)
		}
		if enc := AppendResponseHeader(nil, h); !bytes.Equal(enc, b[:ResponseHeaderSize]) {
			t.Fatalf("re-encoded % x, want % x", enc, b[:ResponseHeaderSize])
		}
		meta := b[ResponseHeaderSize:]
		if uint32(len(meta)) > h.MetaLen {
			meta = meta[:h.MetaLen]
		}
		var buf bytes.Buffer
		if err := WriteResponseHeader(&buf, h.Status, meta, h.PayloadLen); err != nil {
			t.Fatal(err)
		}
		got, err := ReadResponseHeader(&buf)
		if err != nil || got.Status != h.Status || got.MetaLen != uint32(len(meta)) || got.PayloadLen != h.PayloadLen {
			t.Fatalf("WriteResponseHeader round trip = %+v, %v", got, err)
		}
		if !bytes.Equal(buf.Bytes(), meta) {
			t.Fatalf("meta = % x, want % x", buf.Bytes(), meta)
		}
	})
}

func FuzzParseDecodeFrames(f *testing.F) {
	f.Add(unhex(f, "64 00 00 00 cd cc cc bd 00"))
	f.Add(unhex(f, "05 00 00 00 48 65 6c 6c 6f")) // 8d18d1b's unframed "Hello" piece
	f.Add(unhex(f, "01 00 00 00 00 00 c0 7f 01"))
	f.Add([]byte{})
	f.Add(make([]byte, 8))
	f.Fuzz(func(t *testing.T, b []byte) {
		frames, err := ParseDecodeFrames(b)
		if len(b)%DecodeFrameSize != 0 {
			if err == nil {
				t.Fatalf("%d-byte payload accepted", len(b))
			}
			return
		}
		if err != nil || len(frames) != len(b)/DecodeFrameSize {
			t.Fatalf("ParseDecodeFrames = %d frames, %v", len(frames), err)
		}
		var enc []byte
		for _, fr := range frames {
			enc = AppendDecodeFrame(enc, fr)
		}
		// Encoding keeps every byte but the reserved flag bits.
		want := bytes.Clone(b)
		for i := DecodeFrameSize - 1; i < len(want); i += DecodeFrameSize {
			want[i] &= DecodeFlagFinal
		}
		if !bytes.Equal(enc, want) {
			t.Fatalf("re-encoded % x, want % x", enc, want)
		}
		again, err := ParseDecodeFrames(enc)
		if err != nil || len(again) != len(frames) {
			t.Fatalf("second parse = %d frames, %v", len(again), err)
		}
		for i := range frames {
			a, b := frames[i], again[i]
			if a.TokenID != b.TokenID || a.Final != b.Final || math.Float32bits(a.Logprob) != math.Float32bits(b.Logprob) {
				t.Fatalf("frame %d: %+v != %+v", i, a, b)
			}
		}
	})
}
