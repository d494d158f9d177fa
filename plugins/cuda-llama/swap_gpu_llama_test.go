//go:build llama && cgo

package cudallama

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// SWAP_QUANT and combined mode on GPUs: what only a GPU can show (uploads
// to device memory, device memory over many swaps, expert operations on a
// second GPU), on a synthetic MoE of several GB. They skip without a GPU
// (libggml-cuda.so beside the test binary) and in -short mode; combined
// mode's test needs two GPUs (CUDA1). HYDRA_TEST_SWAP_GPU_LAYERS sizes the
// model (default 6 layers: 3.6 GB of F16 experts).

// requireGPU skips unless the backend runs on a GPU.
func requireGPU(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the GPU swap tests write several GB of models")
	}
	if b := load(t, tiny(t), 1, nil); b.eng.Load().device == "" {
		t.Skip("no GPU (libggml-cuda.so beside the test binary): uploads and device memory are a GPU's")
	}
}

var gpuModels struct {
	once        sync.Once
	f16, q8, q4 string
	err         error
}

// gpuMoE writes the synthetic MoE at F16, Q8_0 and Q4_0, at once.
func gpuMoE(t *testing.T) (f16, q8, q4 string) {
	t.Helper()
	g := &gpuModels
	g.once.Do(func() {
		c := gguf.TinyMoE()
		c.Name, c.Embd, c.Heads, c.KVHeads, c.Vocab = "hydra-gpu-moe", 2048, 16, 4, 8192
		c.Experts, c.ExpertsUsed, c.ExpertFF, c.Layers = 64, 8, 768, 6
		if n, err := strconv.Atoi(os.Getenv("HYDRA_TEST_SWAP_GPU_LAYERS")); err == nil && n > 0 {
			c.Layers = n
		}
		paths := []*string{&g.f16, &g.q8, &g.q4}
		errs := make([]error, 3)
		start := time.Now()
		var wg sync.WaitGroup
		for i, w := range []gguf.WeightType{gguf.WeightF16, gguf.WeightQ8_0, gguf.WeightQ4_0} {
			*paths[i] = filepath.Join(modelDir, fmt.Sprintf("gpu-moe-%d-%s.gguf", c.Layers, w))
			cw := c
			cw.Type = w
			wg.Go(func() { errs[i] = gguf.WriteFile(*paths[i], cw) })
		}
		wg.Wait()
		g.err = errors.Join(errs...)
		fmt.Fprintf(os.Stderr, "wrote the %d-layer GPU MoE at f16, q8_0, q4_0 in %v\n", c.Layers, time.Since(start).Round(time.Second))
	})
	if g.err != nil {
		t.Fatal(g.err)
	}
	return g.f16, g.q8, g.q4
}

// tokPerSec decodes n tokens in slot 0 after a fresh prefill (EOS ignored)
// and returns the rate.
func tokPerSec(t *testing.T, b *Backend, n int) float64 {
	t.Helper()
	if err := b.ClearSlot(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	prefill(t, b, 0, story)
	start := time.Now()
	toks, _ := decode(t, b, 0, n, iface.SamplerParams{IgnoreEOS: true})
	return float64(len(toks)) / time.Since(start).Seconds()
}

// batchedTokPerSec decodes n tokens in each of the slots at once.
func batchedTokPerSec(t *testing.T, b *Backend, slots, n int) float64 {
	t.Helper()
	ids := make([]int, slots)
	for s := range slots {
		ids[s] = s
		prefill(t, b, s, prompts[s%len(prompts)])
	}
	start := time.Now()
	got := decodeAll(t, b, ids, n, iface.SamplerParams{IgnoreEOS: true})
	total := 0
	for _, toks := range got {
		total += len(toks)
	}
	return float64(total) / time.Since(start).Seconds()
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// expertHome is the device an expert weight is on now.
func expertHome(t *testing.T, x *swapper) string {
	t.Helper()
	moved, _ := experts(x)
	if len(moved) == 0 {
		t.Fatal("no experts")
	}
	return moved[0].device
}

// TestSwapQuantGPU measures swaps of the experts on the GPU: the first
// swap's upload against a plain host-to-device copy of the same bytes from
// the page cache (target: within 1.5×), a swap back (pointers only), one
// layer's experts, the device memory over 20 swaps back and forth (flat:
// the copies are made once), and decode speed per quantisation.
func TestSwapQuantGPU(t *testing.T) {
	requireGPU(t)
	f16, q8, q4 := gpuMoE(t)
	b := load(t, f16, 4, map[string]string{llamaopt.OptQuantPrefix + "q8": q8, llamaopt.OptQuantPrefix + "q4": q4, llamaopt.OptNCtx: "4096", llamaopt.OptNGPULayers: "all"})
	x := b.eng.Load().swap
	home := expertHome(t, x)
	free := func() int64 { f, _, _ := deviceMemory(home); return f }
	swap := func(key, pattern string) (iface.SwapResult, applied) {
		res, err := b.SwapQuant(context.Background(), key, pattern)
		if err != nil {
			t.Fatal(err)
		}
		return res, x.state.last
	}
	t.Logf("experts on %s, layers %s, split %s", home, info(t, b).LayerSplit, info(t, b).SplitMode)
	rate := map[string]float64{"f16": tokPerSec(t, b, 128)}
	free0 := free()

	res, a := swap("q8", expertWeights)
	baseline := x.uploadBaseline(expertWeights, "q8")
	t.Logf("all experts to q8 (first): swap %v, upload %v of %s (%.1f GB/s), plain copy %v (%.1f GB/s), graph reset %v",
		res.Duration, a.upload, mib(a.uploaded), float64(a.uploaded)/a.upload.Seconds()/1e9, baseline,
		float64(a.uploaded)/baseline.Seconds()/1e9, a.reset)
	if a.uploaded == 0 || a.upload > baseline*3/2 {
		t.Errorf("the upload took %v, the plain copy %v: beyond 1.5×", a.upload, baseline)
	}
	rate["q8 experts"] = tokPerSec(t, b, 128)
	res, _ = swap("base", expertWeights)
	t.Logf("all experts back to base: swap %v", res.Duration)

	layer := `blk\.3\.ffn_(gate|up|down)_exps`
	res, a = swap("q4", layer)
	t.Logf("layer 3's experts to q4 (first): swap %v, upload %v of %s, plain copy %v", res.Duration, a.upload, mib(a.uploaded),
		x.uploadBaseline(layer, "q4"))
	swap("base", layer)

	free1 := free()
	allocated1, _ := x.resident()
	var durations []time.Duration
	for range 20 {
		for _, key := range []string{"q8", "base"} {
			res, _ := swap(key, expertWeights)
			durations = append(durations, res.Duration)
		}
	}
	free20 := free()
	allocated20, _ := x.resident()
	t.Logf("device memory free: %s before any swap, %s after the first swaps (copies %s), %s after 20 more rounds (copies %s); swaps %v…%v",
		mib(free0), mib(free1), mib(allocated1), mib(free20), mib(allocated20), slices.Min(durations), slices.Max(durations))
	if allocated20 != allocated1 || abs64(free20-free1) > 64<<20 {
		t.Errorf("20 rounds of swaps moved device memory by %s (copies %s → %s)", mib(free1-free20), mib(allocated1), mib(allocated20))
	}

	swap("q4", ".*")
	rate["q4"] = tokPerSec(t, b, 128)
	swap("base", ".*")
	t.Logf("decode tok/s (1 slot): %v", rate)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// TestCombinedGPU: with two GPUs, "combined" copies the experts that are
// not on GPU1 there (GPU1's memory grows by their bytes), ggml runs their
// operations on GPU1, the greedy tokens equal solo's and states round-trip
// byte for byte; it logs batched decode speed solo and combined.
func TestCombinedGPU(t *testing.T) {
	requireGPU(t)
	if _, _, ok := deviceMemory("CUDA1"); !ok {
		t.Skip("combined mode on GPUs needs a second one (CUDA1)")
	}
	f16, _, _ := gpuMoE(t)
	b := load(t, f16, 4, map[string]string{llamaopt.OptCombinedPeer: "cuda:1", llamaopt.OptNCtx: "4096", llamaopt.OptNGPULayers: "all"})
	x := b.eng.Load().swap
	moved, _ := experts(x)
	var expected int64
	for _, w := range moved {
		if w.device != "CUDA1" {
			expected += w.bytes
		}
	}
	t.Logf("layers %s (split %s): %s of experts to copy onto CUDA1", info(t, b).LayerSplit, info(t, b).SplitMode, mib(expected))

	solo := compute(t, b)
	soloRate := batchedTokPerSec(t, b, 4, 64)
	before, _, _ := deviceMemory("CUDA1")
	start := time.Now()
	if mode, err := b.SetExpertMode(context.Background(), "combined"); err != nil || mode != "combined" {
		t.Fatalf("combined: %q, %v", mode, err)
	}
	took := time.Since(start)
	after, _, _ := deviceMemory("CUDA1")
	a := x.state.last
	t.Logf("combined: %v (upload %v of %s, graph reset %v); CUDA1 free %s → %s (+%s used); %d of %d expert operations on their weights' GPU",
		took, a.upload, mib(a.uploaded), a.reset, mib(before), mib(after), mib(before-after), a.opsLocal, a.ops)
	if grew := before - after; grew < expected || grew > expected+1<<30 {
		t.Errorf("CUDA1 grew by %s for %s of experts", mib(grew), mib(expected))
	}
	re := regexp.MustCompile(llamaopt.DefaultCombinedPattern)
	for _, w := range x.weights() {
		if re.MatchString(w.name) && w.device != "CUDA1" {
			t.Errorf("combined: %s is on %s", w.name, w.device)
		}
	}
	if a.ops == 0 || a.opsLocal != a.ops {
		t.Errorf("%d of %d expert operations run on their weights' GPU", a.opsLocal, a.ops)
	}
	if got := compute(t, b); !slices.Equal(got.tokens, solo.tokens) {
		t.Errorf("combined decoded %v, solo %v", got.tokens, solo.tokens)
	}
	checkStateRoundTrip(t, b)
	combinedRate := batchedTokPerSec(t, b, 4, 64)
	if mode, _ := b.SetExpertMode(context.Background(), "solo"); mode != "solo" {
		t.Fatalf("solo: %q", mode)
	}
	t.Logf("batched decode, 4 slots: solo %.1f tok/s, combined %.1f tok/s", soloRate, combinedRate)
}
