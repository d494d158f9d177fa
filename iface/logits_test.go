package iface

import (
	"math"
	"slices"
	"testing"
)

func TestLogitsRoundTrip(t *testing.T) {
	in := []float32{0, -1.5, 3.25e10, float32(math.Inf(-1)), math.SmallestNonzeroFloat32}
	raw := AppendLogits([]byte{9}, in)
	if len(raw) != 1+4*len(in) || raw[0] != 9 || raw[1+4] != 0x00 || raw[1+7] != 0xbf {
		t.Fatalf("encoding % x", raw)
	}
	if out := ParseLogits(raw[1:]); !slices.Equal(out, in) {
		t.Fatalf("%v, want %v", out, in)
	}
	if out := ParseLogits(raw[1:7]); len(out) != 1 || out[0] != 0 {
		t.Fatalf("a partial value: %v", out)
	}
}
