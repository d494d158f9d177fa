package cudallama

import (
	"math"

	"github.com/hydra-engine/hydra-engine/iface"
)

// The adaptive rule of speculative decoding: how many draft tokens a
// decoding slot puts into a step for the target model to verify.

// specRule is the load options' part of the rule.
type specRule struct {
	nMax, nMin int // draft_max, draft_min (llama-server's --spec-draft-n-max, -n-min)
	// batchMax is the tokens a step's decoders may verify in all
	// (draft_batch_max): up to it a step costs about what one token does,
	// since reading the weights dominates; beyond it the verification's
	// compute grows with the tokens and slows every slot.
	batchMax int
}

// specMinGain is the least probability that a draft's last token is
// accepted: the k-th token counts only when all k are accepted (p^k), and
// below this its drafting and verification cost more than it gains.
const specMinGain = 0.25

// specProbeEvery is how many steps a slot whose acceptance stopped its
// drafting waits before it drafts one token again, so that a sequence
// whose text turns predictable resumes.
const specProbeEvery = 16

// specDecay is the weight each verification's counts keep at the next, so
// that the acceptance estimate follows the recent text (about the last ten
// verifications).
const specDecay = 0.9

// acceptance is a slot's record of its drafts, kept across its decodes.
type acceptance struct {
	// tested and accepted are decayed counts of the draft tokens the target
	// compared (up to and including the first rejected) and accepted; they
	// start at one each, so a new sequence drafts in full.
	tested, accepted float64
	idle             int // steps since drafting stopped for low acceptance
	// Totals for INFO and the tests.
	drafted, acceptedTotal uint64
}

func newAcceptance() acceptance { return acceptance{tested: 1, accepted: 1} }

// rate is the estimated probability that one draft token is accepted,
// given that the ones before it were.
func (a *acceptance) rate() float64 {
	if a.tested <= 0 {
		return 1
	}
	return a.accepted / a.tested
}

// record adds a verification of n draft tokens of which the first m were
// accepted: m+1 were compared when one was rejected, n when none was.
func (a *acceptance) record(n, m int) {
	if n == 0 {
		return
	}
	a.tested = a.tested*specDecay + float64(min(m+1, n))
	a.accepted = a.accepted*specDecay + float64(m)
	a.drafted += uint64(n)
	a.acceptedTotal += uint64(m)
}

// draftLen is how many tokens a slot drafts this step: the least of
// draft_max, the request's own n_max (reqMax, 0 none), the step's share of
// batchMax among its decoders, what the acceptance rate makes worth it and
// room (what the slot may still take: its caller's buffer, n_predict and
// cells, less the token sampled). A length below draft_min is 0.
func (r specRule) draftLen(a *acceptance, reqMax, decoders, room int) int {
	k := r.nMax
	if reqMax > 0 {
		k = min(k, reqMax)
	}
	if decoders > 0 && r.batchMax > 0 {
		k = min(k, r.batchMax/decoders-1)
	}
	k = min(k, room, worthDrafting(a.rate()))
	if k == 0 && worthDrafting(a.rate()) == 0 {
		// Stopped for acceptance alone: probe with one token now and then.
		if a.idle++; a.idle >= specProbeEvery && min(r.nMax, room) > 0 && (decoders == 0 || r.batchMax == 0 || r.batchMax/decoders > 1) {
			a.idle = 0
			k = 1
		}
		return max(k, 0) // a probe ignores draft_min: it measures, it does not serve
	}
	a.idle = 0
	if k < max(r.nMin, 1) {
		return 0
	}
	return k
}

// worthDrafting is the longest draft whose last token is accepted with
// probability at least specMinGain when each is with probability p.
func worthDrafting(p float64) int {
	switch {
	case p >= 1:
		return math.MaxInt32
	case p <= specMinGain:
		return 0
	}
	return int(math.Log(specMinGain) / math.Log(p))
}

// requestBounds reads a request's own bounds (llama-server's
// speculative.n_max, n_min): its n_max (0: the rule's own) and n_min (0:
// the load's draft_min), and whether it turns drafting off (n_max 0).
func requestBounds(p *iface.SpeculativeParams) (nMax, nMin int, off bool) {
	if p == nil {
		return 0, 0, false
	}
	if p.NMax == 0 {
		return 0, 0, true
	}
	return max(p.NMax, 0), max(p.NMin, 0), false
}
