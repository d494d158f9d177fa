//go:build llama && cgo

package cudallama

import (
	"bytes"
	"math"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// The oracles of tests that compare a sequence decoded in a batch, or after
// prompt reuse, with the same sequence decoded another way. On the CPU the
// two are equal bit for bit (the tests pick ggml's reference kernels where
// the default ones would differ). On a GPU they need not be: llama.cpp's CUDA
// kernels are not batch-invariant (a step of one sequence and a step of four
// take other matrix and attention kernels, whose sums round differently), so
// there greedy sequences may part, but only where the two candidates were
// tied within rounding. These helpers check the exact claim on the CPU and
// that weaker one, measured, on a GPU.

// tieShare is the share of the logits' range (max − min) within which two
// candidates count as tied on a GPU: rounding moves logits by far less
// (F16 sums: ~1e-3 relative), a wrong batch row by the whole range.
const tieShare = 0.01

func onGPU(b *Backend) bool { return b.eng.Load().device != "" }

// sameGreedy checks that got, the tokens a slot decoded after prompt, are
// want, decoded after the same prompt another way, with sp at temperature 0.
// On a GPU where they part, it evaluates prompt and want's tokens before that
// point in slot of b (replacing what the slot holds) and checks that the
// token each chose was, after sp's penalties, within tieShare of the other.
func sameGreedy(t *testing.T, b *Backend, slot int, prompt, got, want []int32, sp iface.SamplerParams) {
	t.Helper()
	i := iface.CommonPrefix(got, want) // where they part
	if i == len(got) && i == len(want) {
		return
	}
	if !onGPU(b) || i >= len(got) || i >= len(want) {
		t.Errorf("slot %d: %v\nwant %v (first difference at token %d)", slot, got, want, i)
		return
	}
	seq := append(slices.Clone(prompt), want[:i]...)
	prefillTokens(t, b, slot, seq)
	// The slot's logits: a recurrent model's reply carries them in its state.
	_, logits, _ := b.eng.Load().cells.Slots[slot].Snapshot()
	if len(logits) == 0 {
		t.Fatalf("slot %d holds no logits after a prefill", slot)
	}
	logits = penalized(logits, seq, sp, penaltyWindow(sp, b.eng.Load().cells.SlotCtx))
	lo, hi := slices.Min(logits), slices.Max(logits)
	gap := math.Abs(float64(logits[want[i]] - logits[got[i]]))
	if gap > tieShare*float64(hi-lo) {
		t.Errorf("slot %d parts at token %d: %d where %d, whose logits are %.4g apart (the logits span %.4g): not a tie\ngot  %v\nwant %v",
			slot, i, got[i], want[i], gap, hi-lo, got, want)
		return
	}
	t.Logf("slot %d parts at token %d of %d on the GPU, at a tie: %d and %d are %.3g apart (%.2g%% of the logits' range)",
		slot, i, len(want), got[i], want[i], gap, 100*gap/float64(hi-lo))
}

// penalized applies llama.cpp's repetition penalties (its penalties
// sampler's rule) over the last lastN tokens of history to a copy of logits.
func penalized(logits []float32, history []int32, sp iface.SamplerParams, lastN int) []float32 {
	out := slices.Clone(logits)
	if lastN <= 0 {
		return out
	}
	count := map[int32]int{}
	for _, id := range history[max(len(history)-lastN, 0):] {
		count[id]++
	}
	repeat := sp.RepeatPenalty
	if repeat <= 0 {
		repeat = 1
	}
	for id, c := range count {
		if out[id] <= 0 {
			out[id] *= repeat
		} else {
			out[id] /= repeat
		}
		out[id] -= float32(c)*sp.FrequencyPenalty + sp.PresencePenalty
	}
	return out
}

// closeLogits checks two evaluations of the same position: equal on the
// CPU, within tieShare of the range on a GPU.
func closeLogits(t *testing.T, b *Backend, what string, got, want []float32) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	if !onGPU(b) || len(got) != len(want) || len(want) == 0 {
		t.Errorf("%s: the logits differ", what)
		return
	}
	var worst float64
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	if span := float64(slices.Max(want) - slices.Min(want)); worst > tieShare*span {
		t.Errorf("%s: logits up to %.4g apart (they span %.4g)", what, worst, span)
	} else {
		t.Logf("%s: on the GPU the logits are up to %.3g apart (%.2g%% of their range)", what, worst, 100*worst/span)
	}
}

// sameState checks two states of the same sequence: equal bytes on the CPU;
// on a GPU, where the values may differ in their last bits, the same size
// and the same cells (positions and sequences).
func sameState(t *testing.T, b *Backend, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if !onGPU(b) || len(got) != len(want) {
		t.Errorf("%s: the states differ (%d and %d bytes)", what, len(got), len(want))
		return
	}
	if n := cellsEnd(want); n <= 0 || !bytes.Equal(got[:n], want[:n]) {
		t.Errorf("%s: the states' cells differ", what)
	}
}

// cellsEnd is the end of a plain cache state's first stream's cell list
// (statehead.go: streams, cells, then each cell's position and sequences).
func cellsEnd(s []byte) int {
	w := &stateWalker{b: s}
	if w.u32() == 0 {
		return 0
	}
	for c, cells := int64(0), w.u32(); c < cells && w.err == nil; c++ {
		w.skip(4)
		w.skip(4 * w.u32())
	}
	if w.err != nil {
		return 0
	}
	return w.off
}
