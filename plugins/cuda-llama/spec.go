//go:build llama && cgo

package cudallama

/*
#include <stdlib.h>
#include "spec.h"

*/
import "C"

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Speculative decoding: each step, every decoding slot may put a draft of
// the draft model's (llama.cpp's draft-simple, one draft batch for all
// slots) after its pending token; the target verifies them in the shared
// step, each sampled from the row before it as it would be alone, so the
// output is the one decoding without a draft gives, and the tail after the
// first mismatch is removed from both contexts; a target whose state cannot
// be cut back (hybrid, recurrent) restores the state it saved before the
// step and evaluates the kept tokens again (saveRollbacks, replay).
//
// The draft context holds, per slot, a prefix of the slot's tokens (held):
// before drafting each slot's held tokens are cut back to what they share
// with the slot's sequence and the rest evaluated, so the draft follows
// every change of the target's (prompt reuse, context shift, STATE_PUT,
// clears) by re-deriving its cells at the next step that drafts.
type speculator struct {
	c     *C.hydra_spec
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
	dctx     *lctx
	drafts   [][]byte
	draftMax int // draft_max: a draft's stride in outs
	rule     *specrule.Planner
	held     [][]int32             // per slot: the tokens the draft context holds, positions 0..
	acc      []specrule.Acceptance // per slot, across decodes
	// drafted and accepted count every slot's draft tokens, for INFO.
	drafted, accepted atomic.Uint64
	// scratch buffers of a step, reused
	toks, outs, hist []C.llama_token
	histOff          []C.int32_t
	pos, past        []C.llama_pos
	seqs             []C.llama_seq_id
	nMax, nOut       []C.int32_t
}

// newSpeculator loads the draft model and its context beside the target's;
// rollback says that the target's memory cannot be cut back (its drafting
// slots save their state before each step).
func newSpeculator(lc *lctx, opts llamaopt.Options, nSlots int, nGPU int, rollback bool) (*speculator, error) {
	var dft *model
	var dm *C.struct_llama_model
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
	types := C.CString(strings.Join(opts.SpecTypes, ","))
	defer C.free(unsafe.Pointer(types))
	p := C.struct_hydra_spec_params{
		n_ctx: C.uint32_t(lc.nCtx() + nSlots*(r.NMax+1)), n_batch: C.uint32_t(lc.nBatch), n_seq: C.uint32_t(nSlots),
		n_threads: C.int32_t(opts.NThreads), n_max: C.int32_t(r.NMax), n_min: C.int32_t(r.NMin), p_min: C.float(opts.DraftPMin),
		types:          types,
		ngram_simple_n: C.uint16_t(opts.NgramSimple[0]), ngram_simple_m: C.uint16_t(opts.NgramSimple[1]),
		ngram_map_n: C.uint16_t(opts.NgramMap[0]), ngram_map_m: C.uint16_t(opts.NgramMap[1]),
	}
	if opts.MTP() {
		p.mtp = 1
	}
	var msg [256]C.char
	c := C.hydra_spec_new(dm, lc.c, &p, &msg[0], C.size_t(len(msg)))
	if c == nil {
		if dft != nil {
			dft.free()
		}
		return nil, fmt.Errorf("%w: %s %s: %s", iface.ErrBadRequest, llamaopt.OptSpecType, strings.Join(opts.SpecTypes, ","), C.GoString(&msg[0]))
	}
	sp := &speculator{c: c, pMin: opts.DraftPMin, dft: dft, draftMax: r.NMax, rule: specrule.New(r, opts.DraftAlways, rollback),
		held: make([][]int32, nSlots), acc: make([]specrule.Acceptance, nSlots), mtp: opts.MTP(),
		ngram: slices.ContainsFunc(opts.SpecTypes, func(t string) bool { return strings.HasPrefix(t, "ngram-") })}
	if dft != nil && dft.recurrentState() {
		ctx := C.hydra_spec_ctx(c)
		sp.dctx, sp.drafts = &lctx{c: ctx, mem: C.llama_get_memory(ctx)}, make([][]byte, nSlots)
	}
	return sp, nil
}

// specBound is decoder j's part in the step's plan: its acceptance, the
// most it may draft (its request's n_max; its caller's buffer, n_predict
// and the cells, less the token it samples; 0 where it drafts nothing),
// its request's n_min and how far the draft model is behind its sequence.
func (s *scheduler) specBound(j *job, batchRoom int) specrule.Decoder {
	sp, d := s.e.spec, j.decode
	reqMax, reqMin, off := requestBounds(d.req.Speculative)
	if d.stop != "" || d.needShift || off {
		return specrule.Decoder{Acc: &sp.acc[j.slot]}
	}
	room := cap(d.events) - len(d.events) - 1
	if d.req.NPredict > 0 {
		room = min(room, d.req.NPredict-d.sampled-1)
	}
	room = min(room, s.e.cells.SlotCtx-len(j.s.Seq())-j.s.Claim-1, s.e.cells.Free()-1, batchRoom)
	if reqMax > 0 {
		room = min(room, reqMax)
	}
	return specrule.Decoder{Acc: &sp.acc[j.slot], Max: max(room, 0), Min: reqMin, Behind: sp.behind(j.slot, j.s.Seq())}
}

// behind is how many of seq's tokens the draft model would evaluate before
// drafting for slot i: those after the prefix it holds. That the prefix
// still is seq's is judged by its last token (planDrafts checks it whole
// when it drafts), so that a long sequence costs no scan a step.
func (sp *speculator) behind(i int, seq []int32) int {
	if sp.dft == nil {
		return 0 // n-gram lookups read the slot's tokens directly
	}
	h := sp.held[i]
	if n := len(h); n == 0 || n > len(seq) || h[n-1] != seq[n-1] {
		return len(seq)
	}
	return len(seq) - len(h)
}

// draftStep drafts for the step's decoders and stores each draft in its
// job, its cells claimed; room is the batch's tokens left after their
// pending ones. The rule (specrule) says how many each drafts; the time
// drafting takes and the rollbacks' saves are the step's to measure.
func (s *scheduler) draftStep(decoders []*job, room int) {
	sp := s.e.spec
	if sp == nil || len(decoders) == 0 {
		return
	}
	start := time.Now()
	ds := make([]specrule.Decoder, len(decoders))
	for i, j := range decoders {
		j.decode.draft, j.decode.nAccepted = nil, 0
		ds[i] = s.specBound(j, room)
	}
	// The decoders' cells are claimed in turn and the batch filled, so each
	// one's draft is bounded by what the drafts before it left.
	lens := make([]int, len(decoders))
	s.logRule(sp.rule.Plan(ds, lens))
	for i, j := range decoders {
		lens[i] = max(min(lens[i], s.e.cells.Free()-1, room), 0)
		room -= lens[i]
		j.s.Claim += lens[i]
		s.clock.depth = max(s.clock.depth, lens[i])
		if lens[i] > 0 {
			s.clock.drafting++
		}
	}
	if s.clock.depth == 0 {
		return
	}
	s.planDrafts(decoders, lens)
	for i, j := range decoders {
		j.s.Claim += len(j.decode.draft) - lens[i]
	}
	saved := time.Now()
	s.clock.draft = saved.Sub(start)
	s.saveRollbacks(decoders)
	s.clock.save = time.Since(saved)
}

// specStats is the speculative rule's last decision; nil without
// speculative decoding.
func (e *engine) specStats() *iface.SpeculativeStats {
	if e.spec == nil {
		return nil
	}
	st := e.spec.rule.Status()
	rule := llamaopt.DraftRuleMeasured
	if e.spec.rule.Always() {
		rule = llamaopt.DraftRuleAlways
	}
	return &iface.SpeculativeStats{Rule: rule, Drafting: st.Drafting, PlainRate: st.PlainRate, DraftRate: st.DraftRate,
		Stops: st.Stops, Probes: st.Probes}
}

// logRule says in the log when the rule stops or resumes drafting
// (changed), and why: the tokens a second it expects with and without
// drafts.
func (s *scheduler) logRule(changed bool) {
	if !changed {
		return
	}
	st := s.e.spec.rule.Status()
	msg := "speculative decoding stopped: drafts cost more than they bring (probes go on now and then)"
	if st.Drafting {
		msg = "speculative decoding drafts: drafts bring more than they cost"
	}
	s.e.log.Info(msg, "expected_tok_s_drafting", fmt.Sprintf("%.1f", st.DraftRate),
		"expected_tok_s_plain", fmt.Sprintf("%.1f", st.PlainRate), "stops", st.Stops, "probes", st.Probes)
}

// saveRollbacks saves, for each decoder with a draft on a target whose
// memory cannot be cut back (a hybrid's or recurrent model's state), the
// part that cannot, before the step evaluates the draft: a rejected draft
// token is undone by restoring it and evaluating the kept tokens again
// (replay; llama-server's checkpoint and replay, llama.cpp #19493). A
// decoder whose state cannot be saved goes on without its draft.
func (s *scheduler) saveRollbacks(decoders []*job) {
	if !s.e.layout.recurrent() {
		return
	}
	for _, j := range decoders {
		d := j.decode
		if len(d.draft) == 0 {
			continue
		}
		data, err := s.e.ctx.partialStateInto(j.slot, d.rollback)
		if err != nil {
			s.e.log.Warn("speculative decoding: the slot's state could not be saved before its draft: no draft this step",
				"slot", j.slot, "error", err)
			j.s.Claim -= len(d.draft)
			d.draft = nil
			continue
		}
		d.rollback = data
	}
}

// planDrafts drafts for the decoders (lens[i] tokens at most for
// decoders[i]) and stores each draft in its job.
func (s *scheduler) planDrafts(decoders []*job, lens []int) {
	sp := s.e.spec
	sp.toks, sp.pos, sp.seqs = sp.toks[:0], sp.pos[:0], sp.seqs[:0]
	sp.past, sp.nMax = sp.past[:0], sp.nMax[:0]
	var drafting []*job
	for i, sl := range s.e.cells.Slots {
		// Every slot's held cells are cut back to its sequence, so a slot
		// that changed frees the draft cells it no longer shares.
		seq := sl.Seq()
		if n := commonPrefix(sp.held[i], seq); n < len(sp.held[i]) {
			if sp.dctx != nil {
				n = 0 // a recurrent state is not cut back: the slot's tokens are evaluated again
			}
			C.hydra_spec_seq_rm(sp.c, C.int32_t(i), C.int32_t(n))
			sp.held[i] = sp.held[i][:n]
		}
	}
	sp.hist, sp.histOff = sp.hist[:0], sp.histOff[:0]
	for k, j := range decoders {
		if lens[k] == 0 {
			continue
		}
		seq := j.s.Seq()
		if sp.ngram {
			if !j.decode.specBegun {
				// A new generation: the n-gram maps index the tokens so far.
				j.decode.specBegun = true
				C.hydra_spec_begin(sp.c, C.int32_t(j.slot), (*C.llama_token)(unsafe.Pointer(&seq[0])), C.int32_t(len(seq)))
			}
			sp.histOff = append(sp.histOff, C.int32_t(len(sp.hist)))
			for _, t := range seq {
				sp.hist = append(sp.hist, C.llama_token(t))
			}
		}
		for p := len(sp.held[j.slot]); sp.dft != nil && p < len(seq); p++ {
			sp.toks = append(sp.toks, C.llama_token(seq[p]))
			sp.pos = append(sp.pos, C.llama_pos(p))
			sp.seqs = append(sp.seqs, C.llama_seq_id(j.slot))
		}
		drafting = append(drafting, j)
		sp.past = append(sp.past, C.llama_pos(len(seq)))
		sp.nMax = append(sp.nMax, C.int32_t(lens[k]))
	}
	if len(drafting) == 0 {
		return
	}
	if len(sp.toks) > 0 {
		start := time.Now()
		r := C.hydra_spec_eval(sp.c, &sp.toks[0], &sp.pos[0], &sp.seqs[0], C.int32_t(len(sp.toks)))
		s.clock.catchUp, s.clock.catchUpTokens = time.Since(start), len(sp.toks)
		if r != 0 {
			s.e.log.Warn("the draft model could not evaluate the slots' tokens: no drafts this step", "code", int(r))
			sp.dropAll()
			return
		}
		for _, j := range drafting {
			sp.held[j.slot] = append(sp.held[j.slot], j.s.Seq()[len(sp.held[j.slot]):]...)
		}
	}
	seqs := make([]C.llama_seq_id, len(drafting))
	last := make([]C.llama_token, len(drafting))
	for i, j := range drafting {
		seqs[i], last[i] = C.llama_seq_id(j.slot), C.llama_token(j.decode.pending)
	}
	stride := sp.draftMax
	sp.outs = slices.Grow(sp.outs[:0], len(drafting)*stride)[:len(drafting)*stride]
	sp.nOut = slices.Grow(sp.nOut[:0], len(drafting))[:len(drafting)]
	var hist *C.llama_token
	var histOff *C.int32_t
	if sp.ngram {
		sp.histOff = append(sp.histOff, C.int32_t(len(sp.hist)))
		if len(sp.hist) > 0 {
			hist = &sp.hist[0]
		}
		histOff = &sp.histOff[0]
	}
	if !sp.saveDrafts(drafting) {
		s.e.log.Warn("the draft model's state could not be saved before drafting: no drafts this step")
		sp.dropAll()
		return
	}
	C.hydra_spec_draft(sp.c, C.int32_t(len(drafting)), &seqs[0], &sp.past[0], &last[0], &sp.nMax[0],
		hist, histOff, &sp.outs[0], C.int32_t(stride), &sp.nOut[0])
	if err := sp.restoreDrafts(drafting); err != nil {
		s.e.log.Warn("the draft model's state could not be restored after drafting: it evaluates the slots' tokens again", "error", err)
		sp.dropAll()
	}
	for i, j := range drafting {
		n := int(sp.nOut[i])
		d := j.decode
		for k := range n {
			if int(sp.outs[i*stride+k]) >= s.e.model.nVocab {
				n = k // a draft vocabulary may be larger (llama.cpp allows 128 more): the target cannot take the rest
				break
			}
		}
		if _, reqMin, _ := requestBounds(d.req.Speculative); n < reqMin {
			n = 0 // shorter than the request's n_min: not verified
		}
		d.draft = make([]int32, n)
		for k := range n {
			d.draft[k] = int32(sp.outs[i*stride+k])
		}
		if testSawDraft != nil {
			testSawDraft(j.slot, int(sp.past[i]), d.draft)
		}
		if testDrafts != nil && sp.dft == nil {
			d.draft = testDrafts(j.slot, j.s.Seq(), d.pending, int(sp.nMax[i]))
		}
		if sp.mtp {
			// The MTP block drafted from its own hidden states: its cells
			// after the slot's tokens are not the target's (mtpProcess
			// writes those when the target verifies the draft).
			C.hydra_spec_seq_rm(sp.c, C.int32_t(j.slot), sp.past[i])
			continue
		}
		if sp.dft == nil || sp.dctx != nil {
			continue // a recurrent draft's state was restored to the slot's tokens (restoreDrafts)
		}
		// The draft model evaluated the pending token and some of the
		// draft (none of it where an n-gram drafted): the draft context
		// keeps those up to the draft's last token, which is not evaluated.
		past := int(sp.past[i])
		kept := min(int(C.hydra_spec_pos_max(sp.c, C.int32_t(j.slot)))+1, past+n)
		C.hydra_spec_seq_rm(sp.c, C.int32_t(j.slot), C.int32_t(max(kept, past)))
		if kept > past {
			sp.held[j.slot] = append(append(sp.held[j.slot], d.pending), d.draft[:kept-past-1]...)
		}
	}
}

// mtpProcess hands the batch the target just evaluated (n_tokens of
// s.batch) to the MTP block (draft-mtp), as llama-server does after every
// llama_decode (prompt chunks and steps), so that it holds each position
// with the target's hidden state before it, while the rule drafts or the
// step verified a probe's drafts: evaluating the block costs every step,
// so a rule that stopped drafting stops that too, and the block lacks the
// positions decoded meanwhile. A slot whose positions before the batch's
// it does not hold (those, a state put, a restore that evaluated nothing
// here) is taken to hold them: the block drafts from the positions it has,
// and its drafts are verified all the same.
func (s *scheduler) mtpProcess() {
	sp := s.e.spec
	if sp == nil || !sp.mtp || (s.clock.depth == 0 && !sp.rule.Always() && !sp.rule.Status().Drafting) {
		return
	}
	if C.hydra_spec_process(sp.c, s.e.ctx.lastBatch()) != 0 {
		s.e.log.Warn("the MTP block could not evaluate the step's batch: its cells are dropped, it drafts from the positions evaluated from now on")
		sp.dropAll()
		return
	}
	b := &s.batch
	n := b.Len()
	for i := 0; i < n; {
		slot, p0 := int(b.Seq[i]), int(b.Pos[i])
		k := i
		for k < n && int(b.Seq[k]) == slot {
			k++
		}
		h := sp.held[slot]
		if seq := s.e.cells.Slots[slot].Seq(); p0 > len(h) && len(seq) >= p0 {
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
	return sp.held[i], int(C.hydra_spec_pos_max(sp.c, C.int32_t(i)))
}

// saveDrafts saves, where the draft model's memory cannot be cut back, the
// part that cannot of each drafting slot's draft state: its tokens, before
// the draft model evaluates the pending token and the draft.
func (sp *speculator) saveDrafts(drafting []*job) bool {
	if sp.dctx == nil {
		return true
	}
	for _, j := range drafting {
		data, err := sp.dctx.partialStateInto(j.slot, sp.drafts[j.slot])
		if err != nil {
			return false
		}
		sp.drafts[j.slot] = data
	}
	return true
}

// restoreDrafts brings each drafting slot's draft state back to its
// tokens (saveDrafts) and cuts the draft's attention cells, so that the
// draft context holds what held says.
func (sp *speculator) restoreDrafts(drafting []*job) error {
	if sp.dctx == nil {
		return nil
	}
	for _, j := range drafting {
		if err := sp.dctx.setPartialState(j.slot, sp.drafts[j.slot]); err != nil {
			return err
		}
		if n := len(sp.held[j.slot]); !sp.dctx.SeqRmFrom(j.slot, n) {
			return fmt.Errorf("llama.cpp could not cut the draft sequence %d at %d after restoring its state", j.slot, n)
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
	if ctx := C.hydra_spec_ctx(sp.c); ctx != nil {
		return (&lctx{c: ctx}).useReferenceKernels()
	}
	return 0
}

// testSawDraft, where a test sets it, sees each draft made for slot at
// position pos (its pending token's) before testDrafts may replace it.
var testSawDraft func(slot, pos int, draft []int32)

// dropAll empties the draft context, which then re-derives every slot.
func (sp *speculator) dropAll() {
	for i := range sp.held {
		C.hydra_spec_seq_rm(sp.c, C.int32_t(i), 0)
		sp.held[i] = nil
	}
}

// draftRows looks up the logits of each draw's draft rows before the draws
// run in parallel: llama.cpp's first lookup after a decode may reorder its
// outputs, which must not race.
func (s *scheduler) draftRows(draws []draw) {
	for i := range draws {
		d := &draws[i]
		d.rows = d.rows[:0]
		for k := range d.j.decode.draft {
			d.rows = append(d.rows, s.e.ctx.rowLogits(d.row+k+1))
		}
	}
}

// sampleDraft samples decoder d's tokens from its rows: the first as
// without a draft, then, while each equals the draft token evaluated after
// it, the next from that token's row. Every token is sampled from the
// logits of exactly the sequence it follows, at its own position, so the
// tokens are those of decoding without the draft.
func (s *scheduler) sampleDraft(d *draw) {
	j, dj := d.j, d.j.decode
	pos := len(j.s.Seq())
	t := dj.smp.sample(s.e.model, d.logits, pos, dj.req.Logprobs)
	for i := 0; i < len(dj.draft) && t.ID == dj.draft[i] && !s.e.model.isEOG(t.ID); i++ {
		d.accepted = append(d.accepted, t)
		t = dj.smp.sample(s.e.model, d.rows[i], pos+i+1, dj.req.Logprobs)
	}
	d.tok = t
}

// acceptDrafted sends and keeps the draft tokens d accepted: each is in the
// KV already, evaluated in this step after the one before it.
func (s *scheduler) acceptDrafted(d draw) {
	j := d.j
	for _, t := range d.accepted {
		t.Text = s.e.model.piece(t.ID)
		j.decode.sampled++
		j.decode.events <- t // room for the whole draft was kept (specLen)
		j.s.Append([]int32{t.ID})
	}
	j.decode.nAccepted = len(d.accepted)
}

// settleDrafts ends the step's drafts: the cells after each slot's kept
// tokens are removed from the target's KV and their claims released, and
// the acceptance counts recorded. It returns the decoders whose memory
// could not be cut there (a hybrid's state past a rejected draft token):
// replay undoes their drafts once the step's logits are read.
func (s *scheduler) settleDrafts(entries []entry) (rolled []*job) {
	sp := s.e.spec
	if sp == nil {
		return nil
	}
	for _, en := range entries {
		d := en.j.decode
		if d == nil || len(d.draft) == 0 {
			continue
		}
		n := len(d.draft)
		if !s.e.ctx.SeqRmFrom(en.j.slot, len(en.j.s.Seq())) && d.rollback != nil {
			rolled = append(rolled, en.j)
		}
		en.j.s.Claim -= n
		if en.j.ended {
			en.j.s.Claim = 0
		}
		if testDrafts == nil || sp.mtp { // llama.cpp's drafter counts its own drafts' acceptance; MTP's takes the kept row's hidden state
			C.hydra_spec_accept(sp.c, C.int32_t(en.j.slot), C.int32_t(d.nAccepted))
		}
		sp.rule.Record(&sp.acc[en.j.slot], n, d.nAccepted)
		d.drafted += n
		d.accepted += d.nAccepted
		sp.drafted.Add(uint64(n))
		sp.accepted.Add(uint64(d.nAccepted))
	}
	return rolled
}

// keptRow is the batch row of the last token decoder en kept in the KV.
func (en entry) keptRow() int {
	if d := en.j.decode; d != nil && en.j.prefill == nil && !en.prompt {
		return en.first + d.nAccepted
	}
	return en.lastRow()
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

// free releases the draft context and model.
func (sp *speculator) free() {
	C.hydra_spec_free(sp.c)
	if sp.dft != nil {
		sp.dft.free()
	}
}
