// Package gguf writes small llama-architecture GGUF models with deterministic
// random weights and a minimal SentencePiece-style vocabulary, so that tests
// and benchmarks of the llama.cpp backend need no download. The models are
// well-formed for llama.cpp (they load, tokenize, apply a ChatML template and
// decode) but know no language: with random weights greedy decoding soon
// repeats itself.
//
// Only what the llama architecture needs is written (GGUF v3, F32 or F16
// tensors); the format is documented in ggml's docs/gguf.md.
package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
)

// Config sizes a model.
type Config struct {
	Name    string // general.name
	Layers  int    // transformer blocks
	Embd    int    // embedding width (n_embd)
	Heads   int    // attention heads; Embd must be a multiple
	KVHeads int    // KV heads (GQA); Heads must be a multiple
	FF      int    // feed-forward width
	Vocab   int    // vocabulary size, at least MinVocab
	Ctx     int    // training context length (llama.context_length)
	F16     bool   // F16 weights (F32 otherwise); norms stay F32
	Seed    uint64 // weights are a function of Seed and the tensor's name
}

// Tiny is the model the tests use: a few hundred kilobytes, milliseconds per
// token on one CPU core, yet a real GQA llama with every tensor a full model
// has.
func Tiny() Config {
	return Config{Name: "hydra-tiny", Layers: 2, Embd: 64, Heads: 4, KVHeads: 2, FF: 128, Vocab: 512, Ctx: 4096, Seed: 1}
}

// Special token ids of the generated vocabulary.
const (
	TokUnk      = 0
	TokBOS      = 1
	TokEOS      = 2
	TokIMStart  = 3 // <|im_start|>, ChatML
	TokIMEnd    = 4 // <|im_end|>, ChatML's end of turn (an end-of-generation token)
	firstByte   = 5 // <0x00>…<0xFF> follow
	nSpecial    = firstByte
	MinVocab    = nSpecial + 256
	maxVocab    = 1 << 20
	maxDim      = 1 << 16
	maxLayers   = 1024
	alignment   = 32
	ggufMagic   = 0x46554747 // "GGUF"
	ggufVersion = 3
)

// ChatTemplate is the ChatML template written into tokenizer.chat_template;
// llama.cpp recognises it by its <|im_start|> marker.
const ChatTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Validate checks that the sizes make a model llama.cpp accepts.
func (c Config) Validate() error {
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"layers", c.Layers, maxLayers}, {"embd", c.Embd, maxDim}, {"heads", c.Heads, maxDim},
		{"kv heads", c.KVHeads, maxDim}, {"ff", c.FF, 4 * maxDim}, {"ctx", c.Ctx, 1 << 24},
	} {
		if f.v < 1 || f.v > f.max {
			return fmt.Errorf("gguf: %s %d out of range [1, %d]", f.name, f.v, f.max)
		}
	}
	switch {
	case c.Vocab < MinVocab || c.Vocab > maxVocab:
		return fmt.Errorf("gguf: vocab %d out of range [%d, %d] (specials and 256 byte tokens come first)", c.Vocab, MinVocab, maxVocab)
	case c.Embd%c.Heads != 0:
		return fmt.Errorf("gguf: embd %d is not a multiple of heads %d", c.Embd, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("gguf: heads %d is not a multiple of kv heads %d", c.Heads, c.KVHeads)
	case (c.Embd/c.Heads)%2 != 0:
		return fmt.Errorf("gguf: head size %d must be even (RoPE rotates pairs)", c.Embd/c.Heads)
	}
	return nil
}

// HeadDim is the size of one attention head.
func (c Config) HeadDim() int { return c.Embd / c.Heads }

// KVBytesPerToken is the KV cache a token takes with an F16 cache: K and V,
// KVHeads × HeadDim values each, in every layer.
func (c Config) KVBytesPerToken() int { return c.Layers * 2 * c.KVHeads * c.HeadDim() * 2 }

// WriteFile writes the model to path (through a temporary file, so a reader
// never sees a partial model).
func WriteFile(path string, c Config) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := Write(f, c); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// Write writes the model. The same Config always gives the same bytes.
func Write(w io.Writer, c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	e := &enc{w: bw}
	tensors := c.tensors()
	kv := c.metadata()

	e.u32(ggufMagic)
	e.u32(ggufVersion)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kv)))
	for _, p := range kv {
		e.str(p.key)
		e.value(p.val)
	}
	var off uint64
	for _, t := range tensors {
		e.str(t.name)
		e.u32(uint32(len(t.dims)))
		for _, d := range t.dims {
			e.u64(uint64(d))
		}
		e.u32(uint32(t.typ))
		e.u64(off)
		off = align(off + t.bytes())
	}
	e.pad()
	for _, t := range tensors {
		c.writeData(e, t)
		e.pad()
	}
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

type ggmlType uint32

const (
	typeF32 ggmlType = 0
	typeF16 ggmlType = 1
)

type tensor struct {
	name  string
	dims  []int // ne[0] first: the row length
	typ   ggmlType
	scale float32 // weights are uniform in [-scale, scale]; 0: all ones (norms)
}

func (t tensor) elems() int {
	n := 1
	for _, d := range t.dims {
		n *= d
	}
	return n
}

func (t tensor) bytes() uint64 {
	if t.typ == typeF16 {
		return uint64(t.elems()) * 2
	}
	return uint64(t.elems()) * 4
}

func align(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

// tensors lists the llama architecture's tensors in llama.cpp's names. Matrix
// weights are uniform with variance 1/fan_in, which keeps activations near
// unit scale through the residual stream; the output head is scaled up so the
// logits are spread enough that the arg-max is not a near tie.
func (c Config) tensors() []tensor {
	wt := typeF32
	if c.F16 {
		wt = typeF16
	}
	kv := c.KVHeads * c.HeadDim()
	u := func(fanIn int) float32 { return float32(math.Sqrt(3 / float64(fanIn))) }
	ts := []tensor{
		{name: "token_embd.weight", dims: []int{c.Embd, c.Vocab}, typ: wt, scale: 1},
		{name: "output_norm.weight", dims: []int{c.Embd}, typ: typeF32},
		{name: "output.weight", dims: []int{c.Embd, c.Vocab}, typ: wt, scale: 4 * u(c.Embd)},
	}
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			tensor{name: p + "attn_norm.weight", dims: []int{c.Embd}, typ: typeF32},
			tensor{name: p + "attn_q.weight", dims: []int{c.Embd, c.Embd}, typ: wt, scale: u(c.Embd)},
			tensor{name: p + "attn_k.weight", dims: []int{c.Embd, kv}, typ: wt, scale: u(c.Embd)},
			tensor{name: p + "attn_v.weight", dims: []int{c.Embd, kv}, typ: wt, scale: u(c.Embd)},
			tensor{name: p + "attn_output.weight", dims: []int{c.Embd, c.Embd}, typ: wt, scale: u(c.Embd)},
			tensor{name: p + "ffn_norm.weight", dims: []int{c.Embd}, typ: typeF32},
			tensor{name: p + "ffn_gate.weight", dims: []int{c.Embd, c.FF}, typ: wt, scale: u(c.Embd)},
			tensor{name: p + "ffn_up.weight", dims: []int{c.Embd, c.FF}, typ: wt, scale: u(c.Embd)},
			tensor{name: p + "ffn_down.weight", dims: []int{c.FF, c.Embd}, typ: wt, scale: u(c.FF)},
		)
	}
	return ts
}

// writeData writes a tensor's values: ones for norms, otherwise uniform
// values from a PCG seeded by the model seed and the tensor's name, so that a
// tensor does not change when the model gains layers.
func (c Config) writeData(e *enc, t tensor) {
	n := t.elems()
	if t.scale == 0 {
		for range n {
			e.u32(math.Float32bits(1))
		}
		return
	}
	h := fnv.New64a()
	h.Write([]byte(t.name))
	r := rand.New(rand.NewPCG(c.Seed, h.Sum64()))
	var buf [4096]byte
	for n > 0 {
		b := buf[:]
		for len(b) >= 8 && n > 0 {
			// Two 32-bit draws per Uint64: uniform in [-scale, scale).
			v := r.Uint64()
			for k := 0; k < 2 && n > 0; k++ {
				x := (float32(uint32(v>>(32*k))>>8)/(1<<24)*2 - 1) * t.scale
				if t.typ == typeF16 {
					binary.LittleEndian.PutUint16(b, f16(x))
					b = b[2:]
				} else {
					binary.LittleEndian.PutUint32(b, math.Float32bits(x))
					b = b[4:]
				}
				n--
			}
		}
		e.write(buf[:len(buf)-len(b)])
	}
}

// f16 converts to IEEE half precision, rounding to nearest even (the weights
// are small, so overflow and NaN need no care beyond saturating).
func f16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case exp >= 31:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - exp)
		half := uint32(1) << (shift - 1)
		r := mant >> shift
		if rem := mant & (1<<shift - 1); rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(exp)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, which is the correct rounding
	}
	return sign | uint16(r)
}

// Vocab returns the generated vocabulary: the specials, the 256 byte tokens
// SentencePiece falls back to, then "▁" and printable ASCII characters, then
// "▁"-prefixed and plain letter n-grams until size. Pieces are unique (llama.cpp
// asserts it); earlier pieces score higher, so merges prefer them.
func Vocab(size int) (pieces []string, types []int32) {
	const (
		normal  = 1
		unknown = 2
		control = 3
		byteTok = 6
	)
	pieces = []string{"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"}
	types = []int32{unknown, control, control, control, control}
	for b := range 256 {
		pieces = append(pieces, fmt.Sprintf("<0x%02X>", b))
		types = append(types, byteTok)
	}
	seen := make(map[string]bool, size)
	add := func(p string) bool {
		if len(pieces) >= size {
			return false
		}
		if !seen[p] {
			seen[p] = true
			pieces = append(pieces, p)
			types = append(types, normal)
		}
		return true
	}
	const letters = "etaoinshrdlcumwfgypbvkjxqz"
	add("▁")
	for _, ch := range letters {
		add(string(ch))
	}
	for ch := byte(0x21); ch < 0x7f; ch++ {
		add(string(ch))
	}
	for _, ch := range letters {
		add("▁" + string(ch))
	}
	// n-grams of growing length, in a fixed order, until the vocabulary is full.
	for n := 2; len(pieces) < size; n++ {
		idx := make([]int, n)
		for {
			var sb strings.Builder
			for _, i := range idx {
				sb.WriteByte(letters[i])
			}
			if !add(sb.String()) || !add("▁"+sb.String()) {
				break
			}
			k := n - 1
			for k >= 0 && idx[k] == len(letters)-1 {
				idx[k] = 0
				k--
			}
			if k < 0 {
				break
			}
			idx[k]++
		}
	}
	return pieces, types
}

type kvPair struct {
	key string
	val any
}

// metadata is the GGUF key-value section.
func (c Config) metadata() []kvPair {
	pieces, types := Vocab(c.Vocab)
	fileType := 0
	if c.F16 {
		fileType = 1
	}
	scores := make([]float32, len(pieces))
	for i := range scores {
		scores[i] = -float32(i)
	}
	return []kvPair{
		{"general.architecture", "llama"},
		{"general.name", c.Name},
		{"general.alignment", uint32(alignment)},
		{"general.file_type", uint32(fileType)}, // llama_ftype: ALL_F32 or MOSTLY_F16
		{"llama.context_length", uint32(c.Ctx)},
		{"llama.embedding_length", uint32(c.Embd)},
		{"llama.block_count", uint32(c.Layers)},
		{"llama.feed_forward_length", uint32(c.FF)},
		{"llama.attention.head_count", uint32(c.Heads)},
		{"llama.attention.head_count_kv", uint32(c.KVHeads)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.dimension_count", uint32(c.HeadDim())},
		{"llama.rope.freq_base", float32(10000)},
		{"llama.vocab_size", uint32(c.Vocab)},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", pieces},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.unknown_token_id", uint32(TokUnk)},
		{"tokenizer.ggml.bos_token_id", uint32(TokBOS)},
		{"tokenizer.ggml.eos_token_id", uint32(TokEOS)},
		{"tokenizer.ggml.eot_token_id", uint32(TokIMEnd)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
		{"tokenizer.chat_template", ChatTemplate},
	}
}

// GGUF value types.
const (
	vtUint32  = 4
	vtInt32   = 5
	vtFloat32 = 6
	vtBool    = 7
	vtString  = 8
	vtArray   = 9
)

// enc writes little-endian fields and remembers the first error.
type enc struct {
	w   *bufio.Writer
	n   uint64
	err error
	b   [8]byte
}

func (e *enc) write(p []byte) {
	if e.err != nil {
		return
	}
	_, e.err = e.w.Write(p)
	e.n += uint64(len(p))
}

func (e *enc) u32(v uint32) { binary.LittleEndian.PutUint32(e.b[:], v); e.write(e.b[:4]) }
func (e *enc) u64(v uint64) { binary.LittleEndian.PutUint64(e.b[:], v); e.write(e.b[:8]) }
func (e *enc) str(s string) { e.u64(uint64(len(s))); e.write([]byte(s)) }

func (e *enc) pad() {
	var zero [alignment]byte
	e.write(zero[:align(e.n)-e.n])
}

func (e *enc) value(v any) {
	switch v := v.(type) {
	case uint32:
		e.u32(vtUint32)
		e.u32(v)
	case float32:
		e.u32(vtFloat32)
		e.u32(math.Float32bits(v))
	case bool:
		e.u32(vtBool)
		if v {
			e.write([]byte{1})
		} else {
			e.write([]byte{0})
		}
	case string:
		e.u32(vtString)
		e.str(v)
	case []string:
		e.u32(vtArray)
		e.u32(vtString)
		e.u64(uint64(len(v)))
		for _, s := range v {
			e.str(s)
		}
	case []float32:
		e.u32(vtArray)
		e.u32(vtFloat32)
		e.u64(uint64(len(v)))
		for _, f := range v {
			e.u32(math.Float32bits(f))
		}
	case []int32:
		e.u32(vtArray)
		e.u32(vtInt32)
		e.u64(uint64(len(v)))
		for _, i := range v {
			e.u32(uint32(i))
		}
	default:
		if e.err == nil {
			e.err = errors.New("gguf: unsupported metadata value type")
		}
	}
}
