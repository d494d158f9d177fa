package sched

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
)

// Speculative decoding: each step, every decoding slot may put a draft
// (the Drafter's) after its pending token; the target verifies them in the
// shared step, each sampled from the row before it as it would be alone,
// so the output is the one decoding without a draft gives, and the tail
// after the first mismatch is removed; a target whose state cannot be cut
// back (hybrid, recurrent) restores the state it saved before the step and
// evaluates the kept tokens again (saveRollbacks, replay).

// Speculation is the speculative step's state across steps: the drafter,
// the rule that says how much each decoder drafts, each slot's acceptance
// and the counts of all slots' draft tokens (INFO's).
type Speculation struct {
	Drafter           Drafter
	Rule              *specrule.Planner
	Acc               []specrule.Acceptance // per slot, across decodes
	Drafted, Accepted atomic.Uint64
}

// bound is decoder j's part in the step's plan: its acceptance, the most
// it may draft (its request's n_max; its caller's buffer, n_predict and
// the cells, less the token it samples; 0 where it drafts nothing), its
// request's n_min and how far the drafter is behind its sequence.
func (s *Scheduler) bound(j *Job, batchRoom int) specrule.Decoder {
	sp, d := s.Spec, j.Decode
	reqMax, reqMin, off := RequestBounds(d.Req.Speculative)
	if d.Stop != "" || d.needShift || off {
		return specrule.Decoder{Acc: &sp.Acc[j.Slot]}
	}
	room := cap(d.Events) - len(d.Events) - 1
	if d.Req.NPredict > 0 {
		room = min(room, d.Req.NPredict-d.Sampled-1)
	}
	room = min(room, s.Cells.SlotCtx-len(j.KV.Seq())-j.KV.Claim-1, s.Cells.Free()-1, batchRoom)
	if reqMax > 0 {
		room = min(room, reqMax)
	}
	return specrule.Decoder{Acc: &sp.Acc[j.Slot], Max: max(room, 0), Min: reqMin, Behind: sp.Drafter.Behind(j.Slot, j.KV.Seq())}
}

// draftStep drafts for the step's decoders and stores each draft in its
// job, its cells claimed; room is the batch's tokens left after their
// pending ones. The rule (specrule) says how many each drafts; the time
// drafting takes and the rollbacks' saves are the step's to measure.
func (s *Scheduler) draftStep(decoders []*Job, room int) {
	sp := s.Spec
	if sp == nil || len(decoders) == 0 {
		return
	}
	start := time.Now()
	ds := make([]specrule.Decoder, len(decoders))
	for i, j := range decoders {
		j.Decode.Draft, j.Decode.nAccepted = nil, 0
		ds[i] = s.bound(j, room)
	}
	// The decoders' cells are claimed in turn and the batch filled, so each
	// one's draft is bounded by what the drafts before it left.
	lens := make([]int, len(decoders))
	s.logRule(sp.Rule.Plan(ds, lens))
	for i, j := range decoders {
		lens[i] = max(min(lens[i], s.Cells.Free()-1, room), 0)
		room -= lens[i]
		j.KV.Claim += lens[i]
		s.clock.depth = max(s.clock.depth, lens[i])
		if lens[i] > 0 {
			s.clock.drafting++
		}
	}
	if s.clock.depth == 0 {
		return
	}
	s.clock.catchUp, s.clock.catchUpTokens = sp.Drafter.Draft(decoders, lens)
	for i, j := range decoders {
		j.KV.Claim += len(j.Decode.Draft) - lens[i]
	}
	saved := time.Now()
	s.clock.draft = saved.Sub(start)
	s.saveRollbacks(decoders)
	s.clock.save = time.Since(saved)
}

// logRule says in the log when the rule stops or resumes drafting
// (changed), and why: the tokens a second it expects with and without
// drafts.
func (s *Scheduler) logRule(changed bool) {
	if !changed {
		return
	}
	st := s.Spec.Rule.Status()
	msg := "speculative decoding stopped: drafts cost more than they bring (probes go on now and then)"
	if st.Drafting {
		msg = "speculative decoding drafts: drafts bring more than they cost"
	}
	s.Log.Info(msg, "expected_tok_s_drafting", fmt.Sprintf("%.1f", st.DraftRate),
		"expected_tok_s_plain", fmt.Sprintf("%.1f", st.PlainRate), "stops", st.Stops, "probes", st.Probes)
}

// saveRollbacks saves, for each decoder with a draft on a target whose
// memory cannot be cut back (a hybrid's or recurrent model's state), the
// part that cannot, before the step evaluates the draft: a rejected draft
// token is undone by restoring it and evaluating the kept tokens again
// (replay; llama-server's checkpoint and replay, llama.cpp #19493). A
// decoder whose state cannot be saved goes on without its draft.
func (s *Scheduler) saveRollbacks(decoders []*Job) {
	if !s.Rollback {
		return
	}
	for _, j := range decoders {
		d := j.Decode
		if len(d.Draft) == 0 {
			continue
		}
		data, err := s.Ctx.PartialStateInto(j.Slot, d.rollback)
		if err != nil {
			s.Log.Warn("speculative decoding: the slot's state could not be saved before its draft: no draft this step",
				"slot", j.Slot, "error", err)
			j.KV.Claim -= len(d.Draft)
			d.Draft = nil
			continue
		}
		d.rollback = data
	}
}

// process hands the batch the target just evaluated to the drafter while
// the rule drafts or the step verified a probe's drafts: an MTP block's
// evaluation costs every step, so a rule that stopped drafting stops that
// too.
func (s *Scheduler) process() {
	sp := s.Spec
	if sp == nil || (s.clock.depth == 0 && !sp.Rule.Always() && !sp.Rule.Status().Drafting) {
		return
	}
	sp.Drafter.Process(&s.batch)
}

// draftRows looks up the logits of each draw's draft rows before the draws
// run in parallel: llama.cpp's first lookup after a decode may reorder its
// outputs, which must not race.
func (s *Scheduler) draftRows(draws []draw) {
	for i := range draws {
		d := &draws[i]
		d.rows = d.rows[:0]
		for k := range d.j.Decode.Draft {
			d.rows = append(d.rows, s.Ctx.Logits(d.row+k+1))
		}
	}
}

// sampleDraft samples decoder d's tokens from its rows: the first as
// without a draft, then, while each equals the draft token evaluated after
// it, the next from that token's row. Every token is sampled from the
// logits of exactly the sequence it follows, at its own position, so the
// tokens are those of decoding without the draft.
func (s *Scheduler) sampleDraft(d *draw) {
	j, dj := d.j, d.j.Decode
	pos := len(j.KV.Seq())
	t := dj.Sampler.Sample(d.logits, pos, dj.Req.Logprobs)
	for i := 0; i < len(dj.Draft) && t.ID == dj.Draft[i] && !s.Vocab.IsEOG(t.ID); i++ {
		d.accepted = append(d.accepted, t)
		t = dj.Sampler.Sample(d.rows[i], pos+i+1, dj.Req.Logprobs)
	}
	d.tok = t
}

// acceptDrafted sends and keeps the draft tokens d accepted: each is in the
// KV already, evaluated in this step after the one before it.
func (s *Scheduler) acceptDrafted(d draw) {
	j := d.j
	for _, t := range d.accepted {
		t.Text = s.Vocab.Piece(t.ID)
		j.Decode.Sampled++
		j.Decode.Events <- t // room for the whole draft was kept (bound)
		j.KV.Append([]int32{t.ID})
	}
	j.Decode.nAccepted = len(d.accepted)
}

// settleDrafts ends the step's drafts: the cells after each slot's kept
// tokens are removed from the target's KV and their claims released, and
// the acceptance counts recorded. It returns the decoders whose memory
// could not be cut there (a hybrid's state past a rejected draft token):
// replay undoes their drafts once the step's logits are read.
func (s *Scheduler) settleDrafts(entries []entry) (rolled []*Job) {
	sp := s.Spec
	if sp == nil {
		return nil
	}
	for _, en := range entries {
		d := en.j.Decode
		if d == nil || len(d.Draft) == 0 {
			continue
		}
		n := len(d.Draft)
		if !s.Ctx.SeqRmFrom(en.j.Slot, len(en.j.KV.Seq())) {
			rolled = append(rolled, en.j) // replay restores it, or empties a slot it cannot
		}
		en.j.KV.Claim -= n
		if en.j.ended {
			en.j.KV.Claim = 0
		}
		sp.Drafter.Accept(en.j.Slot, d.nAccepted)
		sp.Rule.Record(&sp.Acc[en.j.Slot], n, d.nAccepted)
		d.Drafted += n
		d.Accepted += d.nAccepted
		sp.Drafted.Add(uint64(n))
		sp.Accepted.Add(uint64(d.nAccepted))
	}
	return rolled
}

// replay undoes the rejected draft tokens of the decoders whose memory could
// not be cut back (settleDrafts): each slot's state saved before the step
// is restored, the attention cells from the step's first position cut, and
// the tokens it kept (the pending one and the accepted drafts) evaluated
// again in one batch for all, without logits (their tokens were sampled
// already). A slot that cannot be brought back (no state saved, where the
// memory was to cut the draft itself) is emptied, its decoder ended with
// the error: never a state that differs from its tokens.
//
// The drafter is not handed the replay: the verifying step evaluated the
// same tokens from the same state, and an MTP block holds them, each with
// the hidden state before it, which the replay's first token would now get
// wrong.
func (s *Scheduler) replay(jobs []*Job) {
	if len(jobs) == 0 {
		return
	}
	start := time.Now()
	defer func() { s.clock.replay, s.clock.rolled = time.Since(start), len(jobs) }()
	var ok []*Job
	s.batch.Reset()
	for _, j := range jobs {
		d, seq := j.Decode, j.KV.Seq()
		pos0 := len(seq) - 1 - d.nAccepted
		if d.rollback == nil {
			// Nothing was saved (the memory was to cut the draft itself).
			s.failReplay(j, fmt.Errorf("llama.cpp could not cut sequence %d back to %d past its rejected draft", j.Slot, len(seq)))
			continue
		}
		err := s.Ctx.SetPartialState(j.Slot, d.rollback)
		if err == nil && !s.Ctx.SeqRmFrom(j.Slot, pos0) {
			err = fmt.Errorf("llama.cpp could not cut sequence %d at %d after restoring its state", j.Slot, pos0)
		}
		if err != nil {
			s.failReplay(j, err)
			continue
		}
		s.batch.Add(seq[pos0:], pos0, j.Slot, RowsNone)
		ok = append(ok, j)
	}
	if s.batch.Len() == 0 {
		return
	}
	if err := s.Ctx.Decode(&s.batch); err != nil {
		for _, j := range ok {
			s.failReplay(j, fmt.Errorf("evaluating the kept tokens again after a rejected draft: %w", err))
		}
	}
}

// failReplay empties a slot whose rejected draft could not be undone and
// ends its decoder, if it is still running, with err.
func (s *Scheduler) failReplay(j *Job, err error) {
	s.Log.Error("speculative decoding: a rejected draft could not be undone: the slot is emptied", "slot", j.Slot, "error", err)
	s.Slots.Clear(j)
	if !j.ended {
		s.Finish(j, err)
	}
}
