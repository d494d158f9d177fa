package sched

import (
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestRequestBounds(t *testing.T) {
	sp := iface.NoSpeculativeOverride
	if m, n, off := RequestBounds(&sp); m != 0 || n != 0 || off {
		t.Errorf("no override: %d %d %v", m, n, off)
	}
	sp.NMax, sp.NMin = 5, 2
	if m, n, off := RequestBounds(&sp); m != 5 || n != 2 || off {
		t.Errorf("5, 2: %d %d %v", m, n, off)
	}
	sp.NMax = 0
	if _, _, off := RequestBounds(&sp); !off {
		t.Error("n_max 0 leaves drafting on")
	}
	if m, n, off := RequestBounds(nil); m != 0 || n != 0 || off {
		t.Errorf("nil: %d %d %v", m, n, off)
	}
}
