package gguf

import (
	"errors"
	"fmt"
)

// TinyQwen35MoE is the tests' hybrid model in the layout of the production
// Qwen3.6-35B-A3B (llama.cpp's qwen35moe): three gated-DeltaNet blocks and
// one gated full-attention block (every fourth), each with a routed
// mixture of experts beside a gated shared expert. Widths are Tiny's; the
// heads are 32 values wide, as quantized KV caches need.
func TinyQwen35MoE() Config {
	c := Tiny()
	c.Name, c.Arch, c.Layers, c.Heads, c.KVHeads, c.HeadSize = "hydra-tiny-qwen35moe", ArchQwen35MoE, 4, 2, 1, 32
	c.Experts, c.ExpertsUsed, c.ExpertFF, c.SharedFF = 4, 2, 32, 32
	c.FullAttnInterval = 4
	c.SSMConv, c.SSMState, c.SSMGroups, c.SSMHeads = 4, 16, 2, 4
	return c
}

// TinyGemma3 is the tests' sliding-window model (llama.cpp's gemma3): six
// blocks, five attending to a window of 32 tokens and the sixth to the
// whole context, as Gemma 3 alternates them.
func TinyGemma3() Config {
	c := Tiny()
	c.Name, c.Arch, c.Layers, c.Heads, c.KVHeads, c.HeadSize = "hydra-tiny-gemma3", ArchGemma3, 6, 2, 1, 32
	c.Window, c.SWAPattern = 32, gemma3SWAPattern
	return c
}

// TinyQwen3 is Tiny as a dense qwen3 (per-head Q/K norms), heads of 32
// values as quantized KV caches need: the architecture of Qwen3's embedding
// and reranker models (embed.go).
func TinyQwen3() Config {
	c := Tiny()
	c.Name, c.Arch, c.Heads, c.KVHeads = "hydra-tiny-qwen3", ArchQwen3, 2, 1
	return c
}

// TinyFor is the tiny model of an architecture: Tiny, TinyQwen3, TinyMoE,
// TinyQwen35MoE or TinyGemma3.
func TinyFor(arch string) (Config, error) {
	switch arch {
	case ArchLlama, "":
		return Tiny(), nil
	case ArchQwen3:
		return TinyQwen3(), nil
	case ArchQwen3MoE:
		return TinyMoE(), nil
	case ArchQwen35MoE:
		return TinyQwen35MoE(), nil
	case ArchGemma3:
		return TinyGemma3(), nil
	}
	return Config{}, fmt.Errorf("gguf: architecture %q: want %s", arch, archList)
}

const archList = "llama, qwen3, qwen3moe, qwen35moe or gemma3"

// gemma3SWAPattern is llama.cpp's default for gemma3 files, which carry no
// pattern key: of every six blocks the last attends to the whole context.
const gemma3SWAPattern = 6

// validateArch checks the shapes only the hybrid and sliding-window
// architectures have.
func (c Config) validateArch() error {
	if c.MTP != 0 && c.arch() != ArchQwen35MoE {
		return fmt.Errorf("gguf: MTP blocks are for qwen35moe, not %s", c.arch())
	}
	switch c.arch() {
	case ArchQwen35MoE:
		for _, f := range []struct {
			name string
			v    int
		}{
			{"shared ff", c.SharedFF}, {"full attention interval", c.FullAttnInterval}, {"ssm conv", c.SSMConv},
			{"ssm state", c.SSMState}, {"ssm groups", c.SSMGroups}, {"ssm heads", c.SSMHeads},
		} {
			if f.v < 1 || f.v > 4*maxDim {
				return fmt.Errorf("gguf: %s %d out of range [1, %d]", f.name, f.v, 4*maxDim)
			}
		}
		switch {
		case c.MTP < 0 || c.MTP > 1:
			return fmt.Errorf("gguf: %d MTP blocks: llama.cpp's qwen35moe takes 0 or 1", c.MTP)
		case c.SSMHeads%c.SSMGroups != 0:
			return fmt.Errorf("gguf: ssm heads %d are not a multiple of ssm groups %d (value heads share key heads)", c.SSMHeads, c.SSMGroups)
		case c.HeadDim()%8 != 0:
			// A quarter of each head is rotated, in pairs spread over
			// three position sections.
			return fmt.Errorf("gguf: head size %d must be a multiple of 8 (a quarter of it is rotated)", c.HeadDim())
		}
	case ArchGemma3:
		if c.Window < 1 || c.Window > c.Ctx {
			return fmt.Errorf("gguf: sliding window %d out of range [1, ctx %d]", c.Window, c.Ctx)
		}
		if c.SWAPattern < 1 || c.SWAPattern > maxLayers {
			return fmt.Errorf("gguf: sliding window pattern %d out of range [1, %d]", c.SWAPattern, maxLayers)
		}
	default:
		if c.SharedFF|c.FullAttnInterval|c.SSMConv|c.SSMState|c.SSMGroups|c.SSMHeads|c.Window|c.SWAPattern != 0 {
			return errors.New("gguf: shared experts, DeltaNet and sliding-window sizes are for qwen35moe and gemma3")
		}
		if c.HeadSize != 0 {
			return fmt.Errorf("gguf: a %s model's head size is embd / heads: head size must be 0", c.arch())
		}
	}
	return nil
}

// recurrent reports whether block i of a qwen35moe model is a DeltaNet
// block, llama.cpp's rule for a file without a recurrent-layer list:
// every FullAttnInterval-th block attends, the others recur.
func (c Config) recurrent(i int) bool {
	return c.arch() == ArchQwen35MoE && (i+1)%c.FullAttnInterval != 0
}

// attentionLayers is how many blocks keep a KV cache.
func (c Config) attentionLayers() int {
	n := 0
	for i := range c.Layers {
		if !c.recurrent(i) {
			n++
		}
	}
	return n
}

// ropeSections are qwen35moe's interleaved-MRoPE sections: the rotated
// pairs (a quarter of the head) split over time, height and width as
// Qwen3.5 splits its 32 into 11, 11 and 10. Text has one position for all
// three, so the split only has to be well-formed.
func (c Config) ropeSections() []int32 {
	pairs := int32(c.HeadDim() / 8)
	return []int32{(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0}
}

// qwen35Block is block i of a qwen35moe model: norms before and after
// attention, a gated full attention (Q projects to query and gate, per-head
// Q/K norms) or a gated DeltaNet, then the routed experts and the gated
// shared expert; recurrent: the DeltaNet (c.recurrent(i) in the trunk).
//
// The DeltaNet's random parameters are the ones that decide whether its
// recurrent state stays bounded, and they are drawn the way Qwen3-Next
// initialises them: ssm_a (convert's -exp(A_log)) in [-16, 0), so every
// step decays the state (exp(softplus(·)·a) < 1); ssm_dt.bias near 1; keys
// are L2-normalised and beta is a sigmoid in the graph, so the delta rule
// itself cannot grow it.
func (c Config) qwen35Block(i int, wt ggmlType, recurrent bool) []tensor {
	p := fmt.Sprintf("blk.%d.", i)
	e, hd := c.Embd, c.HeadDim()
	ts := []tensor{
		{name: p + "attn_norm.weight", dims: []int{e}, typ: typeF32},
		{name: p + "post_attention_norm.weight", dims: []int{e}, typ: typeF32},
	}
	if recurrent {
		keys, values := c.SSMState*c.SSMGroups, c.SSMState*c.SSMHeads
		conv := 2*keys + values
		ts = append(ts,
			tensor{name: p + "attn_qkv.weight", dims: []int{e, conv}, typ: wt, scale: uniformScale(e)},
			tensor{name: p + "attn_gate.weight", dims: []int{e, values}, typ: wt, scale: uniformScale(e)},
			tensor{name: p + "ssm_conv1d.weight", dims: []int{c.SSMConv, conv}, typ: typeF32, scale: uniformScale(c.SSMConv)},
			tensor{name: p + "ssm_dt.bias", dims: []int{c.SSMHeads}, typ: typeF32, offset: 1, scale: 0.5},
			tensor{name: p + "ssm_a", dims: []int{c.SSMHeads}, typ: typeF32, offset: -8, scale: 8},
			tensor{name: p + "ssm_beta.weight", dims: []int{e, c.SSMHeads}, typ: wt, scale: uniformScale(e)},
			tensor{name: p + "ssm_alpha.weight", dims: []int{e, c.SSMHeads}, typ: wt, scale: uniformScale(e)},
			tensor{name: p + "ssm_norm.weight", dims: []int{c.SSMState}, typ: typeF32},
			tensor{name: p + "ssm_out.weight", dims: []int{values, e}, typ: wt, scale: uniformScale(values)},
		)
	} else {
		q, kv := hd*c.Heads, hd*c.KVHeads
		ts = append(ts,
			tensor{name: p + "attn_q.weight", dims: []int{e, 2 * q}, typ: wt, scale: uniformScale(e)},
			tensor{name: p + "attn_k.weight", dims: []int{e, kv}, typ: wt, scale: uniformScale(e)},
			tensor{name: p + "attn_v.weight", dims: []int{e, kv}, typ: wt, scale: uniformScale(e)},
			tensor{name: p + "attn_output.weight", dims: []int{q, e}, typ: wt, scale: uniformScale(q)},
			tensor{name: p + "attn_q_norm.weight", dims: []int{hd}, typ: typeF32},
			tensor{name: p + "attn_k_norm.weight", dims: []int{hd}, typ: typeF32},
		)
	}
	ts = append(ts, c.experts(i, wt)...)
	return append(ts,
		tensor{name: p + "ffn_gate_inp_shexp.weight", dims: []int{e}, typ: typeF32, scale: uniformScale(e)},
		tensor{name: p + "ffn_gate_shexp.weight", dims: []int{e, c.SharedFF}, typ: wt, scale: uniformScale(e)},
		tensor{name: p + "ffn_up_shexp.weight", dims: []int{e, c.SharedFF}, typ: wt, scale: uniformScale(e)},
		tensor{name: p + "ffn_down_shexp.weight", dims: []int{c.SharedFF, e}, typ: wt, scale: uniformScale(c.SharedFF)},
	)
}

// mtpBlock is a qwen35moe model's multi-token-prediction block, block i
// after the trunk's: a full-attention block with the trunk's experts and
// shared expert, fed by nextn's projection of the normed hidden state and
// the next token's embedding (2·embd → embd; llama.cpp's load_block_mtp).
func (c Config) mtpBlock(i int, wt ggmlType) []tensor {
	p, e := fmt.Sprintf("blk.%d.", i), c.Embd
	return append(c.qwen35Block(i, wt, false),
		tensor{name: p + "nextn.eh_proj.weight", dims: []int{2 * e, e}, typ: wt, scale: uniformScale(2 * e)},
		tensor{name: p + "nextn.enorm.weight", dims: []int{e}, typ: typeF32},
		tensor{name: p + "nextn.hnorm.weight", dims: []int{e}, typ: typeF32},
	)
}

// gemma3Block is block i of a gemma3 model: attention with per-head Q/K
// norms and a norm after it, then a gated FFN with a norm after it too.
func (c Config) gemma3Block(i int, wt ggmlType) []tensor {
	p := fmt.Sprintf("blk.%d.", i)
	e, hd := c.Embd, c.HeadDim()
	q, kv := hd*c.Heads, hd*c.KVHeads
	return []tensor{
		{name: p + "attn_norm.weight", dims: []int{e}, typ: typeF32},
		{name: p + "attn_q.weight", dims: []int{e, q}, typ: wt, scale: uniformScale(e)},
		{name: p + "attn_k.weight", dims: []int{e, kv}, typ: wt, scale: uniformScale(e)},
		{name: p + "attn_v.weight", dims: []int{e, kv}, typ: wt, scale: uniformScale(e)},
		{name: p + "attn_output.weight", dims: []int{q, e}, typ: wt, scale: uniformScale(q)},
		{name: p + "post_attention_norm.weight", dims: []int{e}, typ: typeF32},
		{name: p + "attn_k_norm.weight", dims: []int{hd}, typ: typeF32},
		{name: p + "attn_q_norm.weight", dims: []int{hd}, typ: typeF32},
		{name: p + "ffn_norm.weight", dims: []int{e}, typ: typeF32},
		{name: p + "ffn_gate.weight", dims: []int{e, c.FF}, typ: wt, scale: uniformScale(e)},
		{name: p + "ffn_up.weight", dims: []int{e, c.FF}, typ: wt, scale: uniformScale(e)},
		{name: p + "ffn_down.weight", dims: []int{c.FF, e}, typ: wt, scale: uniformScale(c.FF)},
		{name: p + "post_ffw_norm.weight", dims: []int{e}, typ: typeF32},
	}
}

// qwen35Hparams are the keys convert_hf_to_gguf.py writes for a Qwen3.5
// MoE model and llama.cpp's qwen35moe loader reads: no dense FFN width
// (every block is MoE), a head size of its own, a quarter of each head
// rotated, and the DeltaNet's sizes under ssm.*.
func (c Config) qwen35Hparams() []kvPair {
	a := c.arch() + "."
	kv := []kvPair{
		{a + "block_count", uint32(c.Layers + c.MTP)}, // llama.cpp counts the MTP blocks in
		{a + "context_length", uint32(c.Ctx)},
		{a + "embedding_length", uint32(c.Embd)},
		{a + "attention.head_count", uint32(c.Heads)},
		{a + "attention.head_count_kv", uint32(c.KVHeads)},
		{a + "rope.dimension_sections", c.ropeSections()},
		{a + "rope.freq_base", float32(1e7)},
		{a + "attention.layer_norm_rms_epsilon", float32(1e-6)},
		{a + "expert_count", uint32(c.Experts)},
		{a + "expert_used_count", uint32(c.ExpertsUsed)},
		{a + "attention.key_length", uint32(c.HeadDim())},
		{a + "attention.value_length", uint32(c.HeadDim())},
		{a + "expert_feed_forward_length", uint32(c.ExpertFF)},
		{a + "expert_shared_feed_forward_length", uint32(c.SharedFF)},
		{a + "ssm.conv_kernel", uint32(c.SSMConv)},
		{a + "ssm.state_size", uint32(c.SSMState)},
		{a + "ssm.group_count", uint32(c.SSMGroups)},
		{a + "ssm.time_step_rank", uint32(c.SSMHeads)},
		{a + "ssm.inner_size", uint32(c.SSMState * c.SSMHeads)},
		{a + "full_attention_interval", uint32(c.FullAttnInterval)},
		{a + "rope.dimension_count", uint32(c.HeadDim() / 4)},
	}
	if c.MTP > 0 {
		kv = append(kv, kvPair{a + "nextn_predict_layers", uint32(c.MTP)})
	}
	return kv
}

// gemma3Hparams are the keys convert writes for a Gemma 3 text model: the
// global blocks' RoPE base and the local (sliding-window) blocks' own, and
// the window. The pattern key, which Gemma 3 files do not carry, is
// written only for a pattern other than llama.cpp's default.
func (c Config) gemma3Hparams() []kvPair {
	a := c.arch() + "."
	kv := []kvPair{
		{a + "block_count", uint32(c.Layers)},
		{a + "context_length", uint32(c.Ctx)},
		{a + "embedding_length", uint32(c.Embd)},
		{a + "feed_forward_length", uint32(c.FF)},
		{a + "attention.head_count", uint32(c.Heads)},
		{a + "attention.head_count_kv", uint32(c.KVHeads)},
		{a + "rope.freq_base", float32(1e6)},
		{a + "rope.freq_base_swa", float32(1e4)},
		{a + "attention.layer_norm_rms_epsilon", float32(1e-6)},
		{a + "attention.key_length", uint32(c.HeadDim())},
		{a + "attention.value_length", uint32(c.HeadDim())},
		{a + "attention.sliding_window", uint32(c.Window)},
	}
	if c.SWAPattern != gemma3SWAPattern {
		kv = append(kv, kvPair{a + "attention.sliding_window_pattern", uint32(c.SWAPattern)})
	}
	return kv
}
