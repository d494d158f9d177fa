package cudallama

import (
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestSpecRuleBatchShare(t *testing.T) {
	r := specRule{nMax: 8, batchMax: 16}
	for _, tc := range []struct{ decoders, want int }{{1, 8}, {2, 7}, {4, 3}, {8, 1}, {9, 0}, {32, 0}} {
		a := newAcceptance()
		if got := r.draftLen(&a, 0, tc.decoders, 100); got != tc.want {
			t.Errorf("%d decoders: draft %d, want %d", tc.decoders, got, tc.want)
		}
	}
}

func TestSpecRuleLimits(t *testing.T) {
	r := specRule{nMax: 8, nMin: 3, batchMax: 64}
	a := newAcceptance()
	if got := r.draftLen(&a, 5, 1, 100); got != 5 {
		t.Errorf("request n_max 5: draft %d", got)
	}
	if got := r.draftLen(&a, 0, 1, 4); got != 4 {
		t.Errorf("room 4: draft %d", got)
	}
	if got := r.draftLen(&a, 0, 1, 2); got != 0 {
		t.Errorf("room 2 under draft_min 3: draft %d, want 0", got)
	}
}

// TestSpecRuleAcceptance: a falling acceptance rate shortens the drafts,
// then stops them, with a one-token probe every specProbeEvery steps; a
// rising one brings them back.
func TestSpecRuleAcceptance(t *testing.T) {
	r := specRule{nMax: 16, batchMax: 64}
	a := newAcceptance()
	prev := r.draftLen(&a, 0, 1, 100)
	if prev != 16 {
		t.Fatalf("fresh sequence drafts %d, want 16", prev)
	}
	for range 40 { // every draft rejected at its first token
		a.record(prev, 0)
		k := r.draftLen(&a, 0, 1, 100)
		if k > prev && prev > 0 {
			t.Fatalf("draft grew from %d to %d on rejections", prev, k)
		}
		prev = k
	}
	if a.rate() > specMinGain {
		t.Fatalf("rate %.3f after 40 rejections", a.rate())
	}
	probes := 0
	for range 3 * specProbeEvery {
		if r.draftLen(&a, 0, 1, 100) == 1 {
			probes++
		}
	}
	if probes != 3 {
		t.Errorf("%d probes in %d steps, want 3", probes, 3*specProbeEvery)
	}
	for range 40 {
		a.record(4, 4)
	}
	if k := r.draftLen(&a, 0, 1, 100); k < 8 {
		t.Errorf("after full acceptance the draft is %d (rate %.3f)", k, a.rate())
	}
	if a.drafted == 0 || a.acceptedTotal > a.drafted {
		t.Errorf("totals %d accepted of %d drafted", a.acceptedTotal, a.drafted)
	}
}

func TestWorthDrafting(t *testing.T) {
	for _, tc := range []struct {
		p    float64
		want int
	}{{0.2, 0}, {0.5, 2}, {0.8, 6}, {0.9, 13}} {
		if got := worthDrafting(tc.p); got != tc.want {
			t.Errorf("p %.2f: %d, want %d", tc.p, got, tc.want)
		}
	}
}

func TestRequestBounds(t *testing.T) {
	sp := iface.NoSpeculativeOverride
	if m, n, off := requestBounds(&sp); m != 0 || n != 0 || off {
		t.Errorf("no override: %d %d %v", m, n, off)
	}
	sp.NMax, sp.NMin = 5, 2
	if m, n, off := requestBounds(&sp); m != 5 || n != 2 || off {
		t.Errorf("5, 2: %d %d %v", m, n, off)
	}
	sp.NMax = 0
	if _, _, off := requestBounds(&sp); !off {
		t.Error("n_max 0 leaves drafting on")
	}
	if m, n, off := requestBounds(nil); m != 0 || n != 0 || off {
		t.Errorf("nil: %d %d %v", m, n, off)
	}
}
