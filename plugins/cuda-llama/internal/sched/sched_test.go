package sched_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched/schedtest"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
)

const nVocab = 97

// rig is a scheduler over the fake context, stepped by the test.
type rig struct {
	s    *sched.Scheduler
	ctx  *schedtest.Context
	host *schedtest.Host
	log  *schedtest.Log
	toks map[*sched.Job][]int32 // each decoder's tokens sent
	errs map[*sched.Job]error   // each ended job's error
}

// newRig has nSlots slots of slotCtx cells and batches of size tokens;
// with set, it changes the config (a drafter, a context shift).
func newRig(nSlots, slotCtx, size int, set func(*sched.Config)) *rig {
	ctx := &schedtest.Context{NVocab: nVocab}
	cells := &kv.Cells{NCtx: nSlots * slotCtx, SlotCtx: slotCtx}
	for range nSlots {
		cells.Slots = append(cells.Slots, kv.NewSlot(0))
	}
	r := &rig{ctx: ctx, host: &schedtest.Host{Ctx: ctx}, log: &schedtest.Log{},
		toks: map[*sched.Job][]int32{}, errs: map[*sched.Job]error{}}
	c := sched.Config{Lock: &sched.Lock{}, Ctx: ctx, Vocab: schedtest.Vocab{}, Slots: r.host, Prompts: r.host,
		Cells: cells, Log: r.log, Size: size}
	if set != nil {
		set(&c)
	}
	r.s = sched.New(c)
	return r
}

// prompt submits a prompt into slot, decoding n tokens after it (none: a
// prefill), as the adapter's startPrefill does.
func (r *rig) prompt(slot int, toks []int32, n int) *sched.Job {
	s := r.s.Cells.Slots[slot]
	s.Claim = len(toks)
	j := &sched.Job{Slot: slot, KV: s, Done: make(chan error, 1), Prefill: &sched.Prefill{Prompt: toks}}
	if n > 0 {
		j.Decode = sched.NewDecode(iface.DecodeRequest{Slot: slot, NPredict: n}, &schedtest.Greedy{}, len(toks))
	}
	r.s.Submit(j)
	return j
}

// step runs one step and takes what the jobs sent: tokens, ends.
func (r *rig) step(jobs ...*sched.Job) bool {
	ran := r.s.Step()
	for _, j := range jobs {
		r.drain(j)
	}
	return ran
}

func (r *rig) drain(j *sched.Job) {
	if j.Decode != nil {
		for len(j.Decode.Events) > 0 {
			r.toks[j] = append(r.toks[j], (<-j.Decode.Events).ID)
		}
	}
	select {
	case err := <-j.Done:
		r.errs[j] = err
	default:
	}
}

func (r *rig) ended(j *sched.Job) bool { _, ok := r.errs[j]; return ok }

// run steps until every job ended.
func (r *rig) run(t *testing.T, jobs ...*sched.Job) {
	t.Helper()
	for range 10000 {
		if !slices.ContainsFunc(jobs, func(j *sched.Job) bool { return !r.ended(j) }) {
			return
		}
		r.step(jobs...)
	}
	t.Fatal("the jobs did not end")
}

// checkMemory fails where a slot's memory holds other tokens than its
// sequence says.
func (r *rig) checkMemory(t *testing.T) {
	t.Helper()
	for i, s := range r.s.Cells.Slots {
		mem, ok := r.ctx.Tokens(i)
		if !ok || !slices.Equal(mem, s.Seq()) {
			t.Errorf("slot %d: memory %v (contiguous %v), sequence %v", i, mem, ok, s.Seq())
		}
	}
}

// chain is what greedy decoding gives after prompt: n tokens.
func chain(prompt []int32, n int) []int32 {
	hist := slices.Clone(prompt)
	for range n {
		hist = append(hist, schedtest.Next(hist, nVocab))
	}
	return hist[len(prompt):]
}

func ramp(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((from + i) % nVocab)
	}
	return out
}

// TestBatchedEqualsAlone: prompts of several lengths decoding together
// give each the tokens it gives alone, and leave each slot's memory its
// sequence; the decoders shared steps.
func TestBatchedEqualsAlone(t *testing.T) {
	prompts := [][]int32{ramp(1, 5), ramp(7, 37), ramp(20, 12), ramp(40, 60)}
	const n = 20
	r := newRig(len(prompts), 128, 16, nil)
	var jobs []*sched.Job
	for i, p := range prompts {
		jobs = append(jobs, r.prompt(i, p, n))
	}
	r.run(t, jobs...)
	for i, j := range jobs {
		alone := newRig(1, 128, 16, nil)
		aj := alone.prompt(0, prompts[i], n)
		alone.run(t, aj)
		if r.errs[j] != nil || !slices.Equal(r.toks[j], alone.toks[aj]) || !slices.Equal(r.toks[j], chain(prompts[i], n)) {
			t.Errorf("slot %d: batched %v (%v), alone %v, want %v", i, r.toks[j], r.errs[j], alone.toks[aj], chain(prompts[i], n))
		}
		if j.Decode.Stop != sched.StopLength || !slices.Equal(j.KV.Seq(), append(slices.Clone(prompts[i]), r.toks[j]...)) {
			t.Errorf("slot %d: stop %q, sequence %v", i, j.Decode.Stop, j.KV.Seq())
		}
	}
	r.checkMemory(t)
	if r.s.Widest.Load() != int32(len(prompts)) {
		t.Errorf("at most %d decoders a step, want %d", r.s.Widest.Load(), len(prompts))
	}
}

// TestPromptChunking: a prompt longer than n_batch is evaluated in chunks
// of n_batch, its logits those of its last token.
func TestPromptChunking(t *testing.T) {
	prompt := ramp(3, 100)
	r := newRig(1, 128, 16, nil)
	j := r.prompt(0, prompt, 0)
	r.run(t, j)
	if want := []int{16, 16, 16, 16, 16, 16, 4}; !slices.Equal(r.ctx.Batches, want) {
		t.Errorf("batches %v, want %v", r.ctx.Batches, want)
	}
	if r.errs[j] != nil || !slices.Equal(j.Prefill.Logits, schedtest.Logits(prompt, nVocab)) || j.KV.Claim != 0 ||
		j.Prefill.StateSize != 4*int64(len(prompt)) {
		t.Errorf("prefill: %v, claim %d, state %d, logits %v", r.errs[j], j.KV.Claim, j.Prefill.StateSize, j.Prefill.Logits[:4])
	}
	r.checkMemory(t)
}

// TestFairInterleaving: a long prompt arriving while slots decode takes
// what each step leaves after one token of every decoder, so each decoder
// gains a token every step it is in.
func TestFairInterleaving(t *testing.T) {
	r := newRig(3, 256, 8, nil)
	a, b := r.prompt(0, ramp(1, 3), 60), r.prompt(1, ramp(5, 3), 60)
	r.step(a, b) // the prompts; each samples its first token
	long := r.prompt(2, ramp(9, 64), 0)
	before := len(r.ctx.Batches)
	for !r.ended(long) {
		na, nb := len(r.toks[a]), len(r.toks[b])
		r.step(a, b, long)
		if len(r.toks[a]) != na+1 || len(r.toks[b]) != nb+1 {
			t.Fatalf("a step gave the decoders %d and %d tokens, want one each", len(r.toks[a])-na, len(r.toks[b])-nb)
		}
	}
	// 64 prompt tokens in chunks of 6 beside the decoders' 2: ten full
	// batches and one of 2+4.
	want := append(slices.Repeat([]int{8}, 10), 6)
	if got := r.ctx.Batches[before:]; !slices.Equal(got, want) {
		t.Errorf("batches %v, want %v", got, want)
	}
	r.run(t, a, b)
	if !slices.Equal(r.toks[a], chain(ramp(1, 3), 60)) || !slices.Equal(r.toks[b], chain(ramp(5, 3), 60)) {
		t.Error("the decoders' tokens differ from decoding alone")
	}
	r.checkMemory(t)
}

// TestSlowCaller: a decoder whose caller lets its events fill skips steps
// until it reads them; the others go on.
func TestSlowCaller(t *testing.T) {
	r := newRig(2, 128, 16, nil)
	slow, fast := r.prompt(0, ramp(1, 4), 30), r.prompt(1, ramp(2, 4), 30)
	for range 20 {
		r.s.Step()
		r.drain(fast)
	}
	if n := len(slow.Decode.Events); n != sched.EventBuffer {
		t.Errorf("the slow caller has %d tokens waiting, want %d", n, sched.EventBuffer)
	}
	r.run(t, slow, fast)
	if !slices.Equal(r.toks[slow], chain(ramp(1, 4), 30)) || !slices.Equal(r.toks[fast], chain(ramp(2, 4), 30)) {
		t.Error("tokens differ from decoding alone")
	}
}

// TestCancel: a prompt cancelled between its chunks empties its slot; a
// decoder whose caller passed its pending token on evaluates it and ends,
// one whose caller did not ends without it; either leaves its slot's
// memory its sequence.
func TestCancel(t *testing.T) {
	t.Run("prompt", func(t *testing.T) {
		r := newRig(1, 128, 16, nil)
		j := r.prompt(0, ramp(1, 40), 0)
		r.step(j)
		j.Cancelled.Store(true)
		r.step(j)
		if !errors.Is(r.errs[j], sched.ErrCancelled) || !slices.Equal(r.host.Cleared, []int{0}) || len(j.KV.Seq()) != 0 || j.KV.Claim != 0 {
			t.Errorf("end %v, cleared %v, sequence %d, claim %d", r.errs[j], r.host.Cleared, len(j.KV.Seq()), j.KV.Claim)
		}
		r.checkMemory(t)
	})
	for _, passed := range []bool{true, false} {
		name := map[bool]string{true: "pending passed on", false: "pending dropped"}[passed]
		t.Run(name, func(t *testing.T) {
			r := newRig(1, 128, 16, nil)
			prompt := ramp(1, 4)
			j := r.prompt(0, prompt, 50)
			for range 5 {
				r.step(j)
			}
			emitted := len(r.toks[j]) // all sent; the last is pending
			if !passed {
				emitted--
			}
			j.Decode.Emitted.Store(int64(emitted))
			j.Cancelled.Store(true)
			r.run(t, j)
			want := append(slices.Clone(prompt), chain(prompt, emitted)...)
			if !slices.Equal(j.KV.Seq(), want) {
				t.Errorf("sequence %v, want %v", j.KV.Seq(), want)
			}
			if passed && (r.errs[j] != nil || j.Decode.Stop != sched.StopCancelled) {
				t.Errorf("end %v, stop %q: want the pending token evaluated and a clean end", r.errs[j], j.Decode.Stop)
			}
			if !passed && !errors.Is(r.errs[j], sched.ErrCancelled) {
				t.Errorf("end %v, want cancelled", r.errs[j])
			}
			r.checkMemory(t)
		})
	}
}

// TestDecodeLimit: a decoder stops at its slot's share of the cells, or,
// with a context shift, shifts and goes on.
func TestDecodeLimit(t *testing.T) {
	prompt := ramp(1, 20)
	r := newRig(2, 32, 16, nil)
	j := r.prompt(0, prompt, 100)
	r.run(t, j)
	if r.errs[j] != nil || j.Decode.Stop != sched.StopNTokensLimit || len(j.KV.Seq()) != 32 ||
		!slices.Equal(r.toks[j], chain(prompt, 12)) {
		t.Errorf("end %v, stop %q, %d tokens in the slot, sent %v", r.errs[j], j.Decode.Stop, len(j.KV.Seq()), r.toks[j])
	}
	r.checkMemory(t)

	r = newRig(2, 32, 16, func(c *sched.Config) { c.Shift = true })
	j = r.prompt(0, prompt, 100)
	j.Decode.Req.NKeep = 4
	r.run(t, j)
	if r.errs[j] != nil || j.Decode.Stop != sched.StopLength || len(r.toks[j]) != 100 || r.host.Shifts == 0 || len(j.KV.Seq()) > 32 {
		t.Errorf("end %v, stop %q, %d sent, %d shifts, %d in the slot", r.errs[j], j.Decode.Stop, len(r.toks[j]), r.host.Shifts, len(j.KV.Seq()))
	}
	r.checkMemory(t)
}

// TestKVFullRetry: a batch the context finds no cells for is evaluated
// again with its decoders alone; the prompt waits for the next step.
func TestKVFullRetry(t *testing.T) {
	r := newRig(2, 128, 16, nil)
	d := r.prompt(0, ramp(1, 4), 10)
	r.step(d)
	full := true
	r.ctx.Fail = func(b *sched.Batch) error {
		if full && b.Len() > 1 {
			full = false
			return sched.ErrKVFull
		}
		return nil
	}
	p := r.prompt(1, ramp(8, 10), 0)
	r.step(d, p)
	if len(r.toks[d]) != 2 || p.Prefill.Next != 0 {
		t.Fatalf("after the retry: %d tokens, prompt at %d; want 2 and 0", len(r.toks[d]), p.Prefill.Next)
	}
	r.run(t, d, p)
	if r.errs[p] != nil || !slices.Equal(r.toks[d], chain(ramp(1, 4), 10)) {
		t.Errorf("prompt %v, tokens %v", r.errs[p], r.toks[d])
	}
	r.checkMemory(t)
}

// TestDecodeError: a batch that cannot be evaluated ends its jobs with the
// error and empties their slots.
func TestDecodeError(t *testing.T) {
	r := newRig(2, 128, 16, nil)
	boom := errors.New("boom")
	r.ctx.Fail = func(*sched.Batch) error { return boom }
	a, b := r.prompt(0, ramp(1, 4), 10), r.prompt(1, ramp(8, 10), 0)
	r.run(t, a, b)
	if !errors.Is(r.errs[a], boom) || !errors.Is(r.errs[b], boom) || len(r.host.Cleared) != 2 {
		t.Errorf("ends %v %v, cleared %v", r.errs[a], r.errs[b], r.host.Cleared)
	}
}

// guess drafts the greedy continuation after seq and pending for right
// tokens, then a wrong one.
func guess(right int) func(int, []int32, int32, int) []int32 {
	return func(_ int, seq []int32, pending int32, n int) []int32 {
		hist := append(slices.Clone(seq), pending)
		out := chain(hist, right)
		return append(out, (schedtest.Next(append(hist, out...), nVocab)+1)%nVocab)[:min(n, right+1)]
	}
}

// specRig drafts with d, always, at most nMax tokens; rollback as the
// memory is recurrent.
func specRig(nSlots int, d *schedtest.Drafter, nMax int, recurrent bool) (*rig, *sched.Speculation) {
	sp := &sched.Speculation{Drafter: d, Rule: specrule.New(specrule.Bounds{NMax: nMax, BatchMax: 64}, true, recurrent),
		Acc: make([]specrule.Acceptance, nSlots)}
	r := newRig(nSlots, 256, 64, func(c *sched.Config) { c.Spec, c.Rollback = sp, recurrent })
	r.ctx.Recurrent = recurrent
	return r, sp
}

// TestSpeculativeStep: each decoder's draft is verified in the shared
// step: the tokens are those of decoding without drafts, the accepted
// draft tokens count, and the rejected ones leave the memory, cut or (a
// recurrent state) restored and replayed.
func TestSpeculativeStep(t *testing.T) {
	for _, recurrent := range []bool{false, true} {
		name := map[bool]string{false: "cut", true: "replay"}[recurrent]
		t.Run(name, func(t *testing.T) {
			d := &schedtest.Drafter{Guess: guess(2)}
			r, sp := specRig(3, d, 4, recurrent)
			prompts := [][]int32{ramp(1, 5), ramp(30, 9), ramp(60, 2)}
			const n = 40
			var jobs []*sched.Job
			for i, p := range prompts {
				jobs = append(jobs, r.prompt(i, p, n))
			}
			r.run(t, jobs...)
			for i, j := range jobs {
				if r.errs[j] != nil || !slices.Equal(r.toks[j], chain(prompts[i], n)) {
					t.Errorf("slot %d: %v %v, want %v", i, r.errs[j], r.toks[j], chain(prompts[i], n))
				}
				// Every full draft keeps 2 of its 3 tokens.
				if !slices.Contains(d.Accepted[i], 2) || j.Decode.Accepted == 0 || j.Decode.Drafted <= j.Decode.Accepted {
					t.Errorf("slot %d: accepted %v, %d of %d draft tokens", i, d.Accepted[i], j.Decode.Accepted, j.Decode.Drafted)
				}
			}
			if sp.Accepted.Load() == 0 || sp.Drafted.Load() <= sp.Accepted.Load() {
				t.Errorf("%d of %d draft tokens accepted", sp.Accepted.Load(), sp.Drafted.Load())
			}
			if steps := r.s.Steps.Load(); steps >= n {
				t.Errorf("%d steps for %d tokens: the drafts did not save any", steps, n)
			}
			if r.log.Errors != 0 || r.log.Warnings != 0 {
				t.Errorf("%d errors, %d warnings logged", r.log.Errors, r.log.Warnings)
			}
			for _, s := range r.s.Cells.Slots {
				if s.Claim != 0 {
					t.Errorf("a claim of %d left", s.Claim)
				}
			}
			r.checkMemory(t)
		})
	}
}

// TestSpeculativeAllAccepted: drafts that are all right are all kept, the
// decoder taking its draft and one more token a step.
func TestSpeculativeAllAccepted(t *testing.T) {
	d := &schedtest.Drafter{Guess: guess(8)}
	r, sp := specRig(1, d, 3, false)
	prompt := ramp(1, 4)
	j := r.prompt(0, prompt, 33)
	r.run(t, j)
	if !slices.Equal(r.toks[j], chain(prompt, 33)) || sp.Accepted.Load() != sp.Drafted.Load() {
		t.Errorf("tokens %v, %d of %d accepted", r.toks[j], sp.Accepted.Load(), sp.Drafted.Load())
	}
	// The prompt's step, then 4 tokens a step: the first token's pending
	// and 3 drafts, ... until n_predict bounds the draft.
	if steps := r.s.Steps.Load(); steps > 1+33/4+1 {
		t.Errorf("%d steps", steps)
	}
	r.checkMemory(t)
}

// TestSpeculativeSnapshots: on a memory that cuts drafts back from
// snapshots (llama.cpp's n_rs_seq), no decoder drafts in a step that
// evaluates a prompt, and drafts in the others; the tokens are those of
// decoding without drafts.
func TestSpeculativeSnapshots(t *testing.T) {
	d := &schedtest.Drafter{Guess: guess(2)}
	sp := &sched.Speculation{Drafter: d, Rule: specrule.New(specrule.Bounds{NMax: 4, BatchMax: 64}, true, false),
		Acc: make([]specrule.Acceptance, 2)}
	r := newRig(2, 256, 8, func(c *sched.Config) { c.Spec, c.Snapshots = sp, true })
	mixed, prompts := 0, 0
	r.ctx.Fail = func(b *sched.Batch) error {
		rows, outputs := map[int32]int{}, map[int32]int{}
		for i := range b.Len() {
			rows[b.Seq[i]]++
			if b.Logits[i] {
				outputs[b.Seq[i]]++
			}
		}
		prompt, drafting := false, false
		for s, n := range rows {
			prompt = prompt || outputs[s] < n
			drafting = drafting || (n > 1 && outputs[s] == n)
		}
		if prompt {
			prompts++
		}
		if prompt && drafting {
			mixed++
		}
		return nil
	}
	pa, pb := ramp(1, 4), ramp(100, 30)
	a := r.prompt(0, pa, 40)
	for range 3 {
		r.step(a)
	}
	b := r.prompt(1, pb, 10) // four chunks of 8 beside a's decoding
	r.run(t, a, b)
	for _, c := range []struct {
		j *sched.Job
		p []int32
		n int
	}{{a, pa, 40}, {b, pb, 10}} {
		if r.errs[c.j] != nil || !slices.Equal(r.toks[c.j], chain(c.p, c.n)) {
			t.Errorf("slot %d: %v %v, want %v", c.j.Slot, r.errs[c.j], r.toks[c.j], chain(c.p, c.n))
		}
	}
	if mixed != 0 || prompts < 4 || sp.Drafted.Load() == 0 {
		t.Errorf("%d of %d steps with a prompt also verified drafts; %d draft tokens in all", mixed, prompts, sp.Drafted.Load())
	}
	r.checkMemory(t)
}
