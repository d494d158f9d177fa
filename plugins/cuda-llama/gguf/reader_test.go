package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// A minimal GGUF reader for the tests: the header, every metadata value
// type of docs/gguf.md, the tensor infos and the data section. It trusts
// nothing: every length is checked against what is left of the file.

type parsedTensor struct {
	name   string
	dims   []int
	typ    ggmlType
	offset uint64
	data   []byte
}

type parsedFile struct {
	kv      map[string]any
	tensors []parsedTensor
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)-r.off) {
		r.err = fmt.Errorf("truncated at offset %d (want %d more bytes)", r.off, n)
		return nil
	}
	p := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return p
}

func (r *reader) u8() uint8 {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (r *reader) str() string { return string(r.take(r.u64())) }

// value reads one metadata value of GGUF type vt.
func (r *reader) value(vt uint32) any {
	switch vt {
	case 0, 1, 7: // uint8, int8, bool
		b := r.u8()
		if vt == 7 {
			return b != 0
		}
		return b
	case 2, 3: // uint16, int16
		return binary.LittleEndian.Uint16(r.take(2))
	case vtUint32:
		return r.u32()
	case vtInt32:
		return int32(r.u32())
	case vtFloat32:
		return math.Float32frombits(r.u32())
	case vtString:
		return r.str()
	case vtArray:
		et, n := r.u32(), r.u64()
		if n > uint64(len(r.b)) {
			r.err = fmt.Errorf("array of %d elements in a file of %d bytes", n, len(r.b))
			return nil
		}
		out := make([]any, 0, n)
		for range n {
			out = append(out, r.value(et))
		}
		return out
	case 10, 11, 12: // uint64, int64, float64
		return r.u64()
	}
	r.err = fmt.Errorf("unknown value type %d", vt)
	return nil
}

// parseGGUF reads a whole file written by Write.
func parseGGUF(b []byte) (*parsedFile, error) {
	r := &reader{b: b}
	if r.u32() != ggufMagic || r.u32() != ggufVersion {
		return nil, errors.New("not a GGUF v3 file")
	}
	nt, nkv := r.u64(), r.u64()
	f := &parsedFile{kv: map[string]any{}}
	for range nkv {
		key := r.str()
		f.kv[key] = r.value(r.u32())
	}
	for range nt {
		t := parsedTensor{name: r.str()}
		for range r.u32() {
			t.dims = append(t.dims, int(r.u64()))
		}
		t.typ, t.offset = ggmlType(r.u32()), r.u64()
		f.tensors = append(f.tensors, t)
	}
	if r.err != nil {
		return nil, r.err
	}
	align := uint64(alignment)
	if a, ok := f.kv["general.alignment"].(uint32); ok {
		align = uint64(a)
	}
	start := (uint64(r.off) + align - 1) / align * align
	for i := range f.tensors {
		t := &f.tensors[i]
		n := 1
		for _, d := range t.dims {
			n *= d
		}
		size := typeBytes(t.typ, n)
		if t.offset%align != 0 || start+t.offset+size > uint64(len(b)) {
			return nil, fmt.Errorf("tensor %s: %d bytes at offset %d do not fit an aligned file of %d bytes", t.name, size, t.offset, len(b))
		}
		t.data = b[start+t.offset : start+t.offset+size]
	}
	return f, nil
}

// decode is a tensor's values as float32, each type decoded as ggml's
// dequantize_row_* does.
func (t parsedTensor) decode() []float32 {
	var out []float32
	switch t.typ {
	case typeF32:
		for i := 0; i < len(t.data); i += 4 {
			out = append(out, math.Float32frombits(binary.LittleEndian.Uint32(t.data[i:])))
		}
	case typeF16:
		for i := 0; i < len(t.data); i += 2 {
			out = append(out, halfToFloat(binary.LittleEndian.Uint16(t.data[i:])))
		}
	case typeQ8_0:
		for i := 0; i < len(t.data); i += q8Block {
			out = append(out, decodeQ8_0(t.data[i:i+q8Block])...)
		}
	case typeQ4_0:
		for i := 0; i < len(t.data); i += q4Block {
			out = append(out, decodeQ4_0(t.data[i:i+q4Block])...)
		}
	}
	return out
}

// decodeQ8_0 decodes one block_q8_0: quant × d.
func decodeQ8_0(b []byte) []float32 {
	d := halfToFloat(binary.LittleEndian.Uint16(b))
	out := make([]float32, blockValues)
	for j := range out {
		out[j] = float32(int8(b[2+j])) * d
	}
	return out
}

// decodeQ4_0 decodes one block_q4_0: (nibble - 8) × d, low nibbles first.
func decodeQ4_0(b []byte) []float32 {
	d := halfToFloat(binary.LittleEndian.Uint16(b))
	out := make([]float32, blockValues)
	for j := range blockValues / 2 {
		out[j] = float32(int(b[2+j]&0x0f)-8) * d
		out[j+blockValues/2] = float32(int(b[2+j]>>4)-8) * d
	}
	return out
}

// halfToFloat widens an IEEE half, subnormals included.
func halfToFloat(h uint16) float32 {
	sign := float32(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, mant := int(h>>10&0x1f), float64(h&0x3ff)
	switch exp {
	case 0:
		return sign * float32(math.Ldexp(mant, -24))
	case 31:
		if mant != 0 {
			return float32(math.NaN())
		}
		return sign * float32(math.Inf(1))
	}
	return sign * float32(math.Ldexp(1024+mant, exp-25))
}
