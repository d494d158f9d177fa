package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// WeightType is the ggml type of a model's big matrices (embeddings, output
// head, attention, feed-forward and expert weights); norms and the MoE
// router stay F32, as llama.cpp's quantize keeps them.
type WeightType int

// The weight types gguf writes.
const (
	WeightF32 WeightType = iota
	WeightF16
	WeightQ8_0
	WeightQ4_0
)

var weightTypeNames = []string{"f32", "f16", "q8_0", "q4_0"}

func (w WeightType) String() string {
	if w < 0 || int(w) >= len(weightTypeNames) {
		return fmt.Sprintf("WeightType(%d)", int(w))
	}
	return weightTypeNames[w]
}

// ParseWeightType reads f32, f16, q8_0 or q4_0 (any case).
func ParseWeightType(s string) (WeightType, error) {
	for i, n := range weightTypeNames {
		if strings.EqualFold(s, n) {
			return WeightType(i), nil
		}
	}
	return 0, fmt.Errorf("gguf: weight type %q: want one of %s", s, strings.Join(weightTypeNames, ", "))
}

// ggmlType is the tensor type id ggml gives the weight type.
func (w WeightType) ggmlType() ggmlType {
	switch w {
	case WeightF16:
		return typeF16
	case WeightQ8_0:
		return typeQ8_0
	case WeightQ4_0:
		return typeQ4_0
	}
	return typeF32
}

// fileType is llama_ftype's value for a model whose big matrices are w.
func (w WeightType) fileType() uint32 {
	switch w {
	case WeightF16:
		return 1 // LLAMA_FTYPE_MOSTLY_F16
	case WeightQ8_0:
		return 7 // LLAMA_FTYPE_MOSTLY_Q8_0
	case WeightQ4_0:
		return 2 // LLAMA_FTYPE_MOSTLY_Q4_0
	}
	return 0 // LLAMA_FTYPE_ALL_F32
}

// quantized reports whether rows must come in whole blocks of blockValues.
func (w WeightType) quantized() bool { return w == WeightQ8_0 || w == WeightQ4_0 }

// Block formats of ggml-common.h: 32 values share one F16 scale.
const (
	blockValues = 32
	q8Block     = 2 + blockValues   // block_q8_0: d, then 32 int8 quants
	q4Block     = 2 + blockValues/2 // block_q4_0: d, then 16 bytes of two 4-bit quants each
)

// quantizeQ8_0 appends the block_q8_0 of 32 values, as ggml's reference
// quantize_row_q8_0_ref does: d = max|x|/127, each quant round(x/d) with
// halves away from zero, every step in float32 so the bytes match ggml's.
func quantizeQ8_0(dst []byte, x []float32) []byte {
	var amax float32
	for _, v := range x[:blockValues] {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	dst = binary.LittleEndian.AppendUint16(dst, f16(d))
	for _, v := range x[:blockValues] {
		dst = append(dst, byte(int8(math.Round(float64(float32(v*id))))))
	}
	return dst
}

// quantizeQ4_0 appends the block_q4_0 of 32 values, as ggml's reference
// quantize_row_q4_0_ref does: d = m/-8 for the value m of largest magnitude
// (the first one on a tie), quants min(15, trunc(x/d + 8.5)), the low
// nibble of byte j holding value j and the high nibble value j+16.
func quantizeQ4_0(dst []byte, x []float32) []byte {
	var amax, m float32
	for _, v := range x[:blockValues] {
		if a := float32(math.Abs(float64(v))); amax < a {
			amax, m = a, v
		}
	}
	d := m / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	dst = binary.LittleEndian.AppendUint16(dst, f16(d))
	q := func(v float32) byte { return byte(min(15, int8(float32(float32(v*id)+8.5)))) }
	for j := range blockValues / 2 {
		dst = append(dst, q(x[j])|q(x[j+blockValues/2])<<4)
	}
	return dst
}

// encodeValues appends x in type t; for the quantized types len(x) is a
// multiple of blockValues.
func encodeValues(dst []byte, t ggmlType, x []float32) []byte {
	switch t {
	case typeF16:
		for _, v := range x {
			dst = binary.LittleEndian.AppendUint16(dst, f16(v))
		}
	case typeQ8_0:
		for i := 0; i < len(x); i += blockValues {
			dst = quantizeQ8_0(dst, x[i:])
		}
	case typeQ4_0:
		for i := 0; i < len(x); i += blockValues {
			dst = quantizeQ4_0(dst, x[i:])
		}
	default:
		for _, v := range x {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	}
	return dst
}

// typeBytes is the size of n values of type t.
func typeBytes(t ggmlType, n int) uint64 {
	switch t {
	case typeF16:
		return uint64(n) * 2
	case typeQ8_0:
		return uint64(n/blockValues) * q8Block
	case typeQ4_0:
		return uint64(n/blockValues) * q4Block
	}
	return uint64(n) * 4
}
