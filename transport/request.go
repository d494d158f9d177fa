package transport

import (
	"fmt"
	"io"
	"math"
	"slices"
)

// ReadRequestHeader reads and decodes one 16-byte request header. It returns
// io.EOF when r ends before the first byte (a client closing an idle
// connection), io.ErrUnexpectedEOF when it ends inside the header and
// ErrBadMagic when the header does not start with Magic.
func ReadRequestHeader(r io.Reader) (RequestHeader, error) {
	var b [RequestHeaderSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return RequestHeader{}, err
	}
	return ParseRequestHeader(b[:])
}

// ReadKeyTrace reads the key and trace id that follow header h, in one read.
// The payload is left in r.
func ReadKeyTrace(r io.Reader, h RequestHeader) (key, trace string, err error) {
	n := int(h.KeyLen) + int(h.TraceLen)
	if n == 0 {
		return "", "", nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", "", noEOF(err)
	}
	return string(b[:h.KeyLen]), string(b[h.KeyLen:]), nil
}

// ReadResponseHeader reads and decodes one 12-byte response header, with the
// same EOF conventions as ReadRequestHeader.
func ReadResponseHeader(r io.Reader) (ResponseHeader, error) {
	var b [ResponseHeaderSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return ResponseHeader{}, err
	}
	return ParseResponseHeader(b[:])
}

// WriteRequest writes a request header followed by key and trace in a single
// Write, so small requests go out in one segment. The payloadLen payload bytes
// are the caller's to write next.
func WriteRequest(w io.Writer, op Op, key, trace string, payloadLen uint64) error {
	b, err := appendRequest(nil, op, key, trace, payloadLen)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// appendRequest appends header, key and trace to b.
func appendRequest(b []byte, op Op, key, trace string, payloadLen uint64) ([]byte, error) {
	if len(key) > math.MaxUint16 {
		return b, fmt.Errorf("transport: key of %d bytes exceeds the 16-bit limit", len(key))
	}
	if len(trace) > math.MaxUint16 {
		return b, fmt.Errorf("transport: trace id of %d bytes exceeds the 16-bit limit", len(trace))
	}
	b = slices.Grow(b, RequestHeaderSize+len(key)+len(trace))
	b = AppendRequestHeader(b, RequestHeader{
		Op:         op,
		KeyLen:     uint16(len(key)),
		PayloadLen: payloadLen,
		TraceLen:   uint16(len(trace)),
	})
	b = append(b, key...)
	return append(b, trace...), nil
}

// WriteResponseHeader writes a response header followed by meta in a single
// Write. The payloadLen payload bytes are the caller's to write next.
func WriteResponseHeader(w io.Writer, status Status, meta []byte, payloadLen uint64) error {
	if err := CheckMetaLen(len(meta)); err != nil {
		return err
	}
	b := make([]byte, 0, ResponseHeaderSize+len(meta))
	b = AppendResponseHeader(b, ResponseHeader{Status: status, MetaLen: uint32(len(meta)), PayloadLen: payloadLen})
	b = append(b, meta...)
	_, err := w.Write(b)
	return err
}

// noEOF turns io.EOF into io.ErrUnexpectedEOF for reads that started a frame.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
