package gguf

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
)

func TestF16(t *testing.T) {
	for _, tc := range []struct {
		f float32
		h uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {0.5, 0x3800}, {0.1, 0x2e66}, {65504, 0x7bff}, {1e6, 0x7c00},
		{6.103515625e-05, 0x0400}, {5.960464477539063e-08, 0x0001}, {1e-9, 0}, {1.00048828125, 0x3c00}, // a tie rounds to even
		{1.00146484375, 0x3c02}, {-3.0517578125e-05, 0x8200},
	} {
		if got := f16(tc.f); got != tc.h {
			t.Errorf("f16(%g) = %#04x, want %#04x", tc.f, got, tc.h)
		}
	}
}

func TestVocab(t *testing.T) {
	for _, size := range []int{MinVocab, 300, 512, 5000} {
		p, ty := Vocab(size)
		if len(p) != size || len(ty) != size {
			t.Fatalf("Vocab(%d): %d pieces, %d types", size, len(p), len(ty))
		}
		seen := map[string]bool{}
		for _, s := range p {
			if seen[s] || s == "" {
				t.Fatalf("Vocab(%d): piece %q repeated or empty", size, s)
			}
			seen[s] = true
		}
		if p[TokIMEnd] != "<|im_end|>" || p[firstByte+'\n'] != "<0x0A>" {
			t.Fatal("special or byte token misplaced")
		}
	}
}

func TestWriteDeterministicAndWellFormed(t *testing.T) {
	c := Tiny()
	var a, b bytes.Buffer
	if err := Write(&a, c); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, c); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two writes of one config differ")
	}
	d := a.Bytes()
	if binary.LittleEndian.Uint32(d) != ggufMagic || binary.LittleEndian.Uint32(d[4:]) != ggufVersion {
		t.Fatal("bad header")
	}
	nt, nkv := binary.LittleEndian.Uint64(d[8:]), binary.LittleEndian.Uint64(d[16:])
	if nt != uint64(3+9*c.Layers) || nkv != uint64(len(c.metadata())) {
		t.Fatalf("%d tensors, %d keys", nt, nkv)
	}
	// The data section ends the file; its size is the tensors' aligned sizes.
	var data uint64
	for _, ts := range c.tensors() {
		data += align(ts.bytes())
	}
	if uint64(len(d))%alignment != 0 || uint64(len(d)) < data {
		t.Fatalf("file of %d bytes for %d bytes of aligned tensors", len(d), data)
	}
	c.Seed++
	var o bytes.Buffer
	if err := Write(&o, c); err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(o.Bytes()) == sha256.Sum256(d) {
		t.Fatal("the seed does not change the weights")
	}
	c.F16 = true
	o.Reset()
	if err := Write(&o, c); err != nil || o.Len() >= len(d) {
		t.Fatalf("F16 model of %d bytes (F32 %d): %v", o.Len(), len(d), err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.Vocab = 100 }, "vocab"},
		{func(c *Config) { c.Heads = 3 }, "multiple of heads"},
		{func(c *Config) { c.KVHeads = 3 }, "multiple of kv heads"},
		{func(c *Config) { c.Layers = 0 }, "layers"},
		{func(c *Config) { c.Embd, c.Heads, c.KVHeads = 12, 4, 4 }, "even"},
	} {
		c := Tiny()
		tc.mut(&c)
		if err := Write(&bytes.Buffer{}, c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", c, err, tc.want)
		}
	}
}

// The dense llama models keep the bytes they had before experts and
// quantized types came: benchmarks and model hashes refer to them.
func TestDenseModelsUnchanged(t *testing.T) {
	for f16, want := range map[bool]string{
		false: "21ec3ba0b308afd57bc81af93e6daa1e98eb1c19fcf4e56da3c8fa78539e11cf",
		true:  "19f123c0b7550a0a9358831ef0166f3f61d133ce642306447012600e11ba2f00",
	} {
		c := Tiny()
		c.F16 = f16
		var b bytes.Buffer
		if err := Write(&b, c); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(b.Bytes())); got != want {
			t.Errorf("Tiny (F16 %v): sha256 %s, want %s", f16, got, want)
		}
	}
}
