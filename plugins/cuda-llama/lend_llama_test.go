//go:build llama && cgo

package cudallama

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Combined mode between two engines, both backends in this process: the
// peer's LendWeights is the head's BindPeer's registry.

func lend(t *testing.T, b *Backend) iface.WeightRegistry {
	t.Helper()
	reg, err := b.LendWeights(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Check(); err != nil {
		t.Fatalf("the registry fails its own check: %v", err)
	}
	return reg
}

// TestLendWeights: every weight is lent with its type and shape; those in
// host memory that llama.cpp uses from the mapped file name the file and
// the offset of their bytes there; the generation follows a swap and
// comes back with it.
func TestLendWeights(t *testing.T) {
	path := swapModel(t, gguf.WeightF16, "", 0)
	b := load(t, path, 1, swapOptions(t))
	reg := lend(t, b)
	if reg.Arch != "qwen3moe" || len(reg.Weights) != len(b.eng.Load().swap.names) {
		t.Fatalf("arch %q, %d weights", reg.Arch, len(reg.Weights))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	experts := 0
	for _, w := range reg.Weights {
		if regexp.MustCompile(expertWeights).MatchString(w.Name) {
			experts++
			if w.Type != "f16" || len(w.Shape) != 3 {
				t.Errorf("%s: %s %v", w.Name, w.Type, w.Shape)
			}
		}
		if w.File == "" {
			continue
		}
		// The lent bytes are the weight's: what the engine computes with.
		if w.File != path || w.Offset+w.Bytes > int64(len(data)) {
			t.Fatalf("%s lent at %s:%d", w.Name, w.File, w.Offset)
		}
	}
	if experts != 12 {
		t.Fatalf("%d experts lent", experts)
	}
	if !slices.ContainsFunc(reg.Weights, func(w iface.LentWeight) bool { return w.File != "" }) {
		t.Fatal("no weight lent from its file")
	}

	if _, err := b.SwapQuant(context.Background(), "q8", expertWeights); err != nil {
		t.Fatal(err)
	}
	swapped := lend(t, b)
	if swapped.Generation == reg.Generation {
		t.Fatal("the generation stayed across a swap")
	}
	for _, w := range swapped.Weights {
		if regexp.MustCompile(expertWeights).MatchString(w.Name) && (w.Type != "q8_0" || !strings.HasSuffix(w.File, "swap-q8_0.gguf")) {
			t.Fatalf("%s after the swap: %s from %q", w.Name, w.Type, w.File)
		}
	}
	if _, err := b.SwapQuant(context.Background(), "base", expertWeights); err != nil {
		t.Fatal(err)
	}
	if back := lend(t, b); back.Generation != reg.Generation {
		t.Fatal("swapping back gave another generation")
	}
}

// TestBindPeerMatchesOracle: a head at F16 bound to a peer whose experts
// are Q8_0 computes exactly what llama.cpp computes loading the F16 model
// with Q8_0 experts; solo computes the head's own model again.
func TestBindPeerMatchesOracle(t *testing.T) {
	opts := map[string]string{llamaopt.OptNCtx: "512"}
	peer := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, swapOptions(t))
	if _, err := peer.SwapQuant(context.Background(), "q8", expertWeights); err != nil {
		t.Fatal(err)
	}
	head := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, opts)
	own := compute(t, head)
	res, err := head.BindPeer(context.Background(), lend(t, peer))
	if err != nil || res.Mode != "combined" || res.Bound != 12 {
		t.Fatalf("BindPeer: %+v %v", res, err)
	}
	if got := info(t, head); got.ExpertMode != "combined" || got.Quants != nil {
		t.Fatalf("info when bound: %+v", got)
	}
	oracle := load(t, swapModel(t, gguf.WeightF16, expertWeights, gguf.WeightQ8_0), 1, opts)
	if !same(compute(t, head), compute(t, oracle)) {
		t.Fatal("bound to the peer's Q8_0 experts, the head computes otherwise than the oracle")
	}
	if _, err := head.SwapQuant(context.Background(), "base", expertWeights); err == nil {
		t.Fatal("a swap on a bound head was taken")
	}
	if mode, err := head.SetExpertMode(context.Background(), "solo"); err != nil || mode != "solo" {
		t.Fatalf("solo: %q %v", mode, err)
	}
	if !same(compute(t, head), own) {
		t.Fatal("solo again, the head computes otherwise than before")
	}
}

// TestBindPeerRefusals: what cannot be bound answers solo with the reason,
// and the head computes with its own weights.
func TestBindPeerRefusals(t *testing.T) {
	opts := map[string]string{llamaopt.OptNCtx: "512"}
	peer := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, opts)
	head := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, opts)
	own := compute(t, head)
	good := lend(t, peer)
	edit := func(f func(*iface.WeightRegistry)) iface.WeightRegistry {
		r := good
		r.Weights = slices.Clone(good.Weights)
		f(&r)
		return r
	}
	expert := slices.IndexFunc(good.Weights, func(w iface.LentWeight) bool { return regexp.MustCompile(expertWeights).MatchString(w.Name) })
	for _, tc := range []struct {
		name string
		reg  iface.WeightRegistry
		why  string
	}{
		{"another architecture", edit(func(r *iface.WeightRegistry) { r.Arch = "llama" }), `the peer's model is a "llama"`},
		{"a weight missing", edit(func(r *iface.WeightRegistry) { r.Weights = slices.Delete(r.Weights, expert, expert+1) }), "the peer lends no weight blk."},
		{"another shape", edit(func(r *iface.WeightRegistry) { r.Weights[expert].Shape = []int64{64, 48, 4} }), "shape [64 48 4] on the peer"},
		{"device memory", edit(func(r *iface.WeightRegistry) {
			r.Weights[expert].File, r.Weights[expert].Offset, r.Weights[expert].Device = "", 0, "CUDA0"
		}),
			"is in CUDA0 memory, not in a file this engine can map: binding a peer's device memory (CUDA IPC) is not built"},
		{"a file gone", edit(func(r *iface.WeightRegistry) { r.Weights[expert].File = "/nonexistent/model.gguf" }), "no such file"},
		{"an offset moved", edit(func(r *iface.WeightRegistry) { r.Weights[expert].Offset += 32 }), "the file changed since the peer mapped it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := head.BindPeer(context.Background(), tc.reg)
			if err != nil || res.Mode != "solo" || !strings.Contains(res.Reason, tc.why) {
				t.Fatalf("%+v %v, want solo because %q", res, err, tc.why)
			}
			if !same(compute(t, head), own) {
				t.Fatal("a refused bind changed what the head computes")
			}
		})
	}
	// Bound, then refused: back to the head's own weights.
	if res, _ := head.BindPeer(context.Background(), good); res.Mode != "combined" {
		t.Fatalf("bind: %+v", res)
	}
	if res, _ := head.BindPeer(context.Background(), edit(func(r *iface.WeightRegistry) { r.Arch = "llama" })); res.Mode != "solo" {
		t.Fatalf("a refusal while bound: %+v", res)
	}
	if !same(compute(t, head), own) {
		t.Fatal("refused while bound, the head computes otherwise than with its own weights")
	}
}

// TestBindPeerBesideInfo: a first bind adds the peer's file as a source
// while Info reads the sources (go test -race sees them shared).
func TestBindPeerBesideInfo(t *testing.T) {
	opts := map[string]string{llamaopt.OptNCtx: "512"}
	peer := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, opts)
	head := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, opts)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				info(t, head)
			}
		}
	}()
	res, err := head.BindPeer(context.Background(), lend(t, peer))
	close(stop)
	<-done
	if err != nil || res.Mode != "combined" {
		t.Fatalf("BindPeer: %+v %v", res, err)
	}
}
