package cudallama

import (
	"math"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestPenaltyWindow(t *testing.T) {
	pen := func(n int32) iface.SamplerParams { return iface.SamplerParams{RepeatPenalty: 1.2, RepeatLastN: n} }
	for _, c := range []struct {
		p      iface.SamplerParams
		seqCtx int
		want   int
	}{
		{pen(64), 1024, 64},
		{pen(1024), 1024, 1024},
		{pen(1025), 1024, 1024},
		{pen(math.MaxInt32), 1024, 1024},
		{pen(-1), 1024, 1024},
		{pen(-7), 1024, 1024},
		{pen(0), 1024, 0},
		{iface.SamplerParams{RepeatLastN: 64}, 1024, 0}, // no penalty set
		{iface.SamplerParams{RepeatLastN: math.MaxInt32, PresencePenalty: 0.5}, 512, 512},
	} {
		if got := penaltyWindow(c.p, c.seqCtx); got != c.want {
			t.Errorf("penaltyWindow(%+v, %d) = %d, want %d", c.p, c.seqCtx, got, c.want)
		}
	}
}
