//go:build llama && cgo

package cudallama

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Speculative decoding: each step, every decoding slot may put a draft of
// the draft model's (llama.cpp's draft-simple, one draft batch for all
// slots) after its pending token; the target verifies them in the shared
// step, each sampled from the row before it as it would be alone, so the
// output is the one decoding without a draft gives, and the tail after the
// first mismatch is removed from both contexts; a hybrid or recurrent
// target's state is cut back from the snapshots llama.cpp keeps of each
// step's last draft_max states (n_rs_seq; no draft in a step that evaluates
// a prompt, where they do not hold), or, in a context without them,
// restored from a copy saved before the step and the kept tokens evaluated
// again (internal/sched: saveRollbacks, replay). This file is the drafting
// itself, the scheduler's Drafter.
//
// The draft context holds, per slot, a prefix of the slot's tokens (held):
// before drafting each slot's held tokens are cut back to what they share
// with the slot's sequence and the rest evaluated, so the draft follows
// every change of the target's (prompt reuse, context shift, STATE_PUT,
// clears) by re-deriving its cells at the next step that drafts.
type speculator struct {
	c     *llama.Draft
	pMin  float32 // draft_p_min
	dft   *model  // nil: n-gram types or draft-mtp only, no draft model
	ngram bool    // an n-gram type reads each slot's tokens
	// mtp: the draft context is the target's MTP block (draft-mtp), fed
	// every batch the target evaluates (mtpProcess) rather than caught up
	// by the token; held is what it holds of each slot.
	mtp bool
	// dctx is the draft model's context where its memory cannot be cut
	// back (a hybrid or recurrent draft model), nil otherwise: each
	// drafting slot's state is saved before its draft (drafts) and
	// restored after, so that the draft context holds the slot's tokens
	// alone and evaluates the accepted ones at the next draft.
	dctx   *lctx
	drafts [][]byte
	held   [][]int32 // per slot: the tokens the draft context holds, positions 0..
	// Speculation is the scheduler's side: the rule, the slots' acceptance
	// and the counts; its Drafter is sp.
	*sched.Speculation
	// slots, nVocab and log are the engine's: the slots whose tokens the
	// draft model drafts after.
	slots  []*kv.Slot
	nVocab int
	log    hclog.Logger
	// scratch buffers of a step, reused: the catch-up's tokens and the
	// drafting sequences
	toks, pos, seqs []int32
	reqs            []llama.DraftSeq
}

// newSpeculator loads the draft model and its context beside the target's,
// drafting for slots; rollback says that the target's memory cannot be cut
// back (its drafting slots save their state before each step).
func newSpeculator(lc *lctx, opts llamaopt.Options, slots []*kv.Slot, nGPU int, rollback bool, log hclog.Logger) (*speculator, error) {
	nSlots := len(slots)
	var dft *model
	var dm llama.Model
	if opts.DraftModel != "" {
		path, err := checkModelFile(opts.DraftModel)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", llamaopt.OptDraftModel, err)
		}
		if dft, err = loadModel(path, modelParams{nGPULayers: nGPU, mmap: opts.Mmap}); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", iface.ErrBadRequest, llamaopt.OptDraftModel, err)
		}
		dm = dft.m
	}
	r := opts.SpecBounds
	c, err := llama.NewDraft(dm, lc.binding(), llama.DraftParams{
		NCtx: lc.NCtx() + nSlots*(r.NMax+1), NBatch: lc.nBatch, NSeq: nSlots, NThreads: opts.NThreads,
		NMax: r.NMax, NMin: r.NMin, PMin: opts.DraftPMin, Types: opts.SpecTypes,
		NgramSimple: opts.NgramSimple, NgramMap: opts.NgramMap, MTP: opts.MTP(),
	})
	if err != nil {
		if dft != nil {
			dft.free()
		}
		return nil, fmt.Errorf("%w: %s %s: %s", iface.ErrBadRequest, llamaopt.OptSpecType, strings.Join(opts.SpecTypes, ","), err)
	}
	sp := &speculator{c: c, pMin: opts.DraftPMin, dft: dft, held: make([][]int32, nSlots), mtp: opts.MTP(),
		ngram: slices.ContainsFunc(opts.SpecTypes, func(t string) bool { return strings.HasPrefix(t, "ngram-") }),
		slots: slots, nVocab: lc.nVocab, log: log}
	sp.Speculation = &sched.Speculation{Drafter: sp, Rule: specrule.New(r, opts.DraftAlways, rollback), Acc: make([]specrule.Acceptance, nSlots)}
	if dft != nil && dft.recurrentState() {
		sp.dctx, sp.drafts = ofContext(c.Context()), make([][]byte, nSlots)
	}
	return sp, nil
}

// Behind is how many of seq's tokens the draft model would evaluate before
// drafting for slot i: those after the prefix it holds. That the prefix
// still is seq's is judged by its last token (Draft checks it whole when
// it drafts), so that a long sequence costs no scan a step.
func (sp *speculator) Behind(i int, seq []int32) int {
	if sp.dft == nil {
		return 0 // n-gram lookups read the slot's tokens directly
	}
	h := sp.held[i]
	if n := len(h); n == 0 || n > len(seq) || h[n-1] != seq[n-1] {
		return len(seq)
	}
	return len(seq) - len(h)
}

// specStats is the speculative rule's last decision; nil without
// speculative decoding.
func (e *engine) specStats() *iface.SpeculativeStats {
	if e.spec == nil {
		return nil
	}
	st := e.spec.Rule.Status()
	rule := llamaopt.DraftRuleMeasured
	if e.spec.Rule.Always() {
		rule = llamaopt.DraftRuleAlways
	}
	t := st.Totals
	return &iface.SpeculativeStats{Rule: rule, Drafting: st.Drafting, PlainRate: st.PlainRate, DraftRate: st.DraftRate,
		Stops: st.Stops, Probes: st.Probes, PlainSteps: t.PlainSteps, DraftSteps: t.DraftSteps, PlainSeconds: t.PlainSeconds,
		DraftSeconds: t.DraftSeconds, CatchUpSeconds: t.CatchUpSeconds, SaveSeconds: t.SaveSeconds,
		VerifySeconds: t.VerifySeconds, ReplaySeconds: t.ReplaySeconds}
}

// Draft drafts for the decoders (lens[i] tokens at most for decoders[i])
// and stores each draft in its job; it returns the time and tokens the
// draft model took to catch up with their sequences.
func (sp *speculator) Draft(decoders []*sched.Job, lens []int) (catchUp time.Duration, catchUpTokens int) {
	sp.toks, sp.pos, sp.seqs, sp.reqs = sp.toks[:0], sp.pos[:0], sp.seqs[:0], sp.reqs[:0]
	var drafting []*sched.Job
	for i, sl := range sp.slots {
		// Every slot's held cells are cut back to its sequence, so a slot
		// that changed frees the draft cells it no longer shares.
		seq := sl.Seq()
		if n := commonPrefix(sp.held[i], seq); n < len(sp.held[i]) {
			if sp.dctx != nil {
				n = 0 // a recurrent state is not cut back: the slot's tokens are evaluated again
			}
			sp.c.SeqRm(i, n)
			sp.held[i] = sp.held[i][:n]
		}
	}
	for k, j := range decoders {
		if lens[k] == 0 {
			continue
		}
		seq := j.KV.Seq()
		var hist []int32
		if sp.ngram {
			if !j.Decode.SpecBegun {
				// A new generation: the n-gram maps index the tokens so far.
				j.Decode.SpecBegun = true
				sp.c.Begin(j.Slot, seq)
			}
			hist = seq
		}
		for p := len(sp.held[j.Slot]); sp.dft != nil && p < len(seq); p++ {
			sp.toks = append(sp.toks, seq[p])
			sp.pos = append(sp.pos, int32(p))
			sp.seqs = append(sp.seqs, int32(j.Slot))
		}
		drafting = append(drafting, j)
		sp.reqs = append(sp.reqs, llama.DraftSeq{Seq: int32(j.Slot), Past: int32(len(seq)), Last: j.Decode.Pending, Max: int32(lens[k]), Hist: hist})
	}
	if len(drafting) == 0 {
		return 0, 0
	}
	if len(sp.toks) > 0 {
		start := time.Now()
		err := sp.c.Eval(sp.toks, sp.pos, sp.seqs)
		catchUp, catchUpTokens = time.Since(start), len(sp.toks)
		if err != nil {
			var code llama.DraftDecodeError
			errors.As(err, &code)
			sp.log.Warn("the draft model could not evaluate the slots' tokens: no drafts this step", "code", int(code))
			sp.dropAll()
			return catchUp, catchUpTokens
		}
		for _, j := range drafting {
			sp.held[j.Slot] = append(sp.held[j.Slot], j.KV.Seq()[len(sp.held[j.Slot]):]...)
		}
	}
	if !sp.saveDrafts(drafting) {
		sp.log.Warn("the draft model's state could not be saved before drafting: no drafts this step")
		sp.dropAll()
		return catchUp, catchUpTokens
	}
	drafts := sp.c.Draft(sp.reqs)
	if err := sp.restoreDrafts(drafting); err != nil {
		sp.log.Warn("the draft model's state could not be restored after drafting: it evaluates the slots' tokens again", "error", err)
		sp.dropAll()
	}
	for i, j := range drafting {
		out, req := drafts[i], sp.reqs[i]
		n := len(out)
		d := j.Decode
		for k := range n {
			if int(out[k]) >= sp.nVocab {
				n = k // a draft vocabulary may be larger (llama.cpp allows 128 more): the target cannot take the rest
				break
			}
		}
		if _, reqMin, _ := sched.RequestBounds(d.Req.Speculative); n < reqMin {
			n = 0 // shorter than the request's n_min: not verified
		}
		d.Draft = make([]int32, n)
		copy(d.Draft, out)
		if testSawDraft != nil {
			testSawDraft(j.Slot, int(req.Past), d.Draft)
		}
		if testDrafts != nil && sp.dft == nil {
			d.Draft = testDrafts(j.Slot, j.KV.Seq(), d.Pending, int(req.Max))
		}
		if sp.mtp {
			// The MTP block drafted from its own hidden states: its cells
			// after the slot's tokens are not the target's (mtpProcess
			// writes those when the target verifies the draft).
			sp.c.SeqRm(j.Slot, int(req.Past))
			continue
		}
		if sp.dft == nil || sp.dctx != nil {
			continue // a recurrent draft's state was restored to the slot's tokens (restoreDrafts)
		}
		// The draft model evaluated the pending token and some of the
		// draft (none of it where an n-gram drafted): the draft context
		// keeps those up to the draft's last token, which is not evaluated.
		past := int(req.Past)
		kept := min(sp.c.PosMax(j.Slot)+1, past+n)
		sp.c.SeqRm(j.Slot, max(kept, past))
		if kept > past {
			sp.held[j.Slot] = append(append(sp.held[j.Slot], d.Pending), d.Draft[:kept-past-1]...)
		}
	}
	return catchUp, catchUpTokens
}

// Accept tells llama.cpp's drafter how many of slot's draft tokens the
// target kept: it counts its own drafts' acceptance (not testDrafts'), and
// an MTP block takes the kept row's hidden state.
func (sp *speculator) Accept(slot, n int) {
	if testDrafts == nil || sp.mtp {
		sp.c.Accept(slot, n)
	}
}

// Process hands the batch b the target just evaluated to the MTP block
// (draft-mtp), as llama-server does after every llama_decode (prompt
// chunks and steps), so that it holds each position with the target's
// hidden state before it; the scheduler hands it only while the rule
// drafts or the step verified a probe's drafts, so the block lacks the
// positions decoded meanwhile. A slot whose positions before the batch's
// it does not hold (those, a state put, a restore that evaluated nothing
// here) is taken to hold them: the block drafts from the positions it has,
// and its drafts are verified all the same.
func (sp *speculator) Process(b *sched.Batch) {
	if !sp.mtp {
		return
	}
	if sp.c.Process(b.Token, b.Pos, b.Seq, b.Logits) != nil {
		sp.log.Warn("the MTP block could not evaluate the step's batch: its cells are dropped, it drafts from the positions evaluated from now on")
		sp.dropAll()
		return
	}
	n := b.Len()
	for i := 0; i < n; {
		slot, p0 := int(b.Seq[i]), int(b.Pos[i])
		k := i
		for k < n && int(b.Seq[k]) == slot {
			k++
		}
		h := sp.held[slot]
		if seq := sp.slots[slot].Seq(); p0 > len(h) && len(seq) >= p0 {
			h = append(h, seq[len(h):p0]...)
		}
		if p0 <= len(h) {
			h = h[:p0]
			h = append(h, b.Token[i:k]...)
			sp.held[slot] = h
		}
		i = k
	}
}

// mtpHolds is what the MTP context holds of slot i: the tokens held says
// and its last position (-1: none).
func (sp *speculator) mtpHolds(i int) ([]int32, int) {
	return sp.held[i], sp.c.PosMax(i)
}

// saveDrafts saves, where the draft model's memory cannot be cut back, the
// part that cannot of each drafting slot's draft state: its tokens, before
// the draft model evaluates the pending token and the draft.
func (sp *speculator) saveDrafts(drafting []*sched.Job) bool {
	if sp.dctx == nil {
		return true
	}
	for _, j := range drafting {
		data, err := sp.dctx.PartialStateInto(j.Slot, sp.drafts[j.Slot])
		if err != nil {
			return false
		}
		sp.drafts[j.Slot] = data
	}
	return true
}

// restoreDrafts brings each drafting slot's draft state back to its
// tokens (saveDrafts) and cuts the draft's attention cells, so that the
// draft context holds what held says.
func (sp *speculator) restoreDrafts(drafting []*sched.Job) error {
	if sp.dctx == nil {
		return nil
	}
	for _, j := range drafting {
		if err := sp.dctx.SetPartialState(j.Slot, sp.drafts[j.Slot]); err != nil {
			return err
		}
		if n := len(sp.held[j.Slot]); !sp.dctx.SeqRmFrom(j.Slot, n) {
			return fmt.Errorf("llama.cpp could not cut the draft sequence %d at %d after restoring its state", j.Slot, n)
		}
	}
	return nil
}

// testDrafts, where a test sets it (n-gram drafting only), replaces each
// drafting slot's draft with its own of at most n tokens after pending:
// drafts of a chosen acceptance, which no draft of the tests' random-weight
// models gives.
var testDrafts func(slot int, seq []int32, pending int32, n int) []int32

// useReferenceKernels switches the draft context's CPU work to ggml's
// reference kernels as lctx.useReferenceKernels does the target's.
func (sp *speculator) useReferenceKernels() int {
	if ctx := sp.c.Context(); ctx != nil {
		return ctx.UseReferenceKernels()
	}
	return 0
}

// testSawDraft, where a test sets it, sees each draft made for slot at
// position pos (its pending token's) before testDrafts may replace it.
var testSawDraft func(slot, pos int, draft []int32)

// dropAll empties the draft context, which then re-derives every slot.
func (sp *speculator) dropAll() {
	for i := range sp.held {
		sp.c.SeqRm(i, 0)
		sp.held[i] = nil
	}
}

func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
