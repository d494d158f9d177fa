package sched

import "github.com/hydra-engine/hydra-engine/iface"

// RequestBounds reads a request's own bounds (llama-server's
// speculative.n_max, n_min): its n_max (0: the rule's own) and n_min (0:
// the load's draft_min), and whether it turns drafting off (n_max 0).
func RequestBounds(p *iface.SpeculativeParams) (nMax, nMin int, off bool) {
	if p == nil {
		return 0, 0, false
	}
	if p.NMax == 0 {
		return 0, 0, true
	}
	return max(p.NMax, 0), max(p.NMin, 0), false
}
