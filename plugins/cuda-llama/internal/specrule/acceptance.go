package specrule

// decay is the weight each verification's counts keep at the next, so that
// an acceptance estimate follows the recent text (about the last ten
// verifications).
const decay = 0.9

// Acceptance is a record of drafts verified: one slot's, kept across its
// decodes, or all slots' (the prior of a sequence that has none yet).
type Acceptance struct {
	// tested and accepted are decayed counts of the draft tokens the target
	// compared (up to and including the first rejected) and accepted.
	tested, accepted float64
	// Drafted and Accepted are running totals, for INFO and the tests.
	Drafted, Accepted uint64
}

// Rate is the estimated probability that one draft token is accepted, given
// that the ones before it were; prior where nothing was verified yet.
func (a *Acceptance) Rate(prior float64) float64 {
	if a.tested <= 0 {
		return prior
	}
	return a.accepted / a.tested
}

// Record adds a verification of n draft tokens of which the first m were
// accepted: m+1 were compared when one was rejected, n when none was.
func (a *Acceptance) Record(n, m int) {
	if n <= 0 {
		return
	}
	m = min(max(m, 0), n)
	a.tested = a.tested*decay + float64(min(m+1, n))
	a.accepted = a.accepted*decay + float64(m)
	a.Drafted += uint64(n)
	a.Accepted += uint64(m)
}
