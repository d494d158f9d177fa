package llamaopt

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestParseOptions(t *testing.T) {
	o, err := Parse(nil)
	if err != nil || o.NCtx != DefaultNCtx || o.FlashAttn != FlashOn || o.NGPULayers != -1 || o.NThreadsBatch != o.NThreads ||
		o.CacheTypeK != "f16" || !o.Mmap || o.EagerLogits {
		t.Fatalf("defaults %+v, %v", o, err)
	}
	for v, want := range map[string]bool{"lazy": false, "Eager": true, " LAZY ": false} {
		if o, err := Parse(map[string]string{OptRestoreLogits: v}); err != nil || o.EagerLogits != want {
			t.Fatalf("restore_logits=%q: eager %v, %v", v, o.EagerLogits, err)
		}
	}
	o, err = Parse(map[string]string{OptNCtx: " 8192 ", OptFlashAttn: "off", OptNThreads: "3", OptNGPULayers: "0",
		OptCacheTypeK: "Q8_0", OptAlias: "m", OptLibDir: "/opt/lib", OptMmap: "false", OptNBatch: "512", OptNUBatch: "128"})
	if err != nil || o.NCtx != 8192 || o.FlashAttn != FlashOff || o.NThreads != 3 || o.NThreadsBatch != 3 || o.NGPULayers != 0 ||
		o.CacheTypeK != "q8_0" || o.Alias != "m" || o.LibDir != "/opt/lib" || o.Mmap || o.NBatch != 512 || o.NUBatch != 128 {
		t.Fatalf("parsed %+v, %v", o, err)
	}
	for _, tc := range []struct {
		opts map[string]string
		msg  string
	}{
		{map[string]string{"nctx": "1"}, `unknown option "nctx"`},
		{map[string]string{OptNCtx: "0"}, "out of range"},
		{map[string]string{OptNCtx: "lots"}, "not an integer"},
		{map[string]string{OptFlashAttn: "maybe"}, "on, off or auto"},
		{map[string]string{OptCacheTypeV: "q2_k"}, "want one of"},
		{map[string]string{OptCacheTypeV: "q4_0", OptFlashAttn: "off"}, "needs flash attention"},
		{map[string]string{OptAlias: " "}, "must not be empty"},
		{map[string]string{OptMmap: "perhaps"}, "not a boolean"},
		{map[string]string{OptNGPULayers: "-2"}, "out of range"},
		{map[string]string{OptRestoreLogits: "later"}, "lazy or eager"},
	} {
		_, err := Parse(tc.opts)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: %v, want ErrBadRequest mentioning %q", tc.opts, err, tc.msg)
		}
	}
}

// A settled experiment switch is refused as removed, whatever its value,
// not taken for a typo nor ignored; the unknown-option list leaves it out.
func TestRemovedOptions(t *testing.T) {
	for _, key := range []string{"pin_ring", "copy_threads", "stream_restore", "cuda_sync", "restore_in_place"} {
		_, err := Parse(map[string]string{key: "true", OptNCtx: "1024"})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), fmt.Sprintf("option %q was removed", key)) {
			t.Errorf("%s: %v, want ErrBadRequest saying it was removed", key, err)
		}
	}
	_, err := Parse(map[string]string{"nctx": "1"})
	for key := range removedOptions {
		if strings.Contains(err.Error(), key) {
			t.Errorf("the known options name %s: %v", key, err)
		}
	}
}

func TestPlacementOptions(t *testing.T) {
	o, err := Parse(map[string]string{OptNCPUMoE: "2",
		OptOverrideTensor: `token_embd\.weight=CPU, output\.weight=CUDA0,(?=x)=y=CPU`})
	if err != nil {
		t.Fatal(err)
	}
	want := []PlacementRule{{`token_embd\.weight`, "CPU"}, {`output\.weight`, "CUDA0"}, {`(?=x)=y`, "CPU"},
		{`blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps`, "CPU"}, {`blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps`, "CPU"}}
	if got := o.Rules(); !slices.Equal(got, want) {
		t.Fatalf("rules %v, want %v", got, want)
	}
	if o, err := Parse(nil); err != nil || len(o.Rules()) != 0 {
		t.Fatalf("no placement: %v, %v", o.Rules(), err)
	}
	for _, tc := range []struct {
		v, msg string
	}{
		{"CPU", `"CPU" is not PATTERN=DEVICE`},
		{"=CPU", `"=CPU" is not PATTERN=DEVICE`},
		{`blk\.0=`, `is not PATTERN=DEVICE`},
		{`a=CPU,,b=CPU`, `"" is not PATTERN=DEVICE`},
	} {
		_, err := Parse(map[string]string{OptOverrideTensor: tc.v})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("override_tensor=%q: %v, want %q", tc.v, err, tc.msg)
		}
	}
	if _, err := Parse(map[string]string{OptNCPUMoE: "-1"}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("n_cpu_moe=-1: %v", err)
	}
}

// The n_cpu_moe pattern is llama.cpp's: a layer's experts, not another
// layer's, not the router, not a dense FFN.
func TestExpertsPattern(t *testing.T) {
	re := regexp.MustCompile(expertsPattern(1)) // the same in RE2 and ECMAScript
	for name, want := range map[string]bool{
		"blk.1.ffn_up_exps.weight": true, "blk.1.ffn_down_exps.weight": true, "blk.1.ffn_gate_exps.weight": true,
		"blk.1.ffn_gate_up_exps.weight": true, "blk.1.ffn_up_chexps.weight": true,
		"blk.10.ffn_up_exps.weight": false, "blk.11.ffn_up_exps.weight": false, "blk.1.ffn_gate_inp.weight": false,
		"blk.1.ffn_up.weight": false, "blk.0.ffn_up_exps.weight": false,
	} {
		if re.MatchString(name) != want {
			t.Errorf("%s: match %v, want %v", name, !want, want)
		}
	}
}

func TestGPULayersAndRope(t *testing.T) {
	for v, want := range map[string]int{"all": -1, "ALL": -1, "-1": -1, "0": 0, "33": 33} {
		if o, err := Parse(map[string]string{OptNGPULayers: v}); err != nil || o.NGPULayers != want {
			t.Errorf("n_gpu_layers=%s: %d, %v", v, o.NGPULayers, err)
		}
	}
	if _, err := Parse(map[string]string{OptNGPULayers: "most"}); err == nil || !strings.Contains(err.Error(), "not an integer (or all)") {
		t.Errorf("n_gpu_layers=most: %v", err)
	}
	o, err := Parse(nil)
	if err != nil || o.RopeScaling != ropeUnspecified || o.RopeFreqScale != 0 || o.YarnOrigCtx != 0 {
		t.Fatalf("rope defaults %+v, %v", o.RopeOptions, err)
	}
	o, err = Parse(map[string]string{OptRopeScaling: "YaRN", OptRopeScale: "5", OptYarnOrigCtx: "32768"})
	if err != nil || o.RopeScaling != ropeYaRN || o.RopeFreqScale != 0.2 || o.YarnOrigCtx != 32768 {
		t.Fatalf("rope %+v, %v", o.RopeOptions, err)
	}
	for k, v := range map[string]string{OptRopeScaling: "ntk", OptRopeScale: "0", OptYarnOrigCtx: "-1"} {
		if _, err := Parse(map[string]string{k: v}); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
	if _, err := Parse(map[string]string{OptRopeScale: "inf"}); err == nil {
		t.Error("rope_scale=inf accepted")
	}
}

// TestBooleanOptionsAlike: every boolean option takes the same forms
// (strconv's and on/off), as flash_attn takes on/off.
func TestBooleanOptionsAlike(t *testing.T) {
	for _, c := range []struct {
		key  string
		get  func(Options) bool
		flip bool // the field is the option's negation
	}{
		{OptKVUnified, func(o Options) bool { return o.KVSplit }, true},
		{OptContextShift, func(o Options) bool { return o.ContextShift }, false},
		{OptSWAFull, func(o Options) bool { return o.SWAFull }, false},
		{OptMmap, func(o Options) bool { return o.Mmap }, false},
	} {
		for v, want := range map[string]bool{"on": true, "ON": true, "off": false, "true": true, "0": false, "1": true, "False": false} {
			o, err := Parse(map[string]string{c.key: v})
			if err != nil || c.get(o) != (want != c.flip) {
				t.Errorf("%s=%s: %v, %v", c.key, v, c.get(o) != c.flip, err)
			}
		}
		if _, err := Parse(map[string]string{c.key: "perhaps"}); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "on/off") {
			t.Errorf("%s=perhaps: %v", c.key, err)
		}
	}
}
