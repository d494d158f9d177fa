package transport

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/quick"
)

// unhex decodes the space-separated hex of the protocol document.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatalf("bad test vector %q: %v", s, err)
	}
	return b
}

// requestVectors are the request vectors of hydra-protocol.md §10, whole
// messages: header, key, trace, payload.
var requestVectors = []struct {
	name    string
	wire    string
	hdr     RequestHeader
	key     string
	trace   string
	payload string
}{
	{
		name: "INFO",
		wire: "59 48 41 00 01 00 00 00 00 00 00 00 00 00 02 00 30 74 31",
		hdr:  RequestHeader{Op: OpInfo, KeyLen: 1, TraceLen: 2},
		key:  "0", trace: "t1",
	},
	{
		name: "STATE_META",
		wire: "59 48 32 00 01 00 00 00 00 00 00 00 00 00 00 00 31",
		hdr:  RequestHeader{Op: OpStateMeta, KeyLen: 1},
		key:  "1",
	},
	{
		name: "CONFIGURE",
		wire: `59 48 40 00 01 00 1c 00 00 00 00 00 00 00 11 00 30 73 74 61 72 74 75 70 2d 63 6f 6e 66 69 67 75 72 65
			7b 22 73 74 61 74 65 5f 63 68 75 6e 6b 5f 73 69 7a 65 22 3a 32 30 39 37 31 35 32 7d`,
		hdr: RequestHeader{Op: OpConfigure, KeyLen: 1, PayloadLen: 28, TraceLen: 17},
		key: "0", trace: "startup-configure", payload: `{"state_chunk_size":2097152}`,
	},
	{
		name: "SET_EXPERT_MODE",
		wire: "59 48 44 00 01 00 08 00 00 00 00 00 00 00 02 00 30 74 72 63 6f 6d 62 69 6e 65 64",
		hdr:  RequestHeader{Op: OpSetExpertMode, KeyLen: 1, PayloadLen: 8, TraceLen: 2},
		key:  "0", trace: "tr", payload: "combined",
	},
	{
		name: "E1_PREFILL",
		wire: `59 48 42 00 01 00 14 00 00 00 00 00 00 00 04 00 30 74 65 73 74
			01 00 00 00 02 00 00 00 03 00 00 00 04 00 00 00 05 00 00 00`,
		hdr: RequestHeader{Op: OpPrefill, KeyLen: 1, PayloadLen: 20, TraceLen: 4},
		key: "0", trace: "test", payload: "\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00\x05\x00\x00\x00",
	},
	{
		name: "E1_DECODE",
		wire: "59 48 43 00 01 00 04 00 00 00 00 00 00 00 04 00 30 74 65 73 74 0a 00 00 00",
		hdr:  RequestHeader{Op: OpDecode, KeyLen: 1, PayloadLen: 4, TraceLen: 4},
		key:  "0", trace: "test", payload: "\x0a\x00\x00\x00",
	},
}

// responseVectors are the response vectors of §10. Where the document gives
// only the header, wire holds the header and meta the meta it describes.
var responseVectors = []struct {
	name    string
	wire    string // header, then meta and payload when the document gives them
	status  Status
	meta    string
	payload string // hex
}{
	{
		name: "CONFIGURE_OK",
		wire: `00 33 00 00 00 00 00 00 00 00 00 00
			7b 22 73 75 63 63 65 73 73 22 3a 74 72 75 65 2c 22 73 74 61 74 65 5f 63 68 75 6e 6b 5f 73 69 7a 65 5f 61 70 70 6c 69 65 64 22 3a 32 30 39 37 31 35 32 7d`,
		status: StatusOK, meta: `{"success":true,"state_chunk_size_applied":2097152}`,
	},
	{
		name: "CONFIGURE_CLAMPED", wire: "00 31 00 00 00 00 00 00 00 00 00 00",
		status: StatusOK, meta: `{"success":true,"state_chunk_size_applied":65536}`,
	},
	{name: "CONFIGURE_MALFORMED", wire: "02 00 00 00 00 00 00 00 00 00 00 00", status: StatusError},
	{name: "STATE_GET_BUSY", wire: "04 00 00 00 00 00 00 00 00 00 00 00", status: StatusBusy},
	{
		name: "STATE_PUT_BUSY", wire: "04 0c 00 00 00 00 00 00 00 00 00 00 7b 22 65 72 72 6f 72 22 3a 22 22 7d",
		status: StatusBusy, meta: `{"error":""}`,
	},
	{
		name: "SET_EXPERT_MODE_OK", wire: "00 1e 00 00 00 00 00 00 00 00 00 00",
		status: StatusOK, meta: `{"success":true,"mode":"solo"}`,
	},
	{
		name: "PIPELINE_ATTACH", wire: "06 67 00 00 00 00 00 00 00 00 00 00",
		status: StatusNotImplemented,
		meta:   `{"error":"HYDRA_OP_PIPELINE_ATTACH not yet implemented in this build (see issue #287)","success":false}`,
	},
	{
		name: "STATE_GET_EMPTY_SLOT",
		wire: `00 1c 00 00 1a 00 00 00 00 00 00 00
			7b 22 6e 5f 70 61 73 74 22 3a 30 2c 22 73 74 61 74 65 5f 73 69 7a 65 22 3a 31 36 7d
			02 00 00 00 00 00 00 00 00 00 d8 3c 14 af 00 00 00 00 01 00 00 00 00 00 00 00`,
		status: StatusOK, meta: `{"n_past":0,"state_size":16}`,
		payload: "02 00 00 00 00 00 00 00 00 00 d8 3c 14 af 00 00 00 00 01 00 00 00 00 00 00 00",
	},
}

func TestRequestVectors(t *testing.T) {
	for _, v := range requestVectors {
		t.Run(v.name, func(t *testing.T) {
			wire := unhex(t, v.wire)

			// Decode.
			h, err := ParseRequestHeader(wire)
			if err != nil || h != v.hdr {
				t.Fatalf("ParseRequestHeader = %+v, %v; want %+v", h, err, v.hdr)
			}
			r := bytes.NewReader(wire)
			h, err = ReadRequestHeader(r)
			if err != nil || h != v.hdr {
				t.Fatalf("ReadRequestHeader = %+v, %v; want %+v", h, err, v.hdr)
			}
			key, trace, err := ReadKeyTrace(r, h)
			if err != nil || key != v.key || trace != v.trace {
				t.Fatalf("ReadKeyTrace = %q, %q, %v; want %q, %q", key, trace, err, v.key, v.trace)
			}
			rest, _ := io.ReadAll(r)
			if string(rest) != v.payload || uint64(len(rest)) != h.PayloadLen {
				t.Fatalf("payload = %q (payload_len %d), want %q", rest, h.PayloadLen, v.payload)
			}

			// Encode.
			if got := AppendRequestHeader(nil, v.hdr); !bytes.Equal(got, wire[:RequestHeaderSize]) {
				t.Errorf("AppendRequestHeader = % x, want % x", got, wire[:RequestHeaderSize])
			}
			var buf bytes.Buffer
			w := &countingWriter{w: &buf}
			if err := WriteRequest(w, v.hdr.Op, v.key, v.trace, uint64(len(v.payload))); err != nil {
				t.Fatal(err)
			}
			if w.writes != 1 {
				t.Errorf("WriteRequest made %d writes, want 1", w.writes)
			}
			buf.WriteString(v.payload)
			if !bytes.Equal(buf.Bytes(), wire) {
				t.Errorf("encoded % x\nwant    % x", buf.Bytes(), wire)
			}
		})
	}
}

func TestResponseVectors(t *testing.T) {
	for _, v := range responseVectors {
		t.Run(v.name, func(t *testing.T) {
			wire := unhex(t, v.wire)
			payload := unhex(t, v.payload)
			want := ResponseHeader{Status: v.status, MetaLen: uint32(len(v.meta)), PayloadLen: uint64(len(payload))}

			// Decode.
			h, err := ParseResponseHeader(wire)
			if err != nil || h != want {
				t.Fatalf("ParseResponseHeader = %+v, %v; want %+v", h, err, want)
			}
			if len(wire) > ResponseHeaderSize {
				r := bytes.NewReader(wire)
				if h, err = ReadResponseHeader(r); err != nil || h != want {
					t.Fatalf("ReadResponseHeader = %+v, %v; want %+v", h, err, want)
				}
				body, _ := io.ReadAll(r)
				if got := string(body[:h.MetaLen]); got != v.meta {
					t.Errorf("meta = %q, want %q", got, v.meta)
				}
				if !bytes.Equal(body[h.MetaLen:], payload) {
					t.Errorf("payload = % x, want % x", body[h.MetaLen:], payload)
				}
			}

			// Encode.
			if got := AppendResponseHeader(nil, want); !bytes.Equal(got, wire[:ResponseHeaderSize]) {
				t.Errorf("AppendResponseHeader = % x, want % x", got, wire[:ResponseHeaderSize])
			}
			var buf bytes.Buffer
			w := &countingWriter{w: &buf}
			if err := WriteResponseHeader(w, v.status, []byte(v.meta), uint64(len(payload))); err != nil {
				t.Fatal(err)
			}
			if w.writes != 1 {
				t.Errorf("WriteResponseHeader made %d writes, want 1", w.writes)
			}
			buf.Write(payload)
			full := buf.Bytes()
			if len(wire) == ResponseHeaderSize {
				full = full[:ResponseHeaderSize] // the document gives the header only
			}
			if !bytes.Equal(full, wire) {
				t.Errorf("encoded % x\nwant    % x", full, wire)
			}
		})
	}
}

func TestHeaderErrors(t *testing.T) {
	good := unhex(t, requestVectors[0].wire)
	if _, err := ParseRequestHeader(good[:RequestHeaderSize-1]); err == nil {
		t.Error("short request header accepted")
	}
	bad := append([]byte{0x48, 0x59}, good[2:]...) // "HY" in the wrong byte order
	if _, err := ParseRequestHeader(bad); !errors.Is(err, ErrBadMagic) {
		t.Errorf("swapped magic: err = %v, want ErrBadMagic", err)
	}
	if _, err := ParseResponseHeader(make([]byte, ResponseHeaderSize-1)); err == nil {
		t.Error("short response header accepted")
	}
	if _, err := ReadRequestHeader(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("ReadRequestHeader on idle close: err = %v, want io.EOF", err)
	}
	if _, err := ReadRequestHeader(bytes.NewReader(good[:5])); err != io.ErrUnexpectedEOF {
		t.Errorf("ReadRequestHeader on truncated header: err = %v, want io.ErrUnexpectedEOF", err)
	}
	if _, _, err := ReadKeyTrace(bytes.NewReader(good[RequestHeaderSize:RequestHeaderSize+1]), RequestHeader{KeyLen: 1, TraceLen: 2}); err != io.ErrUnexpectedEOF {
		t.Errorf("ReadKeyTrace on truncated body: err = %v, want io.ErrUnexpectedEOF", err)
	}
	if err := WriteRequest(io.Discard, OpInfo, strings.Repeat("k", 1<<16), "", 0); err == nil {
		t.Error("64 KiB key accepted")
	}
	if err := WriteRequest(io.Discard, OpInfo, "0", strings.Repeat("t", 1<<16), 0); err == nil {
		t.Error("64 KiB trace accepted")
	}
	if err := WriteResponseHeader(io.Discard, StatusOK, make([]byte, MaxMetaLen+1), 0); err == nil {
		t.Error("meta over 16 MiB accepted")
	}
}

func TestMaxMetaLen(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteResponseHeader(&buf, StatusOK, make([]byte, MaxMetaLen), 7); err != nil {
		t.Fatal(err)
	}
	h, err := ParseResponseHeader(buf.Bytes())
	if err != nil || h.MetaLen != MaxMetaLen || h.PayloadLen != 7 {
		t.Fatalf("got %+v, %v", h, err)
	}
	if buf.Len() != ResponseHeaderSize+MaxMetaLen {
		t.Fatalf("wrote %d bytes", buf.Len())
	}
}

func TestRequestHeaderRoundTrip(t *testing.T) {
	f := func(op, flags uint8, keyLen uint16, payloadLen uint64, traceLen uint16) bool {
		h := RequestHeader{Op: Op(op), Flags: flags, KeyLen: keyLen, PayloadLen: payloadLen, TraceLen: traceLen}
		b := AppendRequestHeader(nil, h)
		got, err := ParseRequestHeader(b)
		return len(b) == RequestHeaderSize && err == nil && got == h
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
}

func TestResponseHeaderRoundTrip(t *testing.T) {
	f := func(status uint8, metaLen uint32, payloadLen uint64) bool {
		h := ResponseHeader{Status: Status(status), MetaLen: metaLen & MaxMetaLen, PayloadLen: payloadLen}
		b := AppendResponseHeader(nil, h)
		got, err := ParseResponseHeader(b)
		return len(b) == ResponseHeaderSize && err == nil && got == h
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
}

func TestRequestRoundTrip(t *testing.T) {
	f := func(op uint8, key, trace string, payloadLen uint64) bool {
		var buf bytes.Buffer
		if err := WriteRequest(&buf, Op(op), key, trace, payloadLen); err != nil {
			return false
		}
		h, err := ReadRequestHeader(&buf)
		if err != nil || h.Op != Op(op) || h.Flags != 0 || h.PayloadLen != payloadLen {
			return false
		}
		k, tr, err := ReadKeyTrace(&buf, h)
		return err == nil && k == key && tr == trace && buf.Len() == 0
	}
	if err := quick.Check(f, nil); err != nil {
		t.Error(err)
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{OpStateGet.String(), "STATE_GET"}, {OpPipelineAttach.String(), "PIPELINE_ATTACH"}, {Op(0x0e).String(), "OP_0x0E"},
		{StatusBusy.String(), "BUSY"}, {StatusNotImplemented.String(), "NOT_IMPLEMENTED"}, {Status(0x7f).String(), "STATUS_0x7F"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// countingWriter counts Write calls, to check the one-write framing.
type countingWriter struct {
	w      io.Writer
	writes int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	return c.w.Write(p)
}
