package gguf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func writeParsed(t *testing.T, c Config) *parsedFile {
	t.Helper()
	var b bytes.Buffer
	if err := Write(&b, c); err != nil {
		t.Fatal(err)
	}
	f, err := parseGGUF(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *parsedFile) tensor(t *testing.T, name string) parsedTensor {
	t.Helper()
	for _, ts := range f.tensors {
		if ts.name == name {
			return ts
		}
	}
	t.Fatalf("no tensor %s", name)
	return parsedTensor{}
}

// Known blocks, worked by hand from ggml's reference quantizers.
func TestQuantizeKnownBlocks(t *testing.T) {
	x := make([]float32, blockValues)
	x[0], x[1], x[2] = 1, -0.5, 0.25
	q8 := quantizeQ8_0(nil, x)
	if len(q8) != q8Block || binary.LittleEndian.Uint16(q8) != f16(1.0/127) {
		t.Fatalf("q8_0 scale: % x", q8[:2])
	}
	// -0.5 × 127 = -63.5 rounds away from zero, as roundf does.
	if int8(q8[2]) != 127 || int8(q8[3]) != -64 || int8(q8[4]) != 32 || q8[5] != 0 {
		t.Fatalf("q8_0 quants % d", q8[2:6])
	}

	x = make([]float32, blockValues)
	x[0], x[1], x[16], x[17] = -2, 1, 2, -0.125
	q4 := quantizeQ4_0(nil, x)
	// The first value of largest magnitude sets d = -2 / -8 = 0.25.
	if len(q4) != q4Block || binary.LittleEndian.Uint16(q4) != f16(0.25) {
		t.Fatalf("q4_0 scale: % x", q4[:2])
	}
	// -2 → 0; 1 → trunc(12.5) = 12; 2 → trunc(16.5) = 16, clamped to 15;
	// -0.125 → trunc(8) = 8; zeros → 8. Value j+16 is byte j's high nibble.
	if q4[2] != 0x0|15<<4 || q4[3] != 12|8<<4 || q4[4] != 8|8<<4 {
		t.Fatalf("q4_0 nibbles % x", q4[2:5])
	}

	zero := make([]float32, blockValues)
	for _, b := range [][]byte{quantizeQ8_0(nil, zero), quantizeQ4_0(nil, zero)} {
		for _, v := range decodeBlock(b) {
			if v != 0 {
				t.Fatalf("a zero block decodes to %v", v)
			}
		}
	}
}

func decodeBlock(b []byte) []float32 {
	if len(b) == q8Block {
		return decodeQ8_0(b)
	}
	return decodeQ4_0(b)
}

// Random blocks decode within the format's error: half a step for Q8_0
// (plus the F16 rounding of d), one step for Q4_0, whose quants stop at 7
// on the side opposite the value that set d.
func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		x := make([]float32, blockValues)
		scale := float32(math.Ldexp(1, r.IntN(12)-6)) // d stays a normal F16 (a subnormal d loses precision)
		for i := range x {
			x[i] = (r.Float32()*2 - 1) * scale
		}
		if trial%7 == 0 {
			x[r.IntN(blockValues)] = 0
		}
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		for _, q := range []struct {
			name  string
			enc   func([]byte, []float32) []byte
			bound float64 // in units of the block's largest magnitude
		}{
			{"q8_0", quantizeQ8_0, 0.5/127 + 1e-3},
			{"q4_0", quantizeQ4_0, 1.0/8 + 1e-3},
		} {
			got := decodeBlock(q.enc(nil, x))
			for i := range x {
				if d := math.Abs(float64(got[i] - x[i])); d > q.bound*float64(amax) {
					t.Fatalf("%s trial %d: value %d is %v, decoded %v (error %.3g of max %v)", q.name, trial, i, x[i], got[i], d, amax)
				}
			}
		}
	}
}

func TestParseWeightType(t *testing.T) {
	for s, want := range map[string]WeightType{"f32": WeightF32, "F16": WeightF16, "q8_0": WeightQ8_0, "Q4_0": WeightQ4_0} {
		if got, err := ParseWeightType(s); err != nil || got != want || !strings.EqualFold(got.String(), s) {
			t.Errorf("%q: %v, %v", s, got, err)
		}
	}
	if _, err := ParseWeightType("q4_k"); err == nil || !strings.Contains(err.Error(), "f32, f16, q8_0, q4_0") {
		t.Errorf("q4_k: %v", err)
	}
}

// A qwen3moe model has the tensors and hyperparameters llama.cpp's loader
// asks for (llama-model.cpp, LLM_ARCH_QWEN3MOE), each at its shape.
func TestQwen3MoEWellFormed(t *testing.T) {
	c := TinyMoE()
	f := writeParsed(t, c)
	for key, want := range map[string]any{
		"general.architecture":                "qwen3moe",
		"general.file_type":                   uint32(0),
		"qwen3moe.block_count":                uint32(c.Layers),
		"qwen3moe.expert_count":               uint32(c.Experts),
		"qwen3moe.expert_used_count":          uint32(c.ExpertsUsed),
		"qwen3moe.expert_feed_forward_length": uint32(c.ExpertFF),
		"qwen3moe.rope.dimension_count":       uint32(c.HeadDim()),
		"qwen3moe.attention.head_count_kv":    uint32(c.KVHeads),
	} {
		if f.kv[key] != want {
			t.Errorf("%s = %v, want %v", key, f.kv[key], want)
		}
	}
	hd, kv, ff, e := c.HeadDim(), c.KVHeads*c.HeadDim(), c.ExpertFF, c.Experts
	want := map[string][]int{
		"token_embd.weight": {c.Embd, c.Vocab}, "output_norm.weight": {c.Embd}, "output.weight": {c.Embd, c.Vocab},
	}
	for i := range c.Layers {
		for name, dims := range map[string][]int{
			"attn_norm": {c.Embd}, "attn_q": {c.Embd, c.Embd}, "attn_k": {c.Embd, kv}, "attn_v": {c.Embd, kv},
			"attn_output": {c.Embd, c.Embd}, "attn_q_norm": {hd}, "attn_k_norm": {hd}, "ffn_norm": {c.Embd},
			"ffn_gate_inp": {c.Embd, e}, "ffn_gate_exps": {c.Embd, ff, e}, "ffn_down_exps": {ff, c.Embd, e},
			"ffn_up_exps": {c.Embd, ff, e},
		} {
			want[fmt.Sprintf("blk.%d.%s.weight", i, name)] = dims
		}
	}
	if len(f.tensors) != len(want) {
		t.Fatalf("%d tensors, want %d", len(f.tensors), len(want))
	}
	for _, ts := range f.tensors {
		if !slices.Equal(ts.dims, want[ts.name]) || ts.typ != typeF32 {
			t.Errorf("%s: dims %v type %d, want %v F32", ts.name, ts.dims, ts.typ, want[ts.name])
		}
	}
}

// A llama model with experts has Mixtral's layout: experts FF wide, under
// the llama prefix, no per-head norms.
func TestLlamaExperts(t *testing.T) {
	c := Tiny()
	c.Experts, c.ExpertsUsed = 4, 2
	f := writeParsed(t, c)
	if f.kv["llama.expert_count"] != uint32(4) || f.kv["llama.expert_used_count"] != uint32(2) || f.kv["llama.feed_forward_length"] != uint32(c.FF) {
		t.Fatalf("metadata %v", f.kv)
	}
	if d := f.tensor(t, "blk.1.ffn_down_exps.weight").dims; !slices.Equal(d, []int{c.FF, c.Embd, 4}) {
		t.Fatalf("down experts %v", d)
	}
	for _, ts := range f.tensors {
		if strings.Contains(ts.name, "_norm.weight") && strings.Contains(ts.name, "attn_q") || ts.name == "blk.0.ffn_up.weight" {
			t.Errorf("a llama MoE model has %s", ts.name)
		}
	}
}

// One seed and one set of shapes are the same model at every weight type:
// each tensor decodes to the F32 model's values within its type's error,
// and the norms and routers are F32 and identical in all.
func TestTypesAreOneModel(t *testing.T) {
	base := TinyMoE()
	ref := writeParsed(t, base)
	for _, wt := range []WeightType{WeightF16, WeightQ8_0, WeightQ4_0} {
		c := base
		c.Type = wt
		f := writeParsed(t, c)
		if f.kv["general.file_type"] != wt.fileType() || len(f.tensors) != len(ref.tensors) {
			t.Fatalf("%s: file type %v, %d tensors", wt, f.kv["general.file_type"], len(f.tensors))
		}
		for i, ts := range f.tensors {
			r := ref.tensors[i]
			small := len(ts.dims) == 1 || strings.HasSuffix(ts.name, "ffn_gate_inp.weight")
			switch {
			case ts.name != r.name || !slices.Equal(ts.dims, r.dims):
				t.Fatalf("%s: tensor %d is %s %v, want %s %v", wt, i, ts.name, ts.dims, r.name, r.dims)
			case small && (ts.typ != typeF32 || !bytes.Equal(ts.data, r.data)):
				t.Errorf("%s: %s is not the F32 model's", wt, ts.name)
			case !small && ts.typ != wt.ggmlType():
				t.Errorf("%s: %s has type %d", wt, ts.name, ts.typ)
			case !small:
				checkClose(t, wt, ts.name, ts.decode(), r.decode())
			}
		}
	}
}

// checkClose compares decoded values block by block: F16 to a relative
// 2^-11, the quantized types as TestQuantizeRoundTrip bounds them.
func checkClose(t *testing.T, wt WeightType, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s %s: %d values, want %d", wt, name, len(got), len(want))
	}
	for b := 0; b < len(want); b += blockValues {
		var amax float64
		for _, v := range want[b : b+blockValues] {
			amax = max(amax, math.Abs(float64(v)))
		}
		bound := map[WeightType]float64{WeightQ8_0: 0.5/127 + 1e-3, WeightQ4_0: 1.0/8 + 1e-3}[wt] * amax
		for i := b; i < b+blockValues; i++ {
			if wt == WeightF16 {
				bound = math.Abs(float64(want[i]))*math.Ldexp(1, -11) + 1e-7
			}
			if d := math.Abs(float64(got[i] - want[i])); d > bound {
				t.Fatalf("%s %s value %d: %v, want %v (error %.3g > %.3g)", wt, name, i, got[i], want[i], d, bound)
			}
		}
	}
}

func TestValidateExperts(t *testing.T) {
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.Experts = 0 }, "needs experts"},
		{func(c *Config) { c.ExpertsUsed = 5 }, "experts used 5 out of range [1, experts 4]"},
		{func(c *Config) { c.ExpertsUsed = 0 }, "experts used 0"},
		{func(c *Config) { c.Experts, c.ExpertsUsed = 513, 1 }, "experts 513 out of range [1, 512]"},
		{func(c *Config) { c.ExpertFF = 0 }, "expert ff 0"},
		{func(c *Config) { c.Arch = "mixtral" }, `architecture "mixtral"`},
		{func(c *Config) { c.ExpertFF, c.Type = 48, WeightQ4_0 }, "ffn_down_exps.weight rows of 48 values do not divide into q4_0 blocks of 32"},
		{func(c *Config) { c.Type, c.F16 = WeightQ8_0, true }, "contradict"},
		{func(c *Config) { c.Type = 9 }, "weight type 9 unknown"},
		{func(c *Config) { c.Arch, c.ExpertFF = ArchLlama, 64 }, "must be 0 or ff"},
		{func(c *Config) { c.Arch, c.Experts, c.ExpertFF = ArchLlama, 0, 0 }, "experts 0 out of range [1, 512]"},
	} {
		c := TinyMoE()
		tc.mut(&c)
		if err := Write(&bytes.Buffer{}, c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", c, err, tc.want)
		}
	}
	c := Tiny()
	c.Type = WeightQ8_0
	if err := c.Validate(); err != nil {
		t.Errorf("Tiny at q8_0: %v", err)
	}
}
