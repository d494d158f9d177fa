package sched

import (
	"slices"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// entry is a job's share of the batch: tokens [first, first+n) of the
// batch, logits for the last one when last is set.
type entry struct {
	j        *Job
	first, n int
	last     bool
	prompt   bool // a chunk of a prompt, not a decoder's token
}

// lastRow is the batch row of en's last token, whose logits were computed
// when en.last.
func (en entry) lastRow() int { return en.first + en.n - 1 }

// keptRow is the batch row of the last token decoder en kept in the KV.
func (en entry) keptRow() int {
	if d := en.j.Decode; d != nil && en.j.Prefill == nil && !en.prompt {
		return en.first + d.nAccepted
	}
	return en.lastRow()
}

// build fills the batch: decoders first, one token each, then prompt
// chunks in arrival order while room is left. n is the batch's tokens.
func (s *Scheduler) build() (entries []entry, n int) {
	s.clock = stepClock{}
	var decoders []*Job
	for _, j := range s.jobs {
		if j.Decode == nil || j.Decode.Pending < 0 || !s.ready(j) {
			continue
		}
		decoders = append(decoders, j)
	}
	if s.Snapshots && s.promptWaiting() {
		// Snapshots cut a draft back right only from a step without prompt
		// rows (llama.cpp's split of such a batch leaves the decoders' wrong):
		// the decoders go without drafts while a prompt is evaluated.
		for _, j := range decoders {
			j.Decode.Draft, j.Decode.nAccepted = nil, 0
		}
	} else {
		s.draftStep(decoders, s.Size-len(decoders))
	}
	for _, j := range decoders {
		k := 1 + len(j.Decode.Draft)
		entries = append(entries, entry{j: j, n: k, last: true})
		n += k
	}
	for _, j := range s.jobs {
		p := j.Prefill
		if p == nil || n == s.Size {
			continue
		}
		if len(p.Moves) > 0 {
			if s.Slots.Transferring() {
				continue // the moves wait for the transfers in flight
			}
			s.Prompts.ApplyMoves(j)
		}
		end := s.Prompts.ChunkEnd(j, s.Size-n)
		s.Prompts.CheckpointBefore(j, end)
		k := end - p.Next
		entries = append(entries, entry{j: j, n: k, last: p.Next+k == len(p.Prompt), prompt: true})
		n += k
	}
	if !s.Cells.Unified {
		// With a KV stream per sequence llama.cpp puts only sequences of
		// consecutive ids, in batch order, into one micro-batch.
		slices.SortStableFunc(entries, func(a, b entry) int { return a.j.Slot - b.j.Slot })
	}
	return entries, s.fill(entries)
}

// promptWaiting says whether a prompt has chunks left to evaluate.
func (s *Scheduler) promptWaiting() bool {
	for _, j := range s.jobs {
		if j.Prefill != nil {
			return true
		}
	}
	return false
}

// fill writes the entries' tokens into the batch in their order, setting
// each one's first row, and returns the batch's tokens.
// A decoder's pending token and its draft all have logits: each draft
// token is verified from the row before it.
func (s *Scheduler) fill(entries []entry) int {
	s.batch.Reset()
	for i := range entries {
		en := &entries[i]
		en.first = s.batch.Len()
		if en.prompt {
			p, rows := en.j.Prefill, RowsNone
			if en.last {
				rows = RowsLast
			}
			s.batch.Add(p.Prompt[p.Next:p.Next+en.n], p.Next, en.j.Slot, rows)
			continue
		}
		d, pos := en.j.Decode, len(en.j.KV.Seq())
		s.batch.Add([]int32{d.Pending}, pos, en.j.Slot, RowsAll)
		s.batch.Add(d.Draft, pos+1, en.j.Slot, RowsAll)
	}
	return s.batch.Len()
}

// ready reports whether decoder j can take part in this step: its caller
// has room for another token, and a slot that must shift its context can
// (no state transfer is reading or writing the KV while the shift rewrites
// it).
func (s *Scheduler) ready(j *Job) bool {
	d := j.Decode
	if len(d.Events) == cap(d.Events) && d.Stop == "" {
		return false
	}
	if d.needShift {
		if s.Slots.Transferring() {
			return false
		}
		s.Slots.Shift(j)
		d.needShift = false
	}
	return true
}

// retryDecodersOnly evaluates the decoders alone after the context found
// no room for the whole batch (the accounting keeps this rare: cells freed
// out of order can leave no contiguous run for a chunk); the prompts wait.
func (s *Scheduler) retryDecodersOnly(entries []entry) ([]entry, error) {
	var dec []entry
	for _, en := range entries {
		if en.j.Decode != nil {
			dec = append(dec, en)
		}
	}
	if len(dec) == 0 || len(dec) == len(entries) {
		return entries, ErrKVFull
	}
	s.fill(dec)
	return dec, s.Ctx.Decode(&s.batch)
}

// collect takes the step's results: prompt progress, and for each decoder
// its evaluated token and the next one sampled from its logits (a Decode's
// prompt whose last chunk was in the step samples its first). The
// decoders' samplers run in parallel (each reads only its own row of
// logits and its own chain); what they share is updated before and after.
func (s *Scheduler) collect(entries []entry) {
	var draws []draw
	for _, en := range entries {
		var d draw
		var ok bool
		if en.j.Prefill != nil {
			d, ok = s.prefilled(en)
		} else {
			d, ok = s.evaluated(en)
		}
		if ok {
			draws = append(draws, d)
		}
	}
	s.sampleAll(draws)
	for _, d := range draws {
		s.acceptDrafted(d)
		s.drawn(d)
	}
	rolled := s.settleDrafts(entries)
	for _, en := range entries {
		if j := en.j; j.Decode != nil && j.Prefill == nil && j.Decode.Pending < 0 && !j.ended {
			j.KV.SetLogits(slices.Clone(s.Ctx.Logits(en.keptRow())))
			s.Finish(j, nil)
		}
	}
	s.replay(rolled) // after the step's logits are read: it decodes again
	s.dropEnded()
}

// prefilled records a prompt chunk evaluated. The last one ends a Prefill
// with its logits, or turns a Decode's prompt into its decoder (prompted).
func (s *Scheduler) prefilled(en entry) (draw, bool) {
	j, p := en.j, en.j.Prefill
	j.KV.Append(p.Prompt[p.Next : p.Next+en.n])
	j.KV.Claim -= en.n
	p.Next += en.n
	switch {
	case !en.last:
		return draw{}, false
	case j.Decode != nil:
		return s.prompted(en)
	}
	p.Logits = slices.Clone(s.Ctx.Logits(en.lastRow()))
	p.StateSize = s.Ctx.StateSize(j.Slot)
	s.Finish(j, nil)
	return draw{}, false
}

// prompted makes a Decode whose prompt is all in the KV a decoder: it
// samples its first token from the prompt's last row of logits now, as a
// decoder samples its next, unless it stops first.
func (s *Scheduler) prompted(en entry) (draw, bool) {
	en.j.Prefill = nil
	en.j.Decode.Prompted = time.Now()
	return s.nextDraw(en)
}

// draw is one decoder's sampling of this step.
type draw struct {
	j      *Job
	logits []float32 // the context's, valid until the next evaluation
	row    int       // the batch row of logits
	tok    iface.Token
	// accepted is the draft tokens sampled before tok, each already in the
	// KV; rows the logits of the draft tokens' rows.
	accepted []iface.Token
	rows     [][]float32
}

// evaluated records a decoder's token evaluated and says whether it samples
// another (nextDraw).
func (s *Scheduler) evaluated(en entry) (draw, bool) {
	j, d := en.j, en.j.Decode
	j.KV.Append([]int32{d.Pending})
	j.KV.Claim--
	d.Pending = -1
	return s.nextDraw(en)
}

// nextDraw says whether decoder en.j samples another token, from the
// logits of en's last row: not when it stops (its reason recorded) or its
// caller left. A decoder that samples has the cell of its next token
// claimed already.
func (s *Scheduler) nextDraw(en entry) (draw, bool) {
	j, d := en.j, en.j.Decode
	if d.Stop != "" || j.Cancelled.Load() {
		return draw{}, false
	}
	if stop := s.Limit(j); stop != "" {
		d.Stop = stop
		return draw{}, false
	}
	j.KV.Claim++
	row := en.lastRow()
	if !en.prompt {
		row = en.first // a decoder's pending token: its draft's rows follow
	}
	return draw{j: j, logits: s.Ctx.Logits(row), row: row}, true
}

// parallelDraws is the fewest draws worth spreading over goroutines: one
// sampler on a 32k vocabulary takes some microseconds.
const parallelDraws = 3

// sampleAll samples every draw, concurrently when there are several.
func (s *Scheduler) sampleAll(draws []draw) {
	s.draftRows(draws)
	sample := func(d *draw) {
		if len(d.j.Decode.Draft) > 0 {
			s.sampleDraft(d)
			return
		}
		d.tok = d.j.Decode.Sampler.Sample(d.logits, len(d.j.KV.Seq()), d.j.Decode.Req.Logprobs)
	}
	if len(draws) < parallelDraws {
		for i := range draws {
			sample(&draws[i])
		}
		return
	}
	var wg sync.WaitGroup
	for i := range draws {
		wg.Go(func() { sample(&draws[i]) })
	}
	wg.Wait()
}

// drawn queues a draw's token, or ends the decoder at an end of generation.
func (s *Scheduler) drawn(d draw) {
	j, t := d.j, d.tok
	if s.Vocab.IsEOG(t.ID) && !j.Decode.Req.Sampler.IgnoreEOS {
		j.Decode.Stop = StopEOS
		j.KV.Claim--
		return
	}
	t.Text = s.Vocab.Piece(t.ID)
	j.KV.Claim-- // Queue claims it again
	j.Decode.Queue(j, t)
}
