//go:build llama && cgo

package cudallama

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
)

// The scheduler owns the batching of prefills and decodes: each step puts
// one token of every decoding slot and chunks of the pending prompts (up to
// n_batch in all, so a long prompt stalls the decoders for one chunk at
// most) into one llama_batch and one llama_decode, then samples each
// decoding slot from its own row of logits. The weights are read once per
// step whatever the batch, so slots decoding together cost little more than
// one. A step holds the context lock (engine.mu) only while it builds,
// evaluates and samples; whole-sequence work (STATE_GET, STATE_PUT, clears)
// takes the lock between steps.

// job is one Prefill or Decode registered with the scheduler; a Decode with
// a prompt has both, prefill until the prompt is in (prompted), then decode.
type job struct {
	slot  int
	s     *kv.Slot
	done  chan error // the job's end: one value, after events (if any) closed
	ended bool       // the loop's: done was sent

	prefill *prefillJob
	decode  *decodeJob

	// cancelled is set by the caller that gave up (its context ended or its
	// emit failed); the loop then ends the job at its next step.
	cancelled atomic.Bool
}

// prefillJob evaluates prompt[next:] into its slot.
type prefillJob struct {
	prompt    []int32
	next      int
	logits    []float32 // after the last token, filled by the loop
	stateSize int64     // the slot's state size after the last chunk, likewise
	moves     []kv.Move // reused chunks to put in place before its first chunk
	task      uint64    // the prompt's number, for the checkpoints' spacing rule
	spans     ckpt.Spans
}

// decodeJob generates tokens into its slot. A token is sampled (and sent to
// the caller) one step before it is evaluated; the job ends once its last
// token is in the KV, so the slot always holds exactly the tokens emitted.
type decodeJob struct {
	req     iface.DecodeRequest
	smp     *sampler
	base    int   // the slot's tokens when the decode started
	pending int32 // the token to evaluate next step; -1 none
	events  chan iface.Token
	sampled int // tokens sent on events
	// emitted is how many tokens the caller passed on before it gave up.
	emitted   atomic.Int64
	stop      string // why the job ends once pending is evaluated ("" goes on)
	needShift bool   // the slot is full: shift its context before the next token
	// prompted is when the job's prompt (a Decode's, prefilled by the same
	// job first) was all evaluated; zero while it is not or for none.
	prompted time.Time
	// draft is this step's draft tokens after pending (spec.go), nAccepted
	// how many of them the target kept.
	draft     []int32
	nAccepted int
	// rollback is the slot's partial state before this step's draft, where
	// the target's memory cannot be cut back (a hybrid's or recurrent
	// model's state): a rejected draft token is undone from it (replay).
	rollback  []byte
	specBegun bool // the n-gram drafts indexed the decode's tokens so far
	// drafted and accepted count the decode's draft tokens (DecodeResult).
	drafted, accepted int
}

// eventBuffer is how many sampled tokens may wait for a slow caller; a slot
// whose caller lags that far skips steps until it catches up, so one slow
// client never holds the others back.
const eventBuffer = 8

type scheduler struct {
	e     *engine
	batch sched.Batch
	size  int // tokens a batch takes: n_batch

	mu       sync.Mutex
	incoming []*job
	wake     chan struct{} // 1-buffered: work arrived or a job was cancelled

	jobs []*job // the loop's own

	clock stepClock // this step's times, for the speculative rule

	// Counters of the steps run, for the debug log and the tests.
	steps, stepTokens atomic.Uint64
	widest            atomic.Int32 // the most decoders one step evaluated
}

func newScheduler(e *engine) *scheduler {
	return &scheduler{e: e, size: e.ctx.nBatch, wake: make(chan struct{}, 1)}
}

// submit registers j; the loop picks it up at its next step.
func (s *scheduler) submit(j *job) {
	s.mu.Lock()
	s.incoming = append(s.incoming, j)
	s.mu.Unlock()
	s.poke()
}

func (s *scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run steps while there is work and sleeps when there is none. It never
// returns: the scheduler lives as long as the plugin process.
func (s *scheduler) run() {
	for {
		if !s.step() {
			<-s.wake
		}
	}
}

// step runs one batch; false when no job could make progress (all idle or
// waiting for their callers). The jobs submitted so far join it once it
// holds the context lock: those whose callers took the lock before it
// (StepLock lets them go first) registered then, and are in this step
// rather than the next.
func (s *scheduler) step() bool {
	e := s.e
	e.mu.StepLock()
	defer e.mu.Unlock()
	start := time.Now()
	s.takeIncoming()
	s.endCancelled()
	entries, n := s.build()
	if n == 0 {
		return false
	}
	s.clock.verifyStart = time.Now()
	err := e.ctx.decodeRows(&s.batch)
	if errors.Is(err, errKVFull) {
		entries, err = s.retryDecodersOnly(entries)
	}
	if err != nil {
		s.failAll(entries, err)
		return true
	}
	s.mtpProcess()
	queued := time.Now()
	s.count(entries)
	s.collect(entries)
	s.observe(entries)
	if e.log.IsTrace() {
		s.trace(entries, start, queued)
	}
	return true
}

// stepClock is what a step's parts took: the drafting (spec.go) and the
// draft model's catch-up within it, the rollbacks' saves and the replays of
// rejected drafts, and the shape of the drafts.
type stepClock struct {
	draft, catchUp, save, replay time.Duration
	verifyStart                  time.Time // llama_decode called
	depth, drafting              int
	catchUpTokens, rolled        int
}

// observe gives the speculative rule a step's times: the batch from its
// llama_decode to its tokens sampled, without the replays, which it counts
// apart; only a decode-only step's say what decoding costs.
func (s *scheduler) observe(entries []entry) {
	sp := s.e.spec
	if sp == nil {
		return
	}
	c, n := s.clock, 0
	for _, en := range entries {
		n += en.n
	}
	decodeOnly := !slices.ContainsFunc(entries, func(en entry) bool { return en.prompt })
	sp.rule.Observe(specrule.Step{Tokens: n, Depth: c.depth, Drafting: c.drafting, Draft: c.draft, CatchUp: c.catchUp,
		CatchUpTokens: c.catchUpTokens, Save: c.save, Verify: time.Since(c.verifyStart) - c.replay, Replay: c.replay,
		Rolled: c.rolled}, decodeOnly)
}

// trace logs a step at trace level: what it evaluated, the time until
// llama_decode returned (building the batch, llama.cpp's graph and inputs,
// the kernels' launch) and in all (with the wait for the device and the
// sampling), so that an operator can see where a request's latency goes.
func (s *scheduler) trace(entries []entry, start, queued time.Time) {
	decoders, prompts, promptTokens := 0, 0, 0
	for _, en := range entries {
		if !en.prompt {
			decoders++
			continue
		}
		prompts++
		promptTokens += en.n
	}
	s.e.log.Trace("step", "decoders", decoders, "prompts", prompts, "prompt_tokens", promptTokens,
		"queued_us", queued.Sub(start).Microseconds(), "total_us", time.Since(start).Microseconds())
}

// takeIncoming adds the jobs submitted since the last step to the loop's.
func (s *scheduler) takeIncoming() {
	s.mu.Lock()
	s.jobs = append(s.jobs, s.incoming...)
	s.incoming = s.incoming[:0]
	s.mu.Unlock()
}

// count records a step.
func (s *scheduler) count(entries []entry) {
	s.steps.Add(1)
	dec := int32(0)
	for _, en := range entries {
		s.stepTokens.Add(uint64(en.n))
		if en.j.decode != nil {
			dec++
		}
	}
	if dec > s.widest.Load() {
		s.widest.Store(dec)
	}
}

// entry is a job's share of the batch: tokens [first, first+n) of the
// batch, logits for the last one when last is set.
type entry struct {
	j        *job
	first, n int
	last     bool
	prompt   bool // a chunk of a prompt, not a decoder's token
}

// lastRow is the batch row of en's last token, whose logits were computed
// when en.last.
func (en entry) lastRow() int { return en.first + en.n - 1 }

// build fills the batch: decoders first, one token each, then prompt
// chunks in arrival order while room is left. n is the batch's tokens.
func (s *scheduler) build() (entries []entry, n int) {
	s.clock = stepClock{}
	var decoders []*job
	for _, j := range s.jobs {
		if j.decode == nil || j.decode.pending < 0 || !s.ready(j) {
			continue
		}
		decoders = append(decoders, j)
	}
	s.draftStep(decoders, s.size-len(decoders))
	for _, j := range decoders {
		k := 1 + len(j.decode.draft)
		entries = append(entries, entry{j: j, n: k, last: true})
		n += k
	}
	for _, j := range s.jobs {
		p := j.prefill
		if p == nil || n == s.size {
			continue
		}
		if len(p.moves) > 0 {
			if s.e.transfers.Load() > 0 {
				continue // the moves wait for the transfers in flight (applyMoves)
			}
			s.e.applyMoves(j.slot, j.s, p)
		}
		end := s.e.chunkEnd(j, s.size-n)
		s.e.checkpointBefore(j, end)
		k := end - p.next
		entries = append(entries, entry{j: j, n: k, last: p.next+k == len(p.prompt), prompt: true})
		n += k
	}
	if !s.e.cells.Unified {
		// With a KV stream per sequence llama.cpp puts only sequences of
		// consecutive ids, in batch order, into one micro-batch.
		slices.SortStableFunc(entries, func(a, b entry) int { return a.j.slot - b.j.slot })
	}
	return entries, s.fill(entries)
}

// fill writes the entries' tokens into the batch in their order, setting
// each one's first row, and returns the batch's tokens.
// A decoder's pending token and its draft all have logits: each draft
// token is verified from the row before it.
func (s *scheduler) fill(entries []entry) int {
	s.batch.Reset()
	for i := range entries {
		en := &entries[i]
		en.first = s.batch.Len()
		if en.prompt {
			p, rows := en.j.prefill, sched.RowsNone
			if en.last {
				rows = sched.RowsLast
			}
			s.batch.Add(p.prompt[p.next:p.next+en.n], p.next, en.j.slot, rows)
			continue
		}
		d, pos := en.j.decode, len(en.j.s.Seq())
		s.batch.Add([]int32{d.pending}, pos, en.j.slot, sched.RowsAll)
		s.batch.Add(d.draft, pos+1, en.j.slot, sched.RowsAll)
	}
	return s.batch.Len()
}

// ready reports whether decoder j can take part in this step: its caller
// has room for another token, and a slot that must shift its context can
// (no state transfer is reading or writing the KV while the shift rewrites
// it).
func (s *scheduler) ready(j *job) bool {
	d := j.decode
	if len(d.events) == cap(d.events) && d.stop == "" {
		return false
	}
	if d.needShift {
		if s.e.transfers.Load() > 0 {
			return false
		}
		s.e.shiftContext(j.slot, j.s, d.req.NKeep)
		d.needShift = false
	}
	return true
}

// retryDecodersOnly evaluates the decoders alone after llama.cpp found no
// room for the whole batch (the accounting keeps this rare: cells freed out
// of order can leave no contiguous run for a chunk); the prompts wait.
func (s *scheduler) retryDecodersOnly(entries []entry) ([]entry, error) {
	var dec []entry
	for _, en := range entries {
		if en.j.decode != nil {
			dec = append(dec, en)
		}
	}
	if len(dec) == 0 || len(dec) == len(entries) {
		return entries, errKVFull
	}
	s.fill(dec)
	return dec, s.e.ctx.decodeRows(&s.batch)
}

// collect takes the step's results: prompt progress, and for each decoder
// its evaluated token and the next one sampled from its logits (a Decode's
// prompt whose last chunk was in the step samples its first). The
// decoders' samplers run in parallel (each reads only its own row of
// logits and its own chain); what they share is updated before and after.
func (s *scheduler) collect(entries []entry) {
	var draws []draw
	for _, en := range entries {
		var d draw
		var ok bool
		if en.j.prefill != nil {
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
		if j := en.j; j.decode != nil && j.prefill == nil && j.decode.pending < 0 && !j.ended {
			j.s.SetLogits(slices.Clone(s.e.ctx.rowLogits(en.keptRow())))
			s.finish(j, nil)
		}
	}
	s.replay(rolled) // after the step's logits are read: it decodes again
	s.dropEnded()
}

// prefilled records a prompt chunk evaluated. The last one ends a Prefill
// with its logits, or turns a Decode's prompt into its decoder (prompted).
func (s *scheduler) prefilled(en entry) (draw, bool) {
	j, p := en.j, en.j.prefill
	j.s.Append(p.prompt[p.next : p.next+en.n])
	j.s.Claim -= en.n
	p.next += en.n
	switch {
	case !en.last:
		return draw{}, false
	case j.decode != nil:
		return s.prompted(en)
	}
	p.logits = make([]float32, s.e.model.nVocab)
	s.e.ctx.logitsAt(en.lastRow(), p.logits)
	p.stateSize = s.e.ctx.stateSize(j.slot)
	s.finish(j, nil)
	return draw{}, false
}

// prompted makes a Decode whose prompt is all in the KV a decoder: it
// samples its first token from the prompt's last row of logits now, as a
// decoder samples its next, unless it stops first.
func (s *scheduler) prompted(en entry) (draw, bool) {
	en.j.prefill = nil
	en.j.decode.prompted = time.Now()
	return s.nextDraw(en)
}

// dropEnded removes the jobs that ended from the loop's list.
func (s *scheduler) dropEnded() {
	s.jobs = slices.DeleteFunc(s.jobs, func(j *job) bool { return j.ended })
}

// draw is one decoder's sampling of this step.
type draw struct {
	j      *job
	logits []float32 // llama.cpp's, valid until the next evaluation
	row    int       // the batch row of logits
	tok    iface.Token
	// accepted is the draft tokens sampled before tok (spec.go), each
	// already in the KV; rows the logits of the draft tokens' rows.
	accepted []iface.Token
	rows     [][]float32
}

// evaluated records a decoder's token evaluated and says whether it samples
// another (nextDraw).
func (s *scheduler) evaluated(en entry) (draw, bool) {
	j, d := en.j, en.j.decode
	j.s.Append([]int32{d.pending})
	j.s.Claim--
	d.pending = -1
	return s.nextDraw(en)
}

// nextDraw says whether decoder en.j samples another token, from the
// logits of en's last row: not when it stops (its reason recorded) or its
// caller left. A decoder that samples has the cell of its next token
// claimed already.
func (s *scheduler) nextDraw(en entry) (draw, bool) {
	j, d := en.j, en.j.decode
	if d.stop != "" || j.cancelled.Load() {
		return draw{}, false
	}
	if stop := s.e.decodeLimit(j); stop != "" {
		d.stop = stop
		return draw{}, false
	}
	j.s.Claim++
	row := en.lastRow()
	if !en.prompt {
		row = en.first // a decoder's pending token: its draft's rows follow
	}
	return draw{j: j, logits: s.e.ctx.rowLogits(row), row: row}, true
}

// parallelDraws is the fewest draws worth spreading over goroutines: one
// sampler on a 32k vocabulary takes some microseconds.
const parallelDraws = 3

// sampleAll samples every draw, concurrently when there are several.
func (s *scheduler) sampleAll(draws []draw) {
	s.draftRows(draws)
	sample := func(d *draw) {
		if len(d.j.decode.draft) > 0 {
			s.sampleDraft(d)
			return
		}
		d.tok = d.j.decode.smp.sample(s.e.model, d.logits, len(d.j.s.Seq()), d.j.decode.req.Logprobs)
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
func (s *scheduler) drawn(d draw) {
	j, t := d.j, d.tok
	if s.e.model.isEOG(t.ID) && !j.decode.req.Sampler.IgnoreEOS {
		j.decode.stop = StopEOS
		j.s.Claim--
		return
	}
	t.Text = s.e.model.piece(t.ID)
	j.s.Claim-- // queue claims it again
	j.decode.queue(j, t)
}

// queue makes t the decoder's next token: sent to the caller now, evaluated
// next step. It claims the cell t will take.
func (d *decodeJob) queue(j *job, t iface.Token) {
	d.pending = t.ID
	j.s.Claim++
	d.sampled++
	d.events <- t // room was checked (ready) or is fresh
	if d.sampled >= d.req.NPredict {
		d.stop = StopLength
		if d.req.LastUnevaluated { // sent, not evaluated: the job ends without another step
			d.pending = -1
			j.s.Claim--
		}
	}
}

// endCancelled ends the jobs whose callers gave up: a prompt's slot is
// emptied (never half-prefilled); a decode whose last token passed on is
// still pending evaluates it first.
func (s *scheduler) endCancelled() {
	for _, j := range s.jobs {
		if !j.cancelled.Load() || j.ended {
			continue
		}
		if j.prefill != nil {
			s.e.clearLocked(j.slot, j.s)
			j.s.Claim = 0
			s.finish(j, errCancelled)
			continue
		}
		d := j.decode
		keep := int(d.emitted.Load())
		evaluated := d.sampled
		if d.pending >= 0 {
			evaluated--
		}
		if keep > evaluated { // the pending token was passed on: evaluate it, then end
			d.stop = stopCancelled
			continue
		}
		d.pending = -1 // the caller drops the tokens it did not pass on (cancelDecode)
		s.finish(j, errCancelled)
	}
	s.dropEnded()
}

// replay undoes the rejected draft tokens of the decoders whose memory could
// not be cut back (settleDrafts): each slot's state saved before the step
// is restored, the attention cells from the step's first position cut, and
// the tokens it kept (the pending one and the accepted drafts) evaluated
// again in one batch for all, without logits (their tokens were sampled
// already). A slot that cannot be brought back is emptied, its decoder
// ended with the error: never a state that differs from its tokens.
func (s *scheduler) replay(jobs []*job) {
	if len(jobs) == 0 {
		return
	}
	start := time.Now()
	defer func() { s.clock.replay, s.clock.rolled = time.Since(start), len(jobs) }()
	var ok []*job
	s.batch.Reset()
	for _, j := range jobs {
		d, seq := j.decode, j.s.Seq()
		pos0 := len(seq) - 1 - d.nAccepted
		err := s.e.ctx.setPartialState(j.slot, d.rollback)
		if err == nil && !s.e.ctx.SeqRmFrom(j.slot, pos0) {
			err = fmt.Errorf("llama.cpp could not cut sequence %d at %d after restoring its state", j.slot, pos0)
		}
		if err != nil {
			s.failReplay(j, err)
			continue
		}
		s.batch.Add(seq[pos0:], pos0, j.slot, sched.RowsNone)
		ok = append(ok, j)
	}
	if s.batch.Len() == 0 {
		return
	}
	if err := s.e.ctx.decodeRows(&s.batch); err != nil {
		for _, j := range ok {
			s.failReplay(j, fmt.Errorf("evaluating the kept tokens again after a rejected draft: %w", err))
		}
	}
	// The MTP block is not handed the replay: the verifying step evaluated
	// the same tokens from the same state and the block holds them, each
	// with the hidden state before it, which the replay's first token would
	// now get wrong (the block has moved on to the kept token's).
}

// failReplay empties a slot whose rejected draft could not be undone and
// ends its decoder, if it is still running, with err.
func (s *scheduler) failReplay(j *job, err error) {
	s.e.log.Error("speculative decoding: a rejected draft could not be undone: the slot is emptied", "slot", j.slot, "error", err)
	s.e.clearLocked(j.slot, j.s)
	if !j.ended {
		s.finish(j, err)
	}
}

// failAll ends every job of a batch that llama.cpp could not evaluate: their
// slots are emptied, since the KV may or may not hold the batch.
func (s *scheduler) failAll(entries []entry, err error) {
	for _, en := range entries {
		s.e.clearLocked(en.j.slot, en.j.s)
		en.j.s.Claim = 0
		s.finish(en.j, err)
	}
	s.dropEnded()
}

// finish ends j with err (nil: done): its events close, then done gets err,
// and the job leaves the loop at the next dropEnded.
func (s *scheduler) finish(j *job, err error) {
	if j.decode != nil {
		close(j.decode.events)
	}
	j.s.Claim, j.ended = 0, true
	j.done <- err
}

// errCancelled ends a job whose caller gave up; the caller has its own error.
var errCancelled = errors.New("cancelled")

// stopCancelled marks a decoder that ends once its pending token, already
// passed on, is evaluated.
const stopCancelled = "cancelled"
