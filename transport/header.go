// Package transport implements the Hydra RPC wire (framing, the state blob
// wrapper, reply meta; docs/protocol.md) and the listeners and client used to
// carry it.
package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic is the little-endian u16 that opens every request: wire bytes 59 48.
const Magic uint16 = 0x4859

// Header sizes on the wire.
const (
	RequestHeaderSize  = 16
	ResponseHeaderSize = 12
)

// MaxMetaLen is the largest meta a response header can announce (u24).
const MaxMetaLen = 1<<24 - 1

// Op is a request opcode.
type Op uint8

// Engine opcodes.
const (
	OpStateGet  Op = 0x30
	OpStatePut  Op = 0x31
	OpStateMeta Op = 0x32
	// Ours, opt-in (docs/protocol.md): a slot's state handed to another
	// engine on this host through shared memory.
	OpStateExport    Op = 0x33
	OpStateImport    Op = 0x34
	OpConfigure      Op = 0x40
	OpInfo           Op = 0x41
	OpPrefill        Op = 0x42
	OpDecode         Op = 0x43
	OpSetExpertMode  Op = 0x44
	OpSwapQuant      Op = 0x45
	OpPipelineAttach Op = 0x46
)

var opNames = map[Op]string{
	OpStateGet: "STATE_GET", OpStatePut: "STATE_PUT", OpStateMeta: "STATE_META",
	OpStateExport: "STATE_EXPORT", OpStateImport: "STATE_IMPORT",
	OpConfigure: "CONFIGURE", OpInfo: "INFO", OpPrefill: "PREFILL", OpDecode: "DECODE",
	OpSetExpertMode: "SET_EXPERT_MODE", OpSwapQuant: "SWAP_QUANT", OpPipelineAttach: "PIPELINE_ATTACH",
}

func (o Op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("OP_0x%02X", uint8(o))
}

// Status is a response status code.
type Status uint8

// Status codes (§2).
const (
	StatusOK             Status = 0x00
	StatusNotFound       Status = 0x01
	StatusError          Status = 0x02
	StatusPartial        Status = 0x03
	StatusBusy           Status = 0x04
	StatusBadRequest     Status = 0x05
	StatusNotImplemented Status = 0x06
)

var statusNames = map[Status]string{
	StatusOK: "OK", StatusNotFound: "NOT_FOUND", StatusError: "ERROR", StatusPartial: "PARTIAL",
	StatusBusy: "BUSY", StatusBadRequest: "BAD_REQUEST", StatusNotImplemented: "NOT_IMPLEMENTED",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("STATUS_0x%02X", uint8(s))
}

// ErrBadMagic is returned for a request header that does not start with Magic.
// The connection cannot be resynchronised after it: the server closes.
var ErrBadMagic = errors.New("transport: bad magic")

// RequestHeader is the fixed 16-byte request header. Body order on the wire:
// key (KeyLen bytes), trace id (TraceLen bytes), payload (PayloadLen bytes).
type RequestHeader struct {
	Op         Op
	Flags      uint8
	KeyLen     uint16
	PayloadLen uint64
	TraceLen   uint16
}

// AppendRequestHeader appends the 16-byte encoding of h to b.
func AppendRequestHeader(b []byte, h RequestHeader) []byte {
	b = binary.LittleEndian.AppendUint16(b, Magic)
	b = append(b, byte(h.Op), h.Flags)
	b = binary.LittleEndian.AppendUint16(b, h.KeyLen)
	b = binary.LittleEndian.AppendUint64(b, h.PayloadLen)
	b = binary.LittleEndian.AppendUint16(b, h.TraceLen)
	return b
}

// ParseRequestHeader decodes a 16-byte request header. It fails with ErrBadMagic
// when the magic is wrong and with an error when b is short.
func ParseRequestHeader(b []byte) (RequestHeader, error) {
	if len(b) < RequestHeaderSize {
		return RequestHeader{}, fmt.Errorf("transport: request header needs %d bytes, have %d", RequestHeaderSize, len(b))
	}
	if binary.LittleEndian.Uint16(b[0:2]) != Magic {
		return RequestHeader{}, ErrBadMagic
	}
	return RequestHeader{
		Op:         Op(b[2]),
		Flags:      b[3],
		KeyLen:     binary.LittleEndian.Uint16(b[4:6]),
		PayloadLen: binary.LittleEndian.Uint64(b[6:14]),
		TraceLen:   binary.LittleEndian.Uint16(b[14:16]),
	}, nil
}

// ResponseHeader is the fixed 12-byte response header: status, a 24-bit meta
// length, a 64-bit payload length. Body order: meta (JSON), payload.
type ResponseHeader struct {
	Status     Status
	MetaLen    uint32
	PayloadLen uint64
}

// AppendResponseHeader appends the 12-byte encoding of h to b. MetaLen must not
// exceed MaxMetaLen; callers check it (see CheckMetaLen).
func AppendResponseHeader(b []byte, h ResponseHeader) []byte {
	b = append(b, byte(h.Status), byte(h.MetaLen), byte(h.MetaLen>>8), byte(h.MetaLen>>16))
	return binary.LittleEndian.AppendUint64(b, h.PayloadLen)
}

// ParseResponseHeader decodes a 12-byte response header.
func ParseResponseHeader(b []byte) (ResponseHeader, error) {
	if len(b) < ResponseHeaderSize {
		return ResponseHeader{}, fmt.Errorf("transport: response header needs %d bytes, have %d", ResponseHeaderSize, len(b))
	}
	return ResponseHeader{
		Status:     Status(b[0]),
		MetaLen:    uint32(b[1]) | uint32(b[2])<<8 | uint32(b[3])<<16,
		PayloadLen: binary.LittleEndian.Uint64(b[4:12]),
	}, nil
}

// CheckMetaLen reports whether n bytes of meta fit a response header.
func CheckMetaLen(n int) error {
	if n < 0 || n > MaxMetaLen {
		return fmt.Errorf("transport: meta of %d bytes exceeds the 24-bit limit", n)
	}
	return nil
}
