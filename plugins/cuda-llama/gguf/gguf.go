// Package gguf writes small GGUF models with deterministic random weights, so
// that tests and benchmarks of the llama.cpp backend need no download: dense
// llama models, llama models with experts (Mixtral's layout), qwen3moe
// mixture-of-experts models, qwen35moe hybrids (gated DeltaNet and gated
// attention blocks with routed and shared experts: the production
// Qwen3.6-35B-A3B's layout) and gemma3 sliding-window models. Their
// vocabulary is a minimal SentencePiece-style one with a ChatML template, or
// a real Hugging Face tokenizer (LoadTokenizer) written as llama.cpp's
// converter writes it. The models are well-formed for llama.cpp (they load,
// tokenize, apply their template and decode) but know no language: with
// random weights greedy decoding soon repeats itself.
//
// Only what those architectures need is written (GGUF v3; the big matrices in
// F32, F16, Q8_0 or Q4_0, norms, routers and other small tensors in F32);
// the format is documented in ggml's docs/gguf.md. One seed and one set of shapes give the
// same values at every weight type, so two files differ only by their
// quantisation.
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
	Arch    string // ArchLlama (also ""), ArchQwen3, ArchQwen3MoE, ArchQwen35MoE or ArchGemma3
	Layers  int    // transformer blocks
	Embd    int    // embedding width (n_embd)
	Heads   int    // attention heads; Embd must be a multiple unless HeadSize is set
	KVHeads int    // KV heads (GQA); Heads must be a multiple
	FF      int    // feed-forward width (llama: also each expert's; qwen35moe has none)
	Vocab   int    // vocabulary size: at least MinVocab, or the Tokenizer's Size
	Ctx     int    // training context length (ARCH.context_length)

	// HeadSize is each head's width (attention.key_length and
	// value_length) for qwen35moe and gemma3, whose heads need not split
	// Embd; 0 is Embd / Heads. llama and qwen3moe models leave it 0.
	HeadSize int

	// Tokenizer, when set, is the vocabulary, merges, special tokens and
	// chat template of a Hugging Face tokenizer instead of the generated
	// SentencePiece-style one; Vocab then counts at least its Size.
	Tokenizer *Tokenizer

	// Experts are the feed-forward experts of every block (expert_count),
	// ExpertsUsed how many of them each token is routed to. qwen3moe needs
	// both; a llama model with Experts 0 is dense.
	Experts, ExpertsUsed int
	// ExpertFF is each expert's width in a qwen3moe model
	// (expert_feed_forward_length); a llama model's experts are FF wide
	// (Mixtral's layout), so there it must be 0 or FF.
	ExpertFF int

	// qwen35moe: SharedFF is the shared expert's width; every
	// FullAttnInterval-th block is full attention, the others gated
	// DeltaNet with a causal convolution of SSMConv taps over SSMHeads
	// value heads and SSMGroups key heads of SSMState values each.
	SharedFF, FullAttnInterval             int
	SSMConv, SSMState, SSMGroups, SSMHeads int
	// MTP is how many multi-token-prediction blocks follow a qwen35moe
	// model's Layers (nextn_predict_layers: 0 or 1, Qwen3.5's count):
	// llama.cpp's draft-mtp drafts with it, and a model that does not
	// load it is the same model without.
	MTP int

	// gemma3: Window is the sliding window of the local blocks; of every
	// SWAPattern blocks the last is global (Gemma 3: 6).
	Window, SWAPattern int

	Type WeightType // the big matrices' type; norms and routers stay F32
	F16  bool       // the same as Type WeightF16, kept for callers older than Type
	Seed uint64     // weights are a function of Seed and the tensor's name

	// Overrides give some big matrices another type than Type (the first
	// override matching a name decides): the same model with those weights
	// from another quantisation, bit for bit.
	Overrides []TypeOverride

	// Embeddings (embed.go): the pooling the model names, a qwen3 model's
	// classifier head and its labels (a reranker's), its rerank template.
	Embedding
}

// Architectures Write knows.
const (
	ArchLlama     = "llama"
	ArchQwen3     = "qwen3"
	ArchQwen3MoE  = "qwen3moe"
	ArchQwen35MoE = "qwen35moe"
	ArchGemma3    = "gemma3"
)

// Tiny is the model the tests use: a few hundred kilobytes, milliseconds per
// token on one CPU core, yet a real GQA llama with every tensor a full model
// has.
func Tiny() Config {
	return Config{Name: "hydra-tiny", Arch: ArchLlama, Layers: 2, Embd: 64, Heads: 4, KVHeads: 2, FF: 128, Vocab: 512, Ctx: 4096, Seed: 1}
}

// TinyMoE is Tiny as a qwen3moe mixture of experts: 4 experts of width 32
// per block, 2 of them used per token, in 4 blocks so that placement tests
// have layers to tell apart, and heads of 32 values, which quantized KV
// caches (q8_0, as node configurations use) need.
func TinyMoE() Config {
	c := Tiny()
	c.Name, c.Arch, c.Layers, c.Heads, c.KVHeads = "hydra-tiny-moe", ArchQwen3MoE, 4, 2, 1
	c.Experts, c.ExpertsUsed, c.ExpertFF = 4, 2, 32
	return c
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
	maxExperts  = 512 // LLAMA_MAX_EXPERTS: llama.cpp aborts beyond it
	alignment   = 32
	ggufMagic   = 0x46554747 // "GGUF"
	ggufVersion = 3
)

// ChatTemplate is the ChatML template written into tokenizer.chat_template;
// llama.cpp recognises it by its <|im_start|> marker.
const ChatTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Validate checks that the sizes make a model llama.cpp accepts.
func (c Config) Validate() error {
	if err := c.validateSizes(); err != nil {
		return err
	}
	if err := c.validateExperts(); err != nil {
		return err
	}
	if err := c.validateArch(); err != nil {
		return err
	}
	if err := c.validateEmbedding(); err != nil {
		return err
	}
	return c.validateType()
}

// validateSizes checks the dense shapes every architecture has.
func (c Config) validateSizes() error {
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"layers", c.Layers, maxLayers}, {"embd", c.Embd, maxDim}, {"heads", c.Heads, maxDim},
		{"kv heads", c.KVHeads, maxDim}, {"ff", c.FF, 4 * maxDim}, {"ctx", c.Ctx, 1 << 24},
		{"head size", c.HeadDim(), maxDim},
	} {
		if f.v < 1 || f.v > f.max {
			return fmt.Errorf("gguf: %s %d out of range [1, %d]", f.name, f.v, f.max)
		}
	}
	switch {
	case c.Tokenizer != nil && (c.Vocab < c.Tokenizer.Size() || c.Vocab > maxVocab):
		return fmt.Errorf("gguf: vocab %d out of range [%d, %d] (the tokenizer has %d tokens)", c.Vocab, c.Tokenizer.Size(), maxVocab, c.Tokenizer.Size())
	case c.Tokenizer == nil && (c.Vocab < MinVocab || c.Vocab > maxVocab):
		return fmt.Errorf("gguf: vocab %d out of range [%d, %d] (specials and 256 byte tokens come first)", c.Vocab, MinVocab, maxVocab)
	case c.HeadSize == 0 && c.Embd%c.Heads != 0:
		return fmt.Errorf("gguf: embd %d is not a multiple of heads %d", c.Embd, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("gguf: heads %d is not a multiple of kv heads %d", c.Heads, c.KVHeads)
	case c.HeadDim()%2 != 0:
		return fmt.Errorf("gguf: head size %d must be even (RoPE rotates pairs)", c.HeadDim())
	}
	return nil
}

// validateExperts checks the architecture and its experts; llama.cpp
// asserts (aborts the process) on counts it cannot route.
func (c Config) validateExperts() error {
	switch c.arch() {
	case ArchLlama:
		if c.ExpertFF != 0 && c.ExpertFF != c.FF {
			return fmt.Errorf("gguf: a llama model's experts are ff %d wide: expert ff %d must be 0 or ff", c.FF, c.ExpertFF)
		}
		if c.Experts == 0 && c.ExpertsUsed == 0 {
			return nil
		}
	case ArchQwen3MoE, ArchQwen35MoE:
		if c.Experts == 0 {
			return fmt.Errorf("gguf: a %s model needs experts (and experts used, expert ff)", c.arch())
		}
		if c.ExpertFF < 1 || c.ExpertFF > 4*maxDim {
			return fmt.Errorf("gguf: expert ff %d out of range [1, %d]", c.ExpertFF, 4*maxDim)
		}
	case ArchGemma3, ArchQwen3:
		if c.Experts != 0 || c.ExpertsUsed != 0 || c.ExpertFF != 0 {
			return fmt.Errorf("gguf: a %s model has no experts", c.arch())
		}
		return nil
	default:
		return fmt.Errorf("gguf: architecture %q: want %s", c.Arch, archList)
	}
	switch {
	case c.Experts < 1 || c.Experts > maxExperts:
		return fmt.Errorf("gguf: experts %d out of range [1, %d]", c.Experts, maxExperts)
	case c.ExpertsUsed < 1 || c.ExpertsUsed > c.Experts:
		return fmt.Errorf("gguf: experts used %d out of range [1, experts %d]", c.ExpertsUsed, c.Experts)
	}
	return nil
}

// validateType checks the weight type and that every quantized row divides
// into whole blocks, as ggml requires.
func (c Config) validateType() error {
	if c.Type < WeightF32 || c.Type > WeightQ4_0 {
		return fmt.Errorf("gguf: weight type %d unknown", int(c.Type))
	}
	if c.F16 && c.Type != WeightF32 && c.Type != WeightF16 {
		return fmt.Errorf("gguf: F16 and weight type %s contradict each other", c.Type)
	}
	for _, o := range c.Overrides {
		if o.Pattern == nil || o.Type < WeightF32 || o.Type > WeightQ4_0 {
			return fmt.Errorf("gguf: override %v: needs a pattern and a known weight type", o)
		}
	}
	weightTypes := map[ggmlType]WeightType{typeF32: WeightF32, typeF16: WeightF16, typeQ8_0: WeightQ8_0, typeQ4_0: WeightQ4_0}
	for _, t := range c.tensors() {
		if w := weightTypes[t.typ]; w.quantized() && t.dims[0]%blockValues != 0 {
			return fmt.Errorf("gguf: %s rows of %d values do not divide into %s blocks of %d", t.name, t.dims[0], w, blockValues)
		}
	}
	return nil
}

// arch is the architecture, "" being llama.
func (c Config) arch() string {
	if c.Arch == "" {
		return ArchLlama
	}
	return c.Arch
}

// weightType is Type, or F16 where only the older F16 flag says so.
func (c Config) weightType() WeightType {
	if c.F16 && c.Type == WeightF32 {
		return WeightF16
	}
	return c.Type
}

// HeadDim is the size of one attention head: HeadSize, or Embd / Heads.
func (c Config) HeadDim() int {
	if c.HeadSize != 0 {
		return c.HeadSize
	}
	if c.Heads == 0 {
		return 0
	}
	return c.Embd / c.Heads
}

// KVBytesPerToken is the KV cache a token takes with an F16 cache: K and V,
// KVHeads × HeadDim values each, in every attention layer (a qwen35moe
// model's DeltaNet blocks keep a fixed-size state instead; a gemma3 model's
// sliding-window blocks keep at most Window tokens).
func (c Config) KVBytesPerToken() int {
	return c.attentionLayers() * 2 * c.KVHeads * c.HeadDim() * 2
}

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

// ggml_type ids.
const (
	typeF32  ggmlType = 0
	typeF16  ggmlType = 1
	typeQ4_0 ggmlType = 2
	typeQ8_0 ggmlType = 8
)

type tensor struct {
	name   string
	dims   []int // ne[0] first: the row length
	typ    ggmlType
	scale  float32 // weights are uniform in [offset-scale, offset+scale]; 0: all ones (norms)
	offset float32
}

func (t tensor) elems() int {
	n := 1
	for _, d := range t.dims {
		n *= d
	}
	return n
}

func (t tensor) bytes() uint64 { return typeBytes(t.typ, t.elems()) }

func align(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

// tensors lists the model's tensors in llama.cpp's names and order. Matrix
// weights are uniform with variance 1/fan_in, which keeps activations near
// unit scale through the residual stream; the output head is scaled up so the
// logits are spread enough that the arg-max is not a near tie.
func (c Config) tensors() []tensor {
	wt := c.weightType().ggmlType()
	embd := float32(1)
	if c.arch() == ArchGemma3 {
		embd = uniformScale(c.Embd) // Gemma scales embeddings up by sqrt(n_embd)
	}
	ts := []tensor{
		{name: "token_embd.weight", dims: []int{c.Embd, c.Vocab}, typ: wt, scale: embd},
		{name: "output_norm.weight", dims: []int{c.Embd}, typ: typeF32},
		{name: "output.weight", dims: []int{c.Embd, c.Vocab}, typ: wt, scale: 4 * uniformScale(c.Embd)},
	}
	for i := range c.Layers {
		switch c.arch() {
		case ArchQwen35MoE:
			ts = append(ts, c.qwen35Block(i, wt, c.recurrent(i))...)
			if i == c.Layers-1 && c.MTP > 0 {
				ts = append(ts, c.mtpBlock(c.Layers, wt)...)
			}
			continue
		case ArchGemma3:
			ts = append(ts, c.gemma3Block(i, wt)...)
			continue
		}
		ts = append(ts, c.attention(i, wt)...)
		ts = append(ts, tensor{name: fmt.Sprintf("blk.%d.ffn_norm.weight", i), dims: []int{c.Embd}, typ: typeF32})
		if c.Experts > 0 {
			ts = append(ts, c.experts(i, wt)...)
		} else {
			ts = append(ts, c.denseFFN(i, wt)...)
		}
	}
	return c.overridden(append(ts, c.classifier(wt)...))
}

// uniformScale is the bound of a uniform distribution of variance 1/fanIn.
func uniformScale(fanIn int) float32 { return float32(math.Sqrt(3 / float64(fanIn))) }

// attention is block i's attention: norm, projections, and qwen3's and
// qwen3moe's per-head norms of Q and K.
func (c Config) attention(i int, wt ggmlType) []tensor {
	p := fmt.Sprintf("blk.%d.", i)
	kv, u := c.KVHeads*c.HeadDim(), uniformScale(c.Embd)
	ts := []tensor{
		{name: p + "attn_norm.weight", dims: []int{c.Embd}, typ: typeF32},
		{name: p + "attn_q.weight", dims: []int{c.Embd, c.Embd}, typ: wt, scale: u},
		{name: p + "attn_k.weight", dims: []int{c.Embd, kv}, typ: wt, scale: u},
		{name: p + "attn_v.weight", dims: []int{c.Embd, kv}, typ: wt, scale: u},
		{name: p + "attn_output.weight", dims: []int{c.Embd, c.Embd}, typ: wt, scale: u},
	}
	if c.arch() == ArchQwen3MoE || c.arch() == ArchQwen3 {
		ts = append(ts,
			tensor{name: p + "attn_q_norm.weight", dims: []int{c.HeadDim()}, typ: typeF32},
			tensor{name: p + "attn_k_norm.weight", dims: []int{c.HeadDim()}, typ: typeF32})
	}
	return ts
}

// denseFFN is block i's SwiGLU feed-forward network.
func (c Config) denseFFN(i int, wt ggmlType) []tensor {
	p := fmt.Sprintf("blk.%d.", i)
	return []tensor{
		{name: p + "ffn_gate.weight", dims: []int{c.Embd, c.FF}, typ: wt, scale: uniformScale(c.Embd)},
		{name: p + "ffn_up.weight", dims: []int{c.Embd, c.FF}, typ: wt, scale: uniformScale(c.Embd)},
		{name: p + "ffn_down.weight", dims: []int{c.FF, c.Embd}, typ: wt, scale: uniformScale(c.FF)},
	}
}

// experts is block i's router (F32, as llama.cpp's quantize leaves it) and
// its experts, stacked along the third dimension.
func (c Config) experts(i int, wt ggmlType) []tensor {
	p := fmt.Sprintf("blk.%d.", i)
	ff := c.expertFF()
	return []tensor{
		{name: p + "ffn_gate_inp.weight", dims: []int{c.Embd, c.Experts}, typ: typeF32, scale: uniformScale(c.Embd)},
		{name: p + "ffn_gate_exps.weight", dims: []int{c.Embd, ff, c.Experts}, typ: wt, scale: uniformScale(c.Embd)},
		{name: p + "ffn_down_exps.weight", dims: []int{ff, c.Embd, c.Experts}, typ: wt, scale: uniformScale(ff)},
		{name: p + "ffn_up_exps.weight", dims: []int{c.Embd, ff, c.Experts}, typ: wt, scale: uniformScale(c.Embd)},
	}
}

// expertFF is each expert's width.
func (c Config) expertFF() int {
	if c.arch() != ArchLlama {
		return c.ExpertFF
	}
	return c.FF
}

// writeData writes a tensor's values: ones for norms, otherwise uniform
// values from a PCG seeded by the model seed and the tensor's name, so that a
// tensor does not change when the model gains layers, and is the same values
// at every type it is written in.
func (c Config) writeData(e *enc, t tensor) {
	n := t.elems()
	vals := make([]float32, 0, valueChunk)
	var buf []byte
	next := t.values(c.Seed)
	for n > 0 {
		vals = next(vals[:0], min(n, valueChunk))
		n -= len(vals)
		buf = encodeValues(buf[:0], t.typ, vals)
		e.write(buf)
	}
}

// valueChunk is how many values writeData encodes at once: whole quantized
// blocks, and an even count, since each 64-bit draw gives two values.
const valueChunk = 1024

// values returns the generator of t's values: each call appends the next n.
func (t tensor) values(seed uint64) func(dst []float32, n int) []float32 {
	if t.scale == 0 {
		return func(dst []float32, n int) []float32 {
			for range n {
				dst = append(dst, 1)
			}
			return dst
		}
	}
	h := fnv.New64a()
	h.Write([]byte(t.name))
	r := rand.New(rand.NewPCG(seed, h.Sum64()))
	return func(dst []float32, n int) []float32 {
		for n > 0 {
			// Two 32-bit draws per Uint64: uniform in [-scale, scale).
			v := r.Uint64()
			for k := 0; k < 2 && n > 0; k++ {
				x := (float32(uint32(v>>(32*k))>>8)/(1<<24)*2 - 1) * t.scale
				if t.offset != 0 {
					x += t.offset
				}
				dst = append(dst, x)
				n--
			}
		}
		return dst
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
	kv := []kvPair{
		{"general.architecture", c.arch()},
		{"general.name", c.Name},
		{"general.alignment", uint32(alignment)},
		{"general.file_type", c.weightType().fileType()},
	}
	kv = append(kv, c.hparams()...)
	kv = append(kv, c.embeddingHparams()...)
	return append(append(kv, c.tokenizer()...), c.rerankTemplate()...)
}

// hparams are the architecture's hyperparameters, under its prefix.
func (c Config) hparams() []kvPair {
	switch c.arch() {
	case ArchQwen35MoE:
		return c.qwen35Hparams()
	case ArchGemma3:
		return c.gemma3Hparams()
	}
	a := c.arch() + "."
	ff := c.FF
	if c.Experts > 0 {
		ff = c.expertFF() // a llama model's experts are feed_forward_length wide
	}
	kv := []kvPair{
		{a + "context_length", uint32(c.Ctx)},
		{a + "embedding_length", uint32(c.Embd)},
		{a + "block_count", uint32(c.Layers)},
		{a + "feed_forward_length", uint32(ff)},
		{a + "attention.head_count", uint32(c.Heads)},
		{a + "attention.head_count_kv", uint32(c.KVHeads)},
		{a + "attention.layer_norm_rms_epsilon", float32(1e-5)},
		{a + "rope.dimension_count", uint32(c.HeadDim())},
		{a + "rope.freq_base", float32(10000)},
		{a + "vocab_size", uint32(c.Vocab)},
	}
	if c.Experts > 0 {
		kv = append(kv, kvPair{a + "expert_count", uint32(c.Experts)}, kvPair{a + "expert_used_count", uint32(c.ExpertsUsed)})
	}
	if c.arch() == ArchQwen3MoE {
		kv = append(kv, kvPair{a + "expert_feed_forward_length", uint32(c.ExpertFF)})
	}
	return kv
}

// tokenizer is the Hugging Face tokenizer's metadata, or the generated
// vocabulary and the ChatML template.
func (c Config) tokenizer() []kvPair {
	if c.Tokenizer != nil {
		return c.Tokenizer.metadata(c.Vocab)
	}
	pieces, types := Vocab(c.Vocab)
	scores := make([]float32, len(pieces))
	for i := range scores {
		scores[i] = -float32(i)
	}
	return []kvPair{
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
