package sched

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
)

// The scheduler owns the batching of prefills and decodes: each step puts
// one token of every decoding slot and chunks of the pending prompts (up to
// n_batch in all, so a long prompt stalls the decoders for one chunk at
// most) into one batch and one Decode, then samples each decoding slot
// from its own row of logits. The weights are read once per step whatever
// the batch, so slots decoding together cost little more than one. A step
// holds the context lock only while it builds, evaluates and samples;
// whole-sequence work (state transfers, clears) takes the lock between
// steps.

// Config is what a scheduler works with.
type Config struct {
	Lock    *Lock
	Ctx     Context
	Vocab   Vocab
	Slots   Slots
	Prompts Prompts
	Cells   *kv.Cells
	Log     Logger
	Size    int  // the tokens a batch takes: n_batch
	Shift   bool // a full slot shifts its context (context_shift)
	// Rollback says that the context's memory cannot be cut back: a
	// drafting decoder's partial state is saved before its step (a memory
	// that keeps snapshots to cut from, llama.cpp's n_rs_seq, can).
	Rollback bool
	// Snapshots says that the memory cuts a rejected draft back from
	// snapshots of the step's states (llama.cpp's n_rs_seq), which hold
	// only for a step without prompt rows: no decoder drafts in a step
	// that evaluates a prompt.
	Snapshots bool
	Spec      *Speculation // nil without speculative decoding
}

// Scheduler runs the steps.
type Scheduler struct {
	Config
	batch Batch

	mu       sync.Mutex
	incoming []*Job
	wake     chan struct{} // 1-buffered: work arrived or a job was cancelled

	jobs []*Job // the loop's own

	clock stepClock // this step's times, for the speculative rule

	// Counters of the steps run, for the debug log and the tests.
	Steps, StepTokens atomic.Uint64
	Widest            atomic.Int32 // the most decoders one step evaluated
}

// New is a scheduler over c; Run starts it.
func New(c Config) *Scheduler {
	return &Scheduler{Config: c, wake: make(chan struct{}, 1)}
}

// Submit registers j; the loop picks it up at its next step.
func (s *Scheduler) Submit(j *Job) {
	s.mu.Lock()
	s.incoming = append(s.incoming, j)
	s.mu.Unlock()
	s.Poke()
}

// Poke wakes the loop: a job was cancelled or a caller made room.
func (s *Scheduler) Poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run steps while there is work and sleeps when there is none. It never
// returns: the scheduler lives as long as the plugin process.
func (s *Scheduler) Run() {
	for {
		if !s.Step() {
			<-s.wake
		}
	}
}

// Step runs one batch; false when no job could make progress (all idle or
// waiting for their callers). The jobs submitted so far join it once it
// holds the context lock: those whose callers took the lock before it
// (StepLock lets them go first) registered then, and are in this step
// rather than the next.
func (s *Scheduler) Step() bool {
	s.Lock.StepLock()
	defer s.Lock.Unlock()
	start := time.Now()
	s.takeIncoming()
	s.endCancelled()
	entries, n := s.build()
	if n == 0 {
		return false
	}
	s.clock.verifyStart = time.Now()
	err := s.Ctx.Decode(&s.batch)
	if errors.Is(err, ErrKVFull) {
		entries, err = s.retryDecodersOnly(entries)
	}
	if err != nil {
		s.failAll(entries, err)
		return true
	}
	s.process()
	queued := time.Now()
	s.count(entries)
	s.collect(entries)
	s.observe(entries)
	if s.Log.IsTrace() {
		s.trace(entries, start, queued)
	}
	return true
}

// stepClock is what a step's parts took: the drafting and the draft
// model's catch-up within it, the rollbacks' saves and the replays of
// rejected drafts, and the shape of the drafts.
type stepClock struct {
	draft, catchUp, save, replay time.Duration
	verifyStart                  time.Time // Decode called
	depth, drafting              int
	catchUpTokens, rolled        int
}

// observe gives the speculative rule a step's times: the batch from its
// Decode to its tokens sampled, without the replays, which it counts
// apart; only a decode-only step's say what decoding costs.
func (s *Scheduler) observe(entries []entry) {
	if s.Spec == nil {
		return
	}
	c, n := s.clock, 0
	for _, en := range entries {
		n += en.n
	}
	decodeOnly := !slices.ContainsFunc(entries, func(en entry) bool { return en.prompt })
	s.Spec.Rule.Observe(specrule.Step{Tokens: n, Depth: c.depth, Drafting: c.drafting, Draft: c.draft, CatchUp: c.catchUp,
		CatchUpTokens: c.catchUpTokens, Save: c.save, Verify: time.Since(c.verifyStart) - c.replay, Replay: c.replay,
		Rolled: c.rolled}, decodeOnly)
}

// trace logs a step at trace level: what it evaluated, the time until
// Decode returned (building the batch, llama.cpp's graph and inputs, the
// kernels' launch) and in all (with the wait for the device and the
// sampling), so that an operator can see where a request's latency goes.
func (s *Scheduler) trace(entries []entry, start, queued time.Time) {
	decoders, prompts, promptTokens := 0, 0, 0
	for _, en := range entries {
		if !en.prompt {
			decoders++
			continue
		}
		prompts++
		promptTokens += en.n
	}
	s.Log.Trace("step", "decoders", decoders, "prompts", prompts, "prompt_tokens", promptTokens,
		"queued_us", queued.Sub(start).Microseconds(), "total_us", time.Since(start).Microseconds())
}

// takeIncoming adds the jobs submitted since the last step to the loop's.
func (s *Scheduler) takeIncoming() {
	s.mu.Lock()
	s.jobs = append(s.jobs, s.incoming...)
	s.incoming = s.incoming[:0]
	s.mu.Unlock()
}

// count records a step.
func (s *Scheduler) count(entries []entry) {
	s.Steps.Add(1)
	dec := int32(0)
	for _, en := range entries {
		s.StepTokens.Add(uint64(en.n))
		if en.j.Decode != nil {
			dec++
		}
	}
	if dec > s.Widest.Load() {
		s.Widest.Store(dec)
	}
}

// Limit is why decoder j cannot take another token ("" when it can): its
// slot is full (unless the context shifts, which is then marked), or the
// cells all slots share are taken. Needs the lock.
func (s *Scheduler) Limit(j *Job) string {
	switch s.Cells.Room(j.Slot, s.Shift && s.Ctx.CanShift(), j.Decode.Req.NKeep) {
	case kv.RoomShift:
		j.Decode.needShift = true
	case kv.RoomSlotFull:
		return StopNTokensLimit
	case kv.RoomCacheFull:
		s.Log.Warn("KV cache full: the slots' sequences fill n_ctx together", "slot", j.Slot, "n_ctx", s.Cells.NCtx)
		return StopNTokensLimit
	}
	return ""
}

// endCancelled ends the jobs whose callers gave up: a prompt's slot is
// emptied (never half-prefilled); a decode whose last token passed on is
// still pending evaluates it first.
func (s *Scheduler) endCancelled() {
	for _, j := range s.jobs {
		if !j.Cancelled.Load() || j.ended {
			continue
		}
		if j.Prefill != nil {
			s.Slots.Clear(j)
			j.KV.Claim = 0
			s.Finish(j, ErrCancelled)
			continue
		}
		d := j.Decode
		keep := int(d.Emitted.Load())
		evaluated := d.Sampled
		if d.Pending >= 0 {
			evaluated--
		}
		if keep > evaluated { // the pending token was passed on: evaluate it, then end
			d.Stop = StopCancelled
			continue
		}
		d.Pending = -1 // the caller drops the tokens it did not pass on
		s.Finish(j, ErrCancelled)
	}
	s.dropEnded()
}

// failAll ends every job of a batch that could not be evaluated: their
// slots are emptied, since the KV may or may not hold the batch.
func (s *Scheduler) failAll(entries []entry, err error) {
	for _, en := range entries {
		s.Slots.Clear(en.j)
		en.j.KV.Claim = 0
		s.Finish(en.j, err)
	}
	s.dropEnded()
}

// Finish ends j with err (nil: done): its events close, then Done gets err,
// and the job leaves the loop at its next step. Needs the lock.
func (s *Scheduler) Finish(j *Job, err error) {
	if j.Decode != nil {
		close(j.Decode.Events)
	}
	j.KV.Claim, j.ended = 0, true
	j.Done <- err
}

// dropEnded removes the jobs that ended from the loop's list.
func (s *Scheduler) dropEnded() {
	s.jobs = slices.DeleteFunc(s.jobs, func(j *Job) bool { return j.ended })
}
