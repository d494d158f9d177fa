// Package specrule decides how many draft tokens each decoding slot puts
// into a step of speculative decoding. It drafts only where, by what steps
// measurably cost on this device and how often each slot's drafts are
// accepted, a step with drafts brings more tokens a second than one
// without; where none does it stops, and probes now and then so that a
// change (a predictable text, a lighter load) brings drafting back.
package specrule

import (
	"cmp"
	"math"
	"slices"
	"sync"
)

// Bounds are the load options' limits.
type Bounds struct {
	NMax, NMin int // draft_max, draft_min (llama-server's --spec-draft-n-max, -n-min)
	// BatchMax is the most draft tokens and pending tokens one step's
	// decoders verify in all (draft_batch_max).
	BatchMax int
}

// Decoder is one decoding slot's part in a step's plan.
type Decoder struct {
	Acc *Acceptance
	// Max is the most it may draft this step: its request's n_max and its
	// room (cells, its caller's buffer, n_predict); 0: none.
	Max int
	Min int // its request's n_min; 0: the load's draft_min
	// Behind is the tokens of its sequence the draft model has not
	// evaluated: before drafting it evaluates them (a slot that did not
	// draft for a while, or took a new prompt, is far behind).
	Behind int
}

// margin is how much more a step with drafts must bring than one without
// to be chosen: the estimates are noisy, and a draft that gains nothing
// measurable is not worth its risk of costing.
const margin = 1.03

// A probe drafts one step while drafting does not pay, so that its costs
// and the slots' acceptance are measured again. It comes once the time
// decoded since the last one is probeFirst times what the probe is
// expected to cost (the step with the plan's drafts, less the plain
// step), the factor doubling up to probeLast while probes confirm that
// drafting does not pay: probes cost about 3 %, then 0.1 %, of the time
// however costly a probe is (a draft model far behind a long sequence
// evaluates all of it first).
const (
	probeFirst = 32
	probeLast  = 1024
)

// amortize is the steps over which a plan's catch-up (the draft model
// evaluating what it has not seen of a slot's sequence) is counted: it is
// paid once, and the steps after it draft without it, so a new prompt does
// not stop drafts that pay.
const amortize = 16

// Planner is the rule of one engine: its bounds, the costs it measured and
// the state of its probing.
type Planner struct {
	b Bounds
	// always drafts each decoder's most (llama-server's rule), measuring
	// nothing.
	always bool
	// rollback is set for a target whose memory cannot be cut back: each
	// drafting decoder saves its state first, and each rejected draft costs
	// a restore and a replay.
	rollback bool
	costs    costs
	pooled   Acceptance // every slot's verifications: a new sequence's prior
	// spent is the time decoded since the last step that drafted, factor
	// the multiple of a probe's cost the next probe waits for.
	spent  float64
	factor float64
	items  []item     // scratch
	mu     sync.Mutex // st: read by Status from any goroutine
	st     Status
}

// Status is the rule's last decision, for operators (/metrics, the log).
type Status struct {
	// Drafting is whether the last decision (not a probe) drafted.
	Drafting bool
	// PlainRate and DraftRate are the estimated tokens a second of that
	// step without drafts and with the best plan; 0: not known yet.
	PlainRate, DraftRate float64
	// Stops counts the decisions that stopped drafting, Probes the steps
	// drafted to measure while stopped.
	Stops, Probes uint64
	Totals
}

// Totals are running sums over the decode-only steps since the rule began,
// for operators: how many drafted and where their time went, so that a
// rate lost or gained can be traced to its part.
type Totals struct {
	PlainSteps, DraftSteps uint64 // steps without drafts, with drafts (probes among them)
	// PlainSeconds is the steps without drafts, each from its batch's
	// start to its tokens sampled.
	PlainSeconds float64
	// DraftSeconds (the catch-up apart), CatchUpSeconds, SaveSeconds,
	// VerifySeconds and ReplaySeconds are the parts of the steps with
	// drafts, as Step has them.
	DraftSeconds, CatchUpSeconds, SaveSeconds, VerifySeconds, ReplaySeconds float64
}

// add counts s.
func (t *Totals) add(s Step) {
	if s.Depth == 0 {
		t.PlainSteps++
		t.PlainSeconds += s.Verify.Seconds()
		return
	}
	t.DraftSteps++
	t.DraftSeconds += (s.Draft - s.CatchUp).Seconds()
	t.CatchUpSeconds += s.CatchUp.Seconds()
	t.SaveSeconds += s.Save.Seconds()
	t.VerifySeconds += s.Verify.Seconds()
	t.ReplaySeconds += s.Replay.Seconds()
}

// New makes the rule of an engine.
func New(b Bounds, always, rollback bool) *Planner {
	return &Planner{b: b, always: always, rollback: rollback, factor: probeFirst, costs: costs{scale: 1}}
}

// Status is the rule's last decision.
func (p *Planner) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

// Always says whether the rule drafts each decoder's most, measuring
// nothing.
func (p *Planner) Always() bool { return p.always }

// Record adds a decoder's verification of n draft tokens of which m were
// accepted to its acceptance and to the engine's.
func (p *Planner) Record(a *Acceptance, n, m int) {
	a.Record(n, m)
	p.pooled.Record(n, m)
}

// Observe adds a step's measurements; decodeOnly says that it evaluated no
// prompt, so that its time tells what decoding costs.
func (p *Planner) Observe(s Step, decodeOnly bool) {
	if decodeOnly {
		p.mu.Lock()
		p.st.Totals.add(s)
		p.mu.Unlock()
	}
	if p.always {
		return
	}
	if s.Depth > 0 {
		p.spent = 0
	} else {
		p.spent += (s.Draft + s.Save + s.Verify + s.Replay).Seconds()
	}
	if decodeOnly {
		p.costs.observe(s)
	}
}

// Plan sets lens[i] to the draft tokens decoder ds[i] drafts this step,
// and says whether drafting stopped or started with this decision.
func (p *Planner) Plan(ds []Decoder, lens []int) (changed bool) {
	caps := p.caps(ds)
	if p.always {
		copy(lens, caps)
		return false
	}
	clear(lens)
	plain, ok := p.costs.plainTime(len(ds))
	if !ok || plain <= 0 {
		return false // a plain step of this width is measured first
	}
	m, rate, t := p.best(ds, caps, plain)
	if m == 0 {
		return false // no decoder may draft: nothing to decide
	}
	plainRate := float64(len(ds)) / plain
	drafting := rate > plainRate*margin
	p.mu.Lock()
	defer p.mu.Unlock()
	changed = drafting != p.st.Drafting
	p.st.Drafting, p.st.PlainRate, p.st.DraftRate = drafting, plainRate, rate
	if changed && !drafting {
		p.st.Stops++
	}
	if drafting {
		p.factor = probeFirst
	} else {
		if p.spent < p.factor*(t-plain) {
			return changed
		}
		// A probe: the best plan once, though it does not pay.
		p.factor = min(2*p.factor, probeLast)
		p.st.Probes++
	}
	p.apply(ds, m, lens)
	return changed
}

// caps is each decoder's most: draft_max, its Max and, where the rule does
// not weigh costs, its equal share of draft_batch_max; 0 where that is
// under its least.
func (p *Planner) caps(ds []Decoder) []int {
	share := math.MaxInt
	if p.always && p.b.BatchMax > 0 && len(ds) > 0 {
		share = p.b.BatchMax/len(ds) - 1
	}
	caps := make([]int, len(ds))
	for i, d := range ds {
		caps[i] = p.withMin(d, min(p.b.NMax, d.Max, share))
	}
	return caps
}

// withMin is k where it reaches the decoder's least draft, else 0.
func (p *Planner) withMin(d Decoder, k int) int {
	least := p.b.NMin
	if d.Min > 0 {
		least = d.Min
	}
	if k < max(least, 1) {
		return 0
	}
	return k
}

// item is one draft token a plan may add: the j-th of decoder i, worth the
// probability that it is accepted (it is only if the j − 1 before it are).
type item struct {
	i, j  int
	value float64
}

// best finds the drafting plan of most tokens a second: the draft tokens
// ordered by their worth, and of every prefix of that order (each decoder's
// first j tokens; at most draft_batch_max in all) the one whose expected
// tokens over its estimated time is highest (its catch-up counted over
// amortize steps). It returns the prefix's length (0: no decoder may
// draft), its rate and its time with the whole catch-up, what a probe of it
// costs.
func (p *Planner) best(ds []Decoder, caps []int, plain float64) (int, float64, float64) {
	p.items = p.items[:0]
	rates := make([]float64, len(ds))
	prior := p.pooled.Rate(1)
	for i, d := range ds {
		rates[i] = d.Acc.Rate(prior)
		for j := 1; j <= caps[i]; j++ {
			p.items = append(p.items, item{i: i, j: j, value: math.Pow(rates[i], float64(j))})
		}
	}
	slices.SortFunc(p.items, func(a, b item) int {
		return cmp.Or(cmp.Compare(b.value, a.value), cmp.Compare(a.j, b.j), cmp.Compare(a.i, b.i))
	})
	if p.b.BatchMax > 0 {
		p.items = p.items[:min(len(p.items), max(p.b.BatchMax-len(ds), 0))]
	}
	var (
		tokens          = float64(len(ds)) // each decoder's pending token's successor
		depth, drafting int
		behind          int     // the drafting decoders' tokens the draft model evaluates first
		rejected        float64 // the expected decoders whose drafts are partly rejected
		bestM           int
		bestRate, bestT float64
	)
	k := make([]int, len(ds))
	for m, it := range p.items {
		if k[it.i] == 0 {
			drafting++
			behind += ds[it.i].Behind
		}
		k[it.i]++
		depth = max(depth, k[it.i])
		tokens += it.value
		rejected += math.Pow(rates[it.i], float64(it.j-1)) - it.value
		t, ok := p.costs.stepTime(len(ds) + m + 1)
		if !ok {
			t = plain
		}
		t += p.costs.draftTime(depth)
		if p.rollback {
			t += p.costs.save.v*float64(drafting) + p.costs.replay.v*rejected
		}
		catchUp := p.costs.catchUp.v * float64(behind)
		if rate := tokens / (t + catchUp/amortize); rate > bestRate {
			bestM, bestRate, bestT = m+1, rate, t+catchUp
		}
	}
	return bestM, bestRate, bestT
}

// apply sets lens to the plan of the first m items.
func (p *Planner) apply(ds []Decoder, m int, lens []int) {
	clear(lens)
	for _, it := range p.items[:m] {
		lens[it.i]++
	}
	for i := range ds {
		lens[i] = p.withMin(ds[i], lens[i])
	}
}
