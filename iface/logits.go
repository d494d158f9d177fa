package iface

import (
	"encoding/binary"
	"math"
)

// Logits after a state's bytes are n_vocab little-endian f32, as a PREFILL
// blob carries them and a StatePut adopts them; AppendLogits and
// ParseLogits are that encoding, for the host and the backends alike.

// AppendLogits appends logits to dst in the blob's encoding.
func AppendLogits(dst []byte, logits []float32) []byte {
	for _, f := range logits {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
	}
	return dst
}

// ParseLogits reads logits in the blob's encoding; a trailing partial value
// is not one.
func ParseLogits(raw []byte) []float32 {
	logits := make([]float32, len(raw)/4)
	for j := range logits {
		logits[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
	}
	return logits
}
