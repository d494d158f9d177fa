//go:build llama && cgo

package cudallama

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/ckpt"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
)

// Prefill and Decode register with the scheduler (internal/sched) and wait for it;
// this file holds what they check before and the KV accounting they need.

// Prefill replaces the slot's sequence with the prompt. Tokens the slot
// already holds at the start of the prompt are kept, not evaluated again
// (the last one always is: its logits are the reply's); on any failure the
// slot is left empty, never half-prefilled.
func (b *Backend) Prefill(ctx context.Context, req iface.PrefillRequest) (iface.PrefillResult, error) {
	e, s, err := b.slot(req.Slot)
	if err != nil {
		return iface.PrefillResult{}, err
	}
	toks, _, err := e.promptTokens(req)
	if err != nil {
		return iface.PrefillResult{}, err
	}
	if err := s.Acquire(req.Slot); err != nil {
		return iface.PrefillResult{}, err
	}
	defer s.Release()
	e.fromCache(ctx, req.Slot, s, toks, req)
	j, reused, err := e.startPrefill(req.Slot, s, toks, e.spansOf(req, toks), nil)
	if err != nil {
		return iface.PrefillResult{}, err
	}
	if err := e.wait(ctx, j); err != nil {
		return iface.PrefillResult{}, err
	}
	size, logits := j.Prefill.StateSize, j.Prefill.Logits
	s.Set(toks, logits, size)
	// A recurrent state carries its logits itself (stateLogitsSize): the
	// blob's bytes after the state are the same, and sent once.
	replyLogits := slices.Clone(logits)
	if e.stateLogitsSize(logits) > 0 {
		size, replyLogits = size+e.stateLogitsSize(logits), nil
	}

	fallback := b.modelFallback(e, req)
	return iface.PrefillResult{
		Slot:          iface.SlotInfo{Slot: req.Slot, NPast: len(toks), Tokens: slices.Clone(toks), StateSize: size},
		Logits:        replyLogits,
		ModelFallback: fallback,
		Reused:        reused,
	}, nil
}

// modelFallback reports (and logs) a prompt asking for a model that is not
// the resident one, which answers it.
func (b *Backend) modelFallback(e *engine, req iface.PrefillRequest) bool {
	if req.Model == "" || req.Model == e.info.Model.Alias {
		return false
	}
	b.log.Warn("requested model is not resident, staying on the resident one",
		"requested", req.Model, "resident", e.info.Model.Alias, "slot", req.Slot)
	return true
}

// Tokenize returns the tokens Prefill would evaluate for req.
func (b *Backend) Tokenize(ctx context.Context, req iface.PrefillRequest) (iface.Prompt, error) {
	e, err := b.engine()
	if err != nil {
		return iface.Prompt{}, err
	}
	if req.Tokenize != nil {
		return e.tokenizeAPI(req)
	}
	toks, opens, err := e.promptTokens(req)
	return iface.Prompt{Tokens: toks, OpensThinking: opens}, err
}

// startPrefill keeps the slot's common prefix with toks (and, with
// cache_reuse, later chunks of its sequence the prompt repeats, moved into
// place by the scheduler), drops the rest of its sequence, claims the cells
// the prompt needs and registers the job; with then, the job decodes on
// once the prompt is in (promptDecode).
func (e *engine) startPrefill(i int, s *kv.Slot, toks []int32, spans ckpt.Spans, then *sched.Decode) (*sched.Job, int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := s.Seq()
	plan := kv.PlanPrefill(e.ctx, old, toks, e.cacheReuse)
	keep := plan.Keep
	if len(plan.Moves) == 0 {
		keep = e.resume(i, len(toks), plan.Prefix)
		s.Set(old[:keep:keep], nil, e.layout.size(0))
	} else {
		e.ckpts.CutTo(i, plan.Prefix, nil) // the moved chunks' positions change
	}
	need := len(toks) - keep
	if err := e.cells.Fits(i, need); err != nil {
		e.clearLocked(i, s)
		return nil, 0, err
	}
	s.Claim = need
	j := &sched.Job{Slot: i, KV: s, Done: make(chan error, 1),
		Prefill: &sched.Prefill{Prompt: toks, Next: keep, Moves: plan.Moves, Task: e.tasks.Add(1), Spans: spans}, Decode: then}
	e.sched.Submit(j)
	return j, keep, nil
}

// cut keeps the first keep positions of sequence i where its memory can
// be cut there (kv.Cut), else empties it. It returns the positions kept.
// Needs e.mu.
func (e *engine) cut(i, keep int) int {
	if kv.Cut(e.ctx, i, keep, e.nSWA) {
		e.ckpts.CutTo(i, keep, nil)
		return keep
	}
	if keep > 0 {
		e.log.Debug("the cached sequence cannot be cut to its common prefix with the prompt: evaluated again",
			"slot", i, "memory", e.layout.Memory, "prefix", keep)
	}
	e.ctx.SeqRm(i)
	e.ckpts.Clear(i) // a checkpoint restores onto the cells before it, gone now
	return 0
}

// applyMoves puts a prefill's reused chunks in place and drops the rest of
// the old sequence. Needs e.mu, with no state transfer in flight (the next
// llama_decode re-rotates the moved keys, rewriting the whole cache).
func (e *engine) applyMoves(i int, s *kv.Slot, p *sched.Prefill) {
	kv.ApplyMoves(e.ctx, i, p.Moves, p.Next)
	s.Set(p.Prompt[:p.Next:p.Next], nil, e.layout.size(0))
	e.log.Debug("prompt chunks reused from the cache", "slot", i, "chunks", len(p.Moves), "kept", p.Next)
	p.Moves = nil
}

// wait waits for j's end; ctx ending cancels it. A prefill that fails leaves
// its slot empty (the scheduler clears it).
func (e *engine) wait(ctx context.Context, j *sched.Job) error {
	select {
	case err := <-j.Done:
		return err
	case <-ctx.Done():
		j.Cancelled.Store(true)
		e.sched.Poke()
		<-j.Done
		return ctx.Err()
	}
}

// promptTokens validates a prefill's prompt and returns its tokens, and
// whether its template opened a reasoning block for the reply.
func (e *engine) promptTokens(req iface.PrefillRequest) ([]int32, bool, error) {
	toks, opens, err := e.promptOf(req)
	if err != nil {
		return nil, false, err
	}
	if len(toks) == 0 {
		return nil, false, fmt.Errorf("%w: the prompt has no tokens", iface.ErrBadRequest)
	}
	return toks, opens, e.cells.CheckPrompt(len(toks))
}

// promptOf tokenizes the prompt given: chat messages through the chat
// template, text as it is, or token ids checked against the vocabulary.
func (e *engine) promptOf(req iface.PrefillRequest) ([]int32, bool, error) {
	if err := req.CheckPrompt(e.model.nVocab); err != nil {
		return nil, false, err
	}
	switch {
	case req.Text != "":
		toks, err := e.model.tokenizePrompt(req.Text, "", e.cells.SlotCtx)
		return toks, false, err
	case len(req.Messages) > 0:
		return e.chatTokens(req)
	}
	return slices.Clone(req.Tokens), false, nil
}

// chatTokens renders chat messages with the Jinja template (or llama.cpp's
// matcher with jinja=false) and tokenizes the text, what the request put
// into it as text unless chat_parse_special is set (contentGuard).
func (e *engine) chatTokens(req iface.PrefillRequest) ([]int32, bool, error) {
	var text string
	var opens bool
	var err error
	g := newContentGuard(e.model.tok.special, e.chatParseSpecial)
	if e.chat != nil {
		text, opens, err = e.chat.render(req.Messages, req.Tools, req.TemplateKwargs, g)
	} else if len(req.Tools) > 0 || req.TemplateKwargs != "" {
		err = fmt.Errorf("%w: tools and chat_template_kwargs need the Jinja template (the backend runs with jinja=false)", iface.ErrBadRequest)
	} else {
		text, err = e.model.applyTemplate(g.messages(req.Messages))
	}
	if err != nil {
		return nil, false, err
	}
	toks, err := e.model.tokenizePrompt(text, g.m, e.cells.SlotCtx)
	return toks, opens, err
}

// Decode continues the slot's sequence. Each token is sent to emit as soon
// as it is sampled and evaluated in the next step; Decode returns once the
// KV holds every token emitted, so a STATE_GET after it has them all.
// Interrupted (ctx ends or emit fails), the slot keeps the tokens emitted.
func (b *Backend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	e, s, err := b.slot(req.Slot)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	if req.NPredict < 0 {
		return iface.DecodeResult{}, fmt.Errorf("%w: n_predict %d is negative", iface.ErrBadRequest, req.NPredict)
	}
	var pMin float32
	if e.spec != nil {
		pMin = e.spec.pMin
	}
	if err := checkSpeculative(req.Speculative, e.spec != nil, pMin); err != nil {
		return iface.DecodeResult{}, err
	}
	out, err := e.newOutputRun(req.Output)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	res, err := b.decode(ctx, e, s, req, out, out.wrap(emit))
	return out.finish(e, res, err)
}

// decode is a Decode whose output (nil: free text) is prepared.
func (b *Backend) decode(ctx context.Context, e *engine, s *kv.Slot, req iface.DecodeRequest, out *outputRun, emit func(iface.Token) error) (iface.DecodeResult, error) {
	if req.Prompt != nil {
		return b.promptDecode(ctx, e, s, req, out, emit)
	}
	if err := s.Acquire(req.Slot); err != nil {
		return iface.DecodeResult{}, err
	}
	defer s.Release()
	logits, err := b.decodeStart(e, req.Slot, s)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	defer e.updateStateSize(req.Slot, s)
	j, smp, err := e.startDecode(req, s, logits, out)
	if err != nil || j == nil {
		return iface.DecodeResult{NPast: len(s.Seq()), StopReason: e.stopReasonOf(err)}, ignoreStop(err)
	}
	return e.streamDecode(ctx, j, smp, emit)
}

// streamDecode passes decoder j's tokens to emit until it ends, then frees
// its sampler smp; interrupted, the slot keeps the tokens emitted.
func (e *engine) streamDecode(ctx context.Context, j *sched.Job, smp *sampler, emit func(iface.Token) error) (iface.DecodeResult, error) {
	n, err := e.stream(ctx, j, smp, emit)
	if err != nil {
		e.keepEmitted(j.Slot, j.KV, j.Decode.Base+n)
	}
	res := iface.DecodeResult{TokensGenerated: n, NPast: len(j.KV.Seq()), StopReason: j.Decode.Stop,
		DraftTokens: j.Decode.Drafted, DraftAccepted: j.Decode.Accepted}
	if res.StopReason == "" || res.StopReason == sched.StopCancelled {
		res.StopReason = StopLength
	}
	return res, err
}

// errStopBefore carries the stop reason of a decode that ends before its
// first token.
type errStopBefore struct{ reason string }

func (e errStopBefore) Error() string { return "decode stops: " + e.reason }

func (e *engine) stopReasonOf(err error) string {
	var sb errStopBefore
	if errors.As(err, &sb) {
		return sb.reason
	}
	return ""
}

func ignoreStop(err error) error {
	var sb errStopBefore
	if errors.As(err, &sb) {
		return nil
	}
	return err
}

// startDecode builds the request's sampler (with out's grammar), samples the first token from
// the slot's logits and registers the job; (nil, errStopBefore) when the
// decode ends before any token.
func (e *engine) startDecode(req iface.DecodeRequest, s *kv.Slot, logits []float32, out *outputRun) (*sched.Job, *sampler, error) {
	if req.NPredict == 0 {
		return nil, nil, errStopBefore{StopLength}
	}
	history := s.Seq()
	smp, err := newSampler(e.model, req.Sampler, req.NProbs, e.cells.SlotCtx, history)
	if err != nil {
		return nil, nil, err
	}
	if err := out.attach(e.model, smp); err != nil {
		smp.free()
		return nil, nil, err
	}
	j := &sched.Job{Slot: req.Slot, KV: s, Done: make(chan error, 1), Decode: sched.NewDecode(req, smp, len(history))}
	e.mu.Lock()
	stop := e.sched.Limit(j)
	var t iface.Token
	if stop == "" {
		t = smp.Sample(logits, len(history), req.Logprobs)
		if e.model.IsEOG(t.ID) && !req.Sampler.IgnoreEOS {
			stop = StopEOS
		}
	}
	if stop != "" {
		e.mu.Unlock()
		smp.free()
		return nil, nil, errStopBefore{stop}
	}
	t.Text = e.model.Piece(t.ID)
	j.Decode.Queue(j, t)
	if j.Decode.Pending < 0 { // one token, sent and not evaluated: no step to run
		e.sched.Finish(j, nil)
		e.mu.Unlock()
		return j, smp, nil
	}
	e.mu.Unlock()
	e.sched.Submit(j)
	return j, smp, nil
}

// stream passes the job's tokens to emit until it ends, returning how many
// were emitted, then frees its sampler smp. On ctx ending or emit failing
// it cancels the job, telling it how many tokens to keep, and waits for it.
func (e *engine) stream(ctx context.Context, j *sched.Job, smp *sampler, emit func(iface.Token) error) (int, error) {
	d := j.Decode
	defer smp.free()
	n := 0
	for {
		select {
		case t, ok := <-d.Events:
			if !ok {
				return n, <-j.Done
			}
			e.sched.Poke() // a decoder that waited for room in events goes on
			// A token handed to emit counts as emitted even when emit fails:
			// the caller may have passed some of it on.
			n++
			if emit != nil {
				if err := emit(t); err != nil {
					return n, e.cancelDecode(j, n, err)
				}
			}
		case <-ctx.Done():
			return n, e.cancelDecode(j, n, ctx.Err())
		}
	}
}

// cancelDecode ends j, telling it the n tokens emitted, and returns err.
func (e *engine) cancelDecode(j *sched.Job, n int, err error) error {
	j.Decode.Emitted.Store(int64(n))
	j.Cancelled.Store(true)
	e.sched.Poke()
	for range j.Decode.Events { // the scheduler closes them when it ends the job
	}
	<-j.Done
	return err
}

// keepEmitted drops what an interrupted decode evaluated past the n tokens
// the slot is to keep (those sampled ahead of a caller that stopped
// reading); the next decode recomputes the logits.
func (e *engine) keepEmitted(i int, s *kv.Slot, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(s.Seq()) > n {
		s.Truncate(e.cut(i, n))
	}
}

// decodeStart returns the slot's logits, computing them first when a restore
// left them to the first decode (restore_logits=lazy) or an interrupted
// decode dropped them.
func (b *Backend) decodeStart(e *engine, i int, s *kv.Slot) ([]float32, error) {
	toks, logits, _ := s.Snapshot()
	if len(toks) == 0 {
		return nil, fmt.Errorf("%w: slot is empty (slot %d)", iface.ErrBadRequest, i)
	}
	if logits != nil {
		return logits, nil
	}
	t := time.Now()
	logits, err := e.reevaluate(i, toks)
	if err != nil {
		return nil, e.failed(i, s, err)
	}
	b.log.Debug("decode re-evaluated the last token", "slot", i, "reeval", time.Since(t).String())
	s.SetLogits(logits)
	return logits, nil
}

// shiftContext makes room in a full slot as llama-server's context shift
// does (kv.Shift); the KV's keys are re-rotated by the next llama_decode.
// Needs e.mu, with no state transfer in flight.
func (e *engine) shiftContext(i int, s *kv.Slot, nKeep int) {
	kept, keep, discard := kv.Shift(e.ctx, i, s.Seq(), nKeep, e.model.bos)
	e.ckpts.Clear(i) // the positions moved
	s.Set(kept, s.Logits(), s.StateSize())
	e.log.Debug("context shift", "slot", i, "n_keep", keep, "n_discard", discard, "n_past", len(kept))
}

// updateStateSize records the slot's state size after it changed.
func (e *engine) updateStateSize(i int, s *kv.Slot) {
	e.mu.Lock()
	size := e.ctx.StateSize(i)
	e.mu.Unlock()
	s.SetStateSize(size)
}
