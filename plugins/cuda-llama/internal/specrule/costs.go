package specrule

import (
	"math"
	"slices"
	"time"
)

// smoothing is the weight a new measurement gets in a running estimate:
// steps are noisy (sampling, the host's other work), and the estimate
// must still follow a change of load within some tens of steps.
const smoothing = 0.2

// scaleShare is the part of a re-measured entry's change that moves the
// common scale (the rest moves the entry): the growth of the context slows
// every step alike, and what is left is the entry's own noise
// (docs/design/speculative.md has the shares tried).
const scaleShare = 0.8

// Step is what one step measured.
type Step struct {
	Tokens int // the batch's tokens: each decoder's pending token and its draft
	// Depth is the longest draft the plan asked for (the draft model's
	// sequential steps), Drafting how many decoders drafted.
	Depth, Drafting int
	// Draft is the time spent drafting (the draft model or the n-gram
	// lookups), CatchUp the part of it the draft model spent evaluating
	// CatchUpTokens of the slots' tokens it had not seen, Save the time
	// saving the rollback states of a target whose memory cannot be cut
	// back, Verify the time from the batch's start to its tokens sampled,
	// Replay the time undoing rejected drafts of such a target (restores
	// and the kept tokens evaluated again) for Rolled decoders.
	Draft, CatchUp, Save, Verify, Replay time.Duration
	CatchUpTokens, Rolled                int
}

// costs are the running estimates of what a step costs on this device, in
// seconds, each measured and none assumed.
type costs struct {
	// scale is how much slower steps are now than when the tables' values
	// were 1 of their unit: the tables hold each measurement over the scale
	// of its time, and every re-measured entry moves the scale by its
	// change. A plain step is measured only while the rule does not draft
	// and a verify step only while it does, and both slow as the context
	// grows: on one scale the one not measured follows the other.
	scale float64
	step  table // a decode-only step by its batch tokens
	draft table // the drafting of a step by its depth, its catch-up apart
	// catchUp is the draft model's evaluation of one token it had not seen.
	catchUp running
	save    running // saving one decoder's rollback state
	// replay is undoing one decoder's rejected draft: its restore and its
	// share of the replay batch.
	replay running
}

func (c *costs) observe(s Step) {
	if s.Tokens > 0 && s.Verify > 0 {
		c.record(&c.step, s.Tokens, s.Verify.Seconds())
	}
	if s.Depth > 0 {
		c.record(&c.draft, s.Depth, (s.Draft - s.CatchUp).Seconds())
	}
	if s.CatchUpTokens > 0 {
		c.catchUp.add(s.CatchUp.Seconds() / float64(s.CatchUpTokens))
	}
	if s.Drafting > 0 && s.Save > 0 {
		c.save.add(s.Save.Seconds() / float64(s.Drafting))
	}
	if s.Rolled > 0 {
		c.replay.add(s.Replay.Seconds() / float64(s.Rolled))
	}
}

// record adds x, a time measured at count k, to t on the common scale,
// after moving the scale by how x differs from k's estimate (smoothed as
// the estimates are).
func (c *costs) record(t *table, k int, x float64) {
	if v, ok := t.at(k); ok && v > 0 {
		c.scale *= math.Pow(x/(v*c.scale), scaleShare)
	}
	t.add(k, x/c.scale)
}

// stepTime and draftTime are the tables' estimates now.
func (c *costs) stepTime(b int) (float64, bool) {
	v, ok := c.step.stepTime(b)
	return v * c.scale, ok
}

func (c *costs) plainTime(b int) (float64, bool) {
	v, ok := c.step.at(b)
	return v * c.scale, ok
}

func (c *costs) draftTime(d int) float64 { return c.draft.draftTime(d) * c.scale }

// running is one smoothed estimate; zero until measured.
type running struct {
	v     float64
	known bool
}

func (r *running) add(v float64) {
	if !r.known {
		r.v, r.known = v, true
		return
	}
	r.v += smoothing * (v - r.v)
}

// table is smoothed estimates by a count (batch tokens, draft depth).
type table struct {
	keys []int // sorted
	vals map[int]*running
}

func (t *table) add(k int, v float64) {
	if t.vals == nil {
		t.vals = map[int]*running{}
	}
	r, ok := t.vals[k]
	if !ok {
		r = &running{}
		t.vals[k] = r
		i, _ := slices.BinarySearch(t.keys, k)
		t.keys = slices.Insert(t.keys, i, k)
	}
	r.add(v)
}

// at is the estimate at exactly k.
func (t *table) at(k int) (float64, bool) {
	if r, ok := t.vals[k]; ok {
		return r.v, true
	}
	return 0, false
}

// stepTime is a step of b tokens: measured, or interpolated between the
// nearest counts measured on either side; above the largest measured, that
// one's time (a decode step reads every weight whatever its few tokens, so
// its time is flat until compute dominates: the estimate is never worse
// than the truth there, and the step that tries it measures it). ok is
// false with nothing measured at or below b.
func (t *table) stepTime(b int) (float64, bool) {
	i, found := slices.BinarySearch(t.keys, b)
	if found {
		return t.vals[b].v, true
	}
	if i == 0 {
		return 0, false
	}
	lo := t.keys[i-1]
	if i == len(t.keys) {
		return t.vals[lo].v, true
	}
	hi := t.keys[i]
	vl, vh := t.vals[lo].v, t.vals[hi].v
	return vl + (vh-vl)*float64(b-lo)/float64(hi-lo), true
}

// draftTime is the drafting of depth d: measured, or the nearest depth
// measured scaled by d (each depth is one more step of the draft model);
// 0 with nothing measured, so that the first drafts measure it.
func (t *table) draftTime(d int) float64 {
	if v, ok := t.at(d); ok {
		return v
	}
	if len(t.keys) == 0 {
		return 0
	}
	i, _ := slices.BinarySearch(t.keys, d)
	near := t.keys[min(i, len(t.keys)-1)]
	if i > 0 && (i == len(t.keys) || d-t.keys[i-1] < t.keys[i]-d) {
		near = t.keys[i-1]
	}
	return t.vals[near].v * float64(d) / float64(near)
}
