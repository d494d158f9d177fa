package gguf

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// wantShapes checks a file's tensors against want (name → dims) and their
// types: F32 for the small ones, wt for the big matrices.
func wantShapes(t *testing.T, f *parsedFile, want map[string][]int, wt WeightType) {
	t.Helper()
	if len(f.tensors) != len(want) {
		t.Errorf("%d tensors, want %d", len(f.tensors), len(want))
	}
	for _, ts := range f.tensors {
		typ := typeF32
		if (tensor{name: ts.name, dims: ts.dims}).matrix() {
			typ = wt.ggmlType()
		}
		if !slices.Equal(ts.dims, want[ts.name]) || ts.typ != typ {
			t.Errorf("%s: dims %v type %d, want %v type %d", ts.name, ts.dims, ts.typ, want[ts.name], typ)
		}
	}
}

// wantKeys checks metadata values.
func wantKeys(t *testing.T, f *parsedFile, want map[string]any) {
	t.Helper()
	for key, v := range want {
		if fmt.Sprint(f.kv[key]) != fmt.Sprint(v) {
			t.Errorf("%s = %v, want %v", key, f.kv[key], v)
		}
	}
}

// A qwen35moe model has the tensors and keys llama.cpp's qwen35moe loader
// asks for (src/models/qwen35moe.cpp), at their shapes: DeltaNet blocks
// but every fourth, which attends with a gated Q.
func TestQwen35MoEWellFormed(t *testing.T) {
	c := TinyQwen35MoE()
	c.Layers, c.Type = 8, WeightQ8_0
	f := writeParsed(t, c)
	a := "qwen35moe."
	wantKeys(t, f, map[string]any{
		"general.architecture": "qwen35moe", "general.file_type": uint32(7),
		a + "block_count": uint32(8), a + "context_length": uint32(4096), a + "embedding_length": uint32(64),
		a + "attention.head_count": uint32(2), a + "attention.head_count_kv": uint32(1),
		a + "attention.key_length": uint32(32), a + "attention.value_length": uint32(32),
		a + "rope.dimension_count": uint32(8), a + "rope.dimension_sections": []any{int32(2), int32(1), int32(1), int32(0)},
		a + "rope.freq_base": float32(1e7), a + "attention.layer_norm_rms_epsilon": float32(1e-6),
		a + "expert_count": uint32(4), a + "expert_used_count": uint32(2),
		a + "expert_feed_forward_length": uint32(32), a + "expert_shared_feed_forward_length": uint32(32),
		a + "ssm.conv_kernel": uint32(4), a + "ssm.state_size": uint32(16), a + "ssm.group_count": uint32(2),
		a + "ssm.time_step_rank": uint32(4), a + "ssm.inner_size": uint32(64), a + "full_attention_interval": uint32(4),
	})
	if _, ok := f.kv[a+"feed_forward_length"]; ok {
		t.Error("a qwen35moe model has a dense feed-forward width")
	}
	e, hd, ff, x, sf := c.Embd, 32, 32, 4, 32
	keys, values := 16*2, 16*4
	want := map[string][]int{"token_embd.weight": {e, c.Vocab}, "output_norm.weight": {e}, "output.weight": {e, c.Vocab}}
	for i := range c.Layers {
		block := map[string][]int{
			"attn_norm.weight": {e}, "post_attention_norm.weight": {e},
			"ffn_gate_inp.weight": {e, x}, "ffn_gate_exps.weight": {e, ff, x}, "ffn_up_exps.weight": {e, ff, x},
			"ffn_down_exps.weight": {ff, e, x}, "ffn_gate_inp_shexp.weight": {e}, "ffn_gate_shexp.weight": {e, sf},
			"ffn_up_shexp.weight": {e, sf}, "ffn_down_shexp.weight": {sf, e},
		}
		if (i+1)%4 == 0 {
			for name, dims := range map[string][]int{
				"attn_q.weight": {e, 2 * hd * 2}, "attn_k.weight": {e, hd}, "attn_v.weight": {e, hd},
				"attn_output.weight": {hd * 2, e}, "attn_q_norm.weight": {hd}, "attn_k_norm.weight": {hd},
			} {
				block[name] = dims
			}
		} else {
			for name, dims := range map[string][]int{
				"attn_qkv.weight": {e, 2*keys + values}, "attn_gate.weight": {e, values},
				"ssm_conv1d.weight": {4, 2*keys + values}, "ssm_dt.bias": {4}, "ssm_a": {4},
				"ssm_beta.weight": {e, 4}, "ssm_alpha.weight": {e, 4}, "ssm_norm.weight": {16}, "ssm_out.weight": {values, e},
			} {
				block[name] = dims
			}
		}
		for name, dims := range block {
			want[fmt.Sprintf("blk.%d.%s", i, name)] = dims
		}
	}
	wantShapes(t, f, want, WeightQ8_0)
	if got, want := c.KVBytesPerToken(), 2*2*1*32*2; got != want {
		t.Errorf("KV %d bytes per token, want %d (two attention blocks of eight)", got, want)
	}
}

// A qwen35moe model with an MTP block is the model without it, tensor for
// tensor, plus the block llama.cpp's load_block_mtp asks for after the
// trunk's, counted in block_count and named by nextn_predict_layers.
func TestQwen35MoEMTP(t *testing.T) {
	c := TinyQwen35MoE()
	plain := writeParsed(t, c)
	c.MTP = 1
	f := writeParsed(t, c)
	a := "qwen35moe."
	wantKeys(t, f, map[string]any{a + "block_count": uint32(5), a + "nextn_predict_layers": uint32(1)})
	if _, ok := plain.kv[a+"nextn_predict_layers"]; ok {
		t.Error("a model without MTP names nextn_predict_layers")
	}
	mtp := map[string]parsedTensor{}
	for _, ts := range f.tensors {
		mtp[ts.name] = ts
	}
	for _, ts := range plain.tensors {
		got, ok := mtp[ts.name]
		if !ok || !slices.Equal(got.dims, ts.dims) || !bytes.Equal(got.data, ts.data) {
			t.Errorf("%s differs with the MTP block", ts.name)
		}
		delete(mtp, ts.name)
	}
	e, hd, ff, x, sf := c.Embd, 32, 32, 4, 32
	want := map[string][]int{
		"attn_norm.weight": {e}, "post_attention_norm.weight": {e},
		"attn_q.weight": {e, 2 * hd * 2}, "attn_k.weight": {e, hd}, "attn_v.weight": {e, hd},
		"attn_output.weight": {hd * 2, e}, "attn_q_norm.weight": {hd}, "attn_k_norm.weight": {hd},
		"ffn_gate_inp.weight": {e, x}, "ffn_gate_exps.weight": {e, ff, x}, "ffn_up_exps.weight": {e, ff, x},
		"ffn_down_exps.weight": {ff, e, x}, "ffn_gate_inp_shexp.weight": {e}, "ffn_gate_shexp.weight": {e, sf},
		"ffn_up_shexp.weight": {e, sf}, "ffn_down_shexp.weight": {sf, e},
		"nextn.eh_proj.weight": {2 * e, e}, "nextn.enorm.weight": {e}, "nextn.hnorm.weight": {e},
	}
	if len(mtp) != len(want) {
		t.Errorf("%d tensors beside the trunk's, want %d", len(mtp), len(want))
	}
	for name, dims := range want {
		if got := mtp["blk.4."+name]; !slices.Equal(got.dims, dims) {
			t.Errorf("blk.4.%s: dims %v, want %v", name, got.dims, dims)
		}
	}

}

// The DeltaNet parameters that decide whether the recurrent state stays
// bounded are in their ranges: every decay below one, the time-step bias
// near one.
func TestQwen35MoEStateParameters(t *testing.T) {
	f := writeParsed(t, TinyQwen35MoE())
	for _, ts := range f.tensors {
		lo, hi := float32(0), float32(0)
		switch {
		case strings.HasSuffix(ts.name, ".ssm_a"):
			lo, hi = -16, 0
		case strings.HasSuffix(ts.name, ".ssm_dt.bias"):
			lo, hi = 0.5, 1.5
		default:
			continue
		}
		for _, v := range ts.decode() {
			if v < lo || v >= hi {
				t.Errorf("%s has %v, want [%v, %v)", ts.name, v, lo, hi)
			}
		}
	}
}

// A gemma3 model has the tensors and keys llama.cpp's gemma3 loader asks
// for: norms after attention and FFN, per-head Q/K norms, the window and
// the local blocks' RoPE base; a pattern key only when it is not Gemma 3's.
func TestGemma3WellFormed(t *testing.T) {
	c := TinyGemma3()
	f := writeParsed(t, c)
	a := "gemma3."
	wantKeys(t, f, map[string]any{
		"general.architecture": "gemma3", a + "block_count": uint32(6), a + "feed_forward_length": uint32(128),
		a + "attention.key_length": uint32(32), a + "attention.value_length": uint32(32),
		a + "attention.sliding_window": uint32(32), a + "rope.freq_base": float32(1e6), a + "rope.freq_base_swa": float32(1e4),
		a + "attention.layer_norm_rms_epsilon": float32(1e-6), a + "attention.head_count_kv": uint32(1),
	})
	if _, ok := f.kv[a+"attention.sliding_window_pattern"]; ok {
		t.Error("Gemma 3's own pattern is written")
	}
	e, hd := c.Embd, 32
	want := map[string][]int{"token_embd.weight": {e, c.Vocab}, "output_norm.weight": {e}, "output.weight": {e, c.Vocab}}
	for i := range c.Layers {
		for name, dims := range map[string][]int{
			"attn_norm": {e}, "attn_q": {e, 2 * hd}, "attn_k": {e, hd}, "attn_v": {e, hd}, "attn_output": {2 * hd, e},
			"post_attention_norm": {e}, "attn_k_norm": {hd}, "attn_q_norm": {hd}, "ffn_norm": {e},
			"ffn_gate": {e, 128}, "ffn_up": {e, 128}, "ffn_down": {128, e}, "post_ffw_norm": {e},
		} {
			want[fmt.Sprintf("blk.%d.%s.weight", i, name)] = dims
		}
	}
	wantShapes(t, f, want, WeightF32)
	c.SWAPattern = 2
	if f := writeParsed(t, c); f.kv[a+"attention.sliding_window_pattern"] != uint32(2) {
		t.Error("pattern 2 is not written")
	}
}

// Every architecture is one model at every weight type.
func TestNewArchTypesAreOneModel(t *testing.T) {
	for _, base := range []Config{TinyQwen35MoE(), TinyGemma3()} {
		ref := writeParsed(t, base)
		for _, wt := range []WeightType{WeightF16, WeightQ8_0, WeightQ4_0} {
			c := base
			c.Type = wt
			f := writeParsed(t, c)
			for i, ts := range f.tensors {
				r := ref.tensors[i]
				if ts.name != r.name || !slices.Equal(ts.dims, r.dims) {
					t.Fatalf("%s %s: tensor %d is %s, want %s", base.Arch, wt, i, ts.name, r.name)
				}
				if ts.typ == typeF32 {
					if string(ts.data) != string(r.data) {
						t.Errorf("%s %s: %s is not the F32 model's", base.Arch, wt, ts.name)
					}
					continue
				}
				checkClose(t, wt, ts.name, ts.decode(), r.decode())
			}
		}
	}
}

func TestValidateArch(t *testing.T) {
	for _, tc := range []struct {
		base Config
		mut  func(*Config)
		want string
	}{
		{TinyQwen35MoE(), func(c *Config) { c.SSMHeads = 3 }, "not a multiple of ssm groups"},
		{TinyQwen35MoE(), func(c *Config) { c.HeadSize = 20 }, "multiple of 8"},
		{TinyQwen35MoE(), func(c *Config) { c.SharedFF = 0 }, "shared ff 0"},
		{TinyQwen35MoE(), func(c *Config) { c.FullAttnInterval = 0 }, "full attention interval 0"},
		{TinyQwen35MoE(), func(c *Config) { c.Experts = 0 }, "needs experts"},
		{TinyQwen35MoE(), func(c *Config) { c.SSMState, c.Type = 12, WeightQ8_0 }, "ssm_out.weight rows of 48"},
		{TinyGemma3(), func(c *Config) { c.Window = 0 }, "sliding window 0"},
		{TinyGemma3(), func(c *Config) { c.Experts, c.ExpertsUsed = 2, 1 }, "no experts"},
		{TinyGemma3(), func(c *Config) { c.SWAPattern = 0 }, "pattern 0"},
		{Tiny(), func(c *Config) { c.Window = 8 }, "are for qwen35moe and gemma3"},
		{TinyGemma3(), func(c *Config) { c.MTP = 1 }, "MTP blocks are for qwen35moe, not gemma3"},
		{TinyQwen35MoE(), func(c *Config) { c.MTP = 2 }, "2 MTP blocks"},
		{TinyMoE(), func(c *Config) { c.HeadSize = 64 }, "head size must be 0"},
	} {
		c := tc.base
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %+v: %v, want %q", c.Arch, c, err, tc.want)
		}
	}
	// The production shapes validate (their weights are not written here).
	prod := TinyQwen35MoE()
	prod.Layers, prod.Embd, prod.Heads, prod.KVHeads, prod.HeadSize = 40, 2048, 16, 2, 256
	prod.Experts, prod.ExpertsUsed, prod.ExpertFF, prod.SharedFF = 256, 8, 512, 512
	prod.SSMState, prod.SSMGroups, prod.SSMHeads, prod.Type = 128, 16, 32, WeightQ4_0
	if err := prod.Validate(); err != nil || !slices.Equal(prod.ropeSections(), []int32{11, 11, 10, 0}) {
		t.Errorf("Qwen3.6-35B-A3B's shapes: %v, sections %v", err, prod.ropeSections())
	}
	if _, err := TinyFor("mamba"); err == nil || !strings.Contains(err.Error(), `architecture "mamba"`) {
		t.Errorf("TinyFor(mamba): %v", err)
	}
}
