package cudallama

import (
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
)

// A request's own speculative bounds (llama-server's speculative.n_max,
// n_min, p_min). Without speculative decoding configured they are ignored,
// as llama-server ignores them.

// checkSpeculative refuses a p_min other than the load's draft_p_min (pMin,
// when drafting): llama.cpp's draft-simple stops its drafts at one p_min for
// all slots.
func checkSpeculative(p *iface.SpeculativeParams, drafting bool, pMin float32) error {
	if p == nil || !drafting || p.PMin < 0 || p.PMin == pMin {
		return nil
	}
	return fmt.Errorf("%w: speculative.p_min %g: this engine drafts at draft_p_min %g for every slot (llama.cpp's draft-simple takes one); leave it out or restart with another",
		iface.ErrBadRequest, p.PMin, pMin)
}
