package transport

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DecodeFrameSize is the wire size of one DECODE token frame.
const DecodeFrameSize = 9

// DecodeFlagFinal marks the last frame of a DECODE reply.
const DecodeFlagFinal = 0x01

// DecodeFrame is one generated token of a DECODE reply payload:
// [u32 token_id LE][f32 logprob LE][u8 flags], flags bit 0 = final.
type DecodeFrame struct {
	TokenID uint32
	Logprob float32
	Final   bool
}

// DecodeMeta is the meta JSON of a DECODE reply.
type DecodeMeta struct {
	TokensGenerated int    `json:"tokens_generated"`
	NPast           int    `json:"n_past"`
	StopReason      string `json:"stop_reason"` // "eos", "length" or "n_tokens_limit"
	Text            string `json:"text"`
}

// AppendDecodeFrame appends the 9-byte encoding of f to b.
func AppendDecodeFrame(b []byte, f DecodeFrame) []byte {
	b = binary.LittleEndian.AppendUint32(b, f.TokenID)
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f.Logprob))
	var flags byte
	if f.Final {
		flags = DecodeFlagFinal
	}
	return append(b, flags)
}

// ParseDecodeFrames decodes a DECODE reply payload. Flag bits other than
// DecodeFlagFinal are reserved and ignored, so newer servers can add some.
func ParseDecodeFrames(b []byte) ([]DecodeFrame, error) {
	if len(b)%DecodeFrameSize != 0 {
		return nil, fmt.Errorf("transport: decode payload of %d bytes is not a whole number of %d-byte frames", len(b), DecodeFrameSize)
	}
	frames := make([]DecodeFrame, 0, len(b)/DecodeFrameSize)
	for ; len(b) > 0; b = b[DecodeFrameSize:] {
		frames = append(frames, DecodeFrame{
			TokenID: binary.LittleEndian.Uint32(b[0:4]),
			Logprob: math.Float32frombits(binary.LittleEndian.Uint32(b[4:8])),
			Final:   b[8]&DecodeFlagFinal != 0,
		})
	}
	return frames, nil
}
