package gguf

import (
	"bytes"
	"regexp"
	"testing"
)

// A model with overrides holds, tensor for tensor, the bytes of the model
// written at the override's type for the matched matrices and those of the
// model at Type for the rest.
func TestOverridesTakeTheOtherQuantisation(t *testing.T) {
	base := TinyMoE()
	base.Type = WeightF16
	q8 := base
	q8.Type = WeightQ8_0
	mixed := base
	experts := regexp.MustCompile(`blk\.[0-9]+\.ffn_(gate|up|down)_exps\.weight`)
	mixed.Overrides = []TypeOverride{{Pattern: experts, Type: WeightQ8_0}}

	bt, qt, mt := tensorBytes(t, base), tensorBytes(t, q8), tensorBytes(t, mixed)
	n := 0
	for name, got := range mt {
		want := bt[name]
		if experts.MatchString(name) {
			want = qt[name]
			n++
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, not those of its source", name, len(got))
		}
	}
	if n != 3*base.Layers || len(mt) != len(bt) {
		t.Fatalf("%d experts overridden of %d tensors", n, len(mt))
	}
}

func TestOverrideValidation(t *testing.T) {
	c := TinyMoE()
	c.Overrides = []TypeOverride{{Type: WeightQ8_0}}
	if err := c.Validate(); err == nil {
		t.Fatal("an override without a pattern was accepted")
	}
	c = Tiny()
	c.Embd, c.Heads, c.KVHeads = 48, 4, 2 // rows of 48 values: not whole Q4_0 blocks
	c.Overrides = []TypeOverride{{Pattern: regexp.MustCompile(`attn_q\.`), Type: WeightQ4_0}}
	if err := c.Validate(); err == nil {
		t.Fatal("rows that do not divide into blocks were accepted")
	}
}

// tensorBytes writes c and returns each tensor's bytes.
func tensorBytes(t *testing.T, c Config) map[string][]byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, c); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	out := map[string][]byte{}
	data := uint64(len(raw))
	ts := c.tensors()
	var sizes uint64
	for _, tn := range ts {
		sizes += align(tn.bytes())
	}
	data -= sizes
	var off uint64
	for _, tn := range ts {
		out[tn.name] = raw[data+off : data+off+tn.bytes()]
		off = align(off + tn.bytes())
	}
	return out
}
