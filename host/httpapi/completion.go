package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/stoptext"
)

// A completion runs in steps: the body is validated, a slot taken from the
// host's table, the prompt prefilled into it before any reply byte, then
// decoded; with "stream":true every token the backend emits goes out at once
// as a server-sent event.

// errStopString ends a decode whose text reached a stop string.
var errStopString = errors.New("stop string reached")

// completionRun is one completion in flight, holding its slot.
type completionRun struct {
	// draftN and draftAccepted add up the decodes' draft tokens (timings).
	draftN, draftAccepted int

	a    *api
	ctx  context.Context // the request's: cancelled when the client goes
	b    iface.Backend
	info iface.BackendInfo
	c    request.Completion
	slot int
	// arrived is when the request came, where its time to first token starts.
	arrived time.Time

	sink run.Sink // the reply, in the request's dialect
	head run.Head // the fields every event of the reply shares

	nPrompt int           // tokens in the slot after the prefill
	prompt  time.Duration // the prefill's time
	reused  int           // prompt tokens kept from the slot's previous sequence
	stop    string        // the backend's stop reason ("stop_string": a stop string ended the decode)
	// stopWord is the stop string that ended the reply, where one did and
	// it is known (a parsed reply's is known when only one was given).
	stopWord string
	// promptDecode: the decode evaluates the prompt first (promptInDecode).
	promptDecode bool
	nPredict     int    // tokens the decode may generate
	nPast        int    // tokens in the slot once the decode ended
	taskID       int64  // the completion's task, for /slots
	release      func() // frees the slot (once; later calls do nothing)
	// firstToken is when the first token came; interToken observes the gaps
	// between the next ones.
	firstToken time.Time
	interToken prometheus.Observer

	// The reply's text so far: reasoning apart from content where the chat's
	// reasoning is split (reasoner set).
	reasoner        *reasoningSplitter
	text, reasoning strings.Builder
	// message is the backend's parsed reply (request.Completion.Parsed).
	message *iface.ChatReply
}

// parser validates a request into the completion it runs as, over the
// engine's sampler and nPredict defaults: a dialect's Convert of its body,
// or request.ParseChat of the chat a dialect's converter made.
type parser func(sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (request.Completion, error)

// chatParser parses the chat a dialect's converter made.
func chatParser(chat request.Chat) parser {
	return func(sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (request.Completion, error) {
		return request.ParseChat(chat, sampler, nPredict, info)
	}
}

// readCompletion is the completion parse makes, with its reasoning budget,
// or the refusal in OpenAI's shape.
func (a *api) readCompletion(ctx context.Context, parse parser) (request.Completion, *apiError) {
	_, info := a.s.Backend()
	tun := a.s.Tunables()
	c, err := parse(tun.Sampler(), tun.NPredict(), info)
	if err == nil {
		err = c.SetReasoningBudget(a.budget, a.budgetMessage, info)
	}
	if err != nil {
		return c, a.apiErrorOf(ctx, "reading the request", err)
	}
	return c, nil
}

// runCompletion runs the validated completion c, whose request arrived
// then: on the model it names, in a slot, retried while the shared KV cache
// has no room for its prompt. Its reply goes to sink; w's header takes what
// the run learns before it.
func (a *api) runCompletion(w http.ResponseWriter, r *http.Request, c request.Completion, arrived time.Time, sink run.Sink) {
	ctx := r.Context()
	b, info, switched, e := a.modelBackend(ctx, w, c.Model)
	if e != nil {
		sink.Fail(e)
		return
	}
	p, err := a.promptTokens(ctx, b, &c)
	if err != nil {
		sink.Fail(a.apiErrorOf(ctx, "reading the prompt", err))
		return
	}
	p.arrived = arrived
	if p.toks != nil {
		if n := info.SlotCtx(); n > 0 && len(p.toks) >= n {
			sink.Fail(badRequest("the prompt has %d tokens, %s, its reply included", len(p.toks), host.SlotSize(info)))
			return
		}
		p.need = len(p.toks) + 1
	}
	// A prompt that the shared KV cache had no room for (the sequences of
	// running decodes grew after the slot was taken) waits for the next slot
	// to free, or a moment, and tries again, for up to maxRoomWait.
	deadline := time.Now().Add(maxRoomWait)
	for {
		err := a.runOnce(r, sink, b, info, c, p, switched)
		if err == nil {
			return
		}
		if !errors.Is(err, iface.ErrNoRoom) || time.Now().After(deadline) {
			step := "evaluating the prompt"
			var se *stepError
			if errors.As(err, &se) {
				step = se.step
			}
			sink.Fail(a.apiErrorOf(ctx, step, roomError(shutdownCut(r.Context(), err))))
			return
		}
		t := time.NewTimer(roomRetryWait)
		select {
		case <-a.s.SlotFreed():
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// checkModel refuses, in router mode, a model the engine does not serve,
// as llama-server's router and Ollama do (404 model_not_found); with one
// model any name is answered by it, and the reply's model names it.
func (a *api) checkModel(name string) *apiError {
	if name == "" || !a.s.RouterMode() {
		return nil
	}
	aliases, _ := a.s.ModelAliases()
	if slices.Contains(aliases, name) {
		return nil
	}
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
		Msg: fmt.Sprintf("the model %q does not exist: this engine serves %s", name, strings.Join(aliases, ", "))}
}

// roomRetryWait is the longest a completion waits between two tries of its
// prompt against a full shared KV cache when no slot frees meanwhile.
const roomRetryWait = 250 * time.Millisecond

// maxRoomWait is how long a completion tries its prompt against a shared KV
// cache that running decodes keep full before it answers 503 (Retry-After).
const maxRoomWait = 60 * time.Second

// roomError makes a prompt's ErrNoRoom the client's 503 with Retry-After:
// room comes back as other sequences end.
func roomError(err error) error {
	if errors.Is(err, iface.ErrNoRoom) {
		return &apiError{Status: http.StatusServiceUnavailable, Type: "unavailable_error", Code: "kv_cache_full", Msg: err.Error()}
	}
	return err
}

// runOnce runs a completion once it has its prompt's tokens: it takes a slot
// (waiting in the queue when none is free), prefills and decodes. It returns
// an error only when nothing of the reply was written; after that, errors
// are the reply's.
func (a *api) runOnce(r *http.Request, sink run.Sink, b iface.Backend, info iface.BackendInfo, c request.Completion, p runPrompt, switched bool) error {
	queued := time.Now()
	lease, err := a.queue.take(r.Context(), a.pickSlot(r.Context(), c.Slot, p.toks, p.need))
	if err != nil {
		return &stepError{step: "taking a slot", err: err}
	}
	a.metrics.queueSeconds.WithLabelValues(info.Model.Alias).Observe(time.Since(queued).Seconds())
	// A completion's prompt may start from the backend's prompt cache, and
	// the slot's sequence go there first where an earlier completion left
	// it; never a Hydra RPC client's.
	c.Prefill.PromptCache, c.Prefill.SaveSequence = true, lease.Found() == host.HolderHTTP
	rn := &completionRun{a: a, ctx: r.Context(), b: b, info: info, c: c, arrived: p.arrived, slot: lease.Slot(), sink: sink,
		head: run.Head{ID: newCompletionID(), Created: time.Now().Unix(), Model: info.Model.Alias,
			Fingerprint: fingerprint(info), Slot: lease.Slot(), Switched: switched},
		interToken: a.metrics.interToken.WithLabelValues(info.Model.Alias)}
	if c.Chat && a.splitReasoning && !c.Parsed { // a parsed reply comes split
		rn.reasoner = newReasoningSplitter(thinkStart, thinkEnd, p.opensThinking)
	}
	// The slot is free again before the reply's last byte, as RPC frees it
	// before its trailer: a client's next request then finds it, and the
	// prompt it holds, instead of racing the release.
	released := false
	rn.release = func() {
		if released {
			return
		}
		released = true
		if si, ok := lease.Release(); ok {
			a.rememberTokens(rn.slot, rn.taskID, si.Tokens)
		}
	}
	defer rn.release()
	if c.NoCache { // llama-server's cache_prompt false: the prompt is evaluated whole
		if err := b.ClearSlot(r.Context(), rn.slot); err != nil {
			return &stepError{step: "clearing the slot", err: err}
		}
	}
	if info.PromptDecode && p.toks != nil && rn.promptInDecode(len(p.toks)) {
		return rn.generate()
	}
	if err := rn.prefill(); err != nil {
		return err
	}
	return rn.generate()
}

// stepError is a failure of the step named, before any reply byte.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

// runPrompt is what a completion knows of its prompt before it takes a slot.
type runPrompt struct {
	arrived time.Time // when the request came, where its time to first token starts
	toks    []int32   // the prompt's tokens; nil where the backend cannot say
	need    int       // the cells the prompt and its first token take, when known
	// opensThinking: the prompt's template opened a reasoning block, so the
	// reply starts inside it (Tokenize says).
	opensThinking bool
}

// promptTokens asks the backend for the tokens of c's prompt, which pick its
// slot, and has the prefill evaluate those; none when the backend cannot say
// (the prompt then goes to the prefill as it came).
func (a *api) promptTokens(ctx context.Context, b iface.Backend, c *request.Completion) (runPrompt, error) {
	if c.Pieces != nil {
		toks, err := pieceTokens(ctx, b, c.Pieces)
		if err != nil {
			return runPrompt{}, err
		}
		c.Prefill.Tokens, c.Pieces = toks, nil
	}
	p, err := b.Tokenize(ctx, c.Prefill)
	switch {
	case errors.Is(err, iface.ErrNotImplemented):
		return runPrompt{}, nil
	case err != nil:
		return runPrompt{}, err
	}
	c.Prefill = iface.PrefillRequest{Tokens: p.Tokens, Model: c.Prefill.Model, FromChat: len(c.Prefill.Messages) > 0}
	return runPrompt{toks: p.Tokens, opensThinking: p.OpensThinking}, nil
}

// pieceTokens tokenizes a prompt of text and token ids mixed as llama-server
// does: each text piece with its special tokens parsed, the model's BOS only
// where the prompt starts with text. A backend without a tokenizer of its own
// cannot (iface.ErrNotImplemented).
func pieceTokens(ctx context.Context, b iface.Backend, pieces []request.Piece) ([]int32, error) {
	var toks []int32
	for i, p := range pieces {
		if p.Tokens != nil {
			toks = append(toks, p.Tokens...)
			continue
		}
		t, err := b.Tokenize(ctx, iface.PrefillRequest{Text: p.Text,
			Tokenize: &iface.TokenizeOptions{AddSpecial: i == 0, ParseSpecial: true}})
		if err != nil {
			return nil, fmt.Errorf("prompt: text mixed with token ids is tokenized piece by piece, by the backend's own tokenizer: %w", err)
		}
		toks = append(toks, t.Tokens...)
	}
	return toks, nil
}

// prefill evaluates the prompt into the slot. It runs before any byte of the
// reply, so a bad prompt gets a real HTTP status even when streaming.
func (rn *completionRun) prefill() error {
	rn.c.Prefill.Slot = rn.slot
	start := time.Now()
	res, err := rn.b.Prefill(rn.ctx, rn.c.Prefill)
	end := time.Now()
	if err != nil {
		tracing.Prefill{Slot: rn.slot}.Record(rn.ctx, start, end, err)
		return err
	}
	rn.prompt = end.Sub(start)
	rn.nPrompt = len(res.Slot.Tokens)
	rn.countPrompt(res.Reused)
	rn.setPredict(res.Slot.NPast)
	tracing.Prefill{Slot: rn.slot, PromptTokens: rn.nPrompt, Reused: res.Reused}.Record(rn.ctx, start, end, nil)
	return nil
}

// promptInDecode makes the decode evaluate the prompt of nPrompt tokens
// first, in one backend call, so that a batching backend samples the first
// token in the step that ends the prompt; false when nothing is to be
// decoded (the prompt is then a prefill of its own).
func (rn *completionRun) promptInDecode(nPrompt int) bool {
	rn.nPrompt = nPrompt
	rn.setPredict(nPrompt)
	rn.promptDecode = rn.nPredict > 0
	return rn.promptDecode
}

// countPrompt counts the prompt's tokens evaluated and reused.
func (rn *completionRun) countPrompt(reused int) {
	rn.reused = reused
	rn.a.s.Stats().CountTokens(host.PhasePrefill, rn.nPrompt-reused, rn.prompt)
	rn.a.s.Stats().CountPromptReuse(reused)
}

// setPredict sets how many tokens the decode may generate after a prompt
// that leaves nPast tokens in the slot.
func (rn *completionRun) setPredict(nPast int) {
	rn.nPredict = rn.c.NPredict
	if rn.nPredict < 0 { // until EOS or the context is full
		rn.nPredict = math.MaxInt32
		if rn.info.NCtx > 0 {
			rn.nPredict = max(rn.info.NCtx-nPast, 0)
		}
	}
}

// generate decodes and replies: one JSON body, or the rest of the stream.
// A prompt in the decode that found no room in the shared KV cache, before
// any reply byte, is returned (ErrNoRoom) for the completion to try again.
func (rn *completionRun) generate() error {
	rn.taskID = rn.a.beginTask(rn.slot, rn.nPrompt, rn.nPredict, slotParams{SamplerParams: rn.c.Sampler, NPredict: rn.c.NPredict})
	taskID := rn.taskID
	if rn.c.Stream { // lazily where the prompt is in the decode, which may still refuse it
		if err := rn.sink.Begin(rn.observe(), rn.promptDecode); err != nil {
			return nil // the client is gone
		}
	}
	start := time.Now()
	text, nGen, reason, err := rn.decode()
	stop := time.Now()
	elapsed := stop.Sub(start)
	if rn.promptDecode {
		elapsed -= rn.prompt
	}
	rn.recordSpans(start, stop, nGen, err)
	rn.a.endTask(rn.slot, taskID, nGen, rn.nPredict)
	rn.release()
	if err != nil {
		var rate *host.RateError
		switch {
		case errors.Is(err, iface.ErrNoRoom) && !rn.sink.Started() && nGen == 0:
			return err
		case errors.As(err, &rate) || errors.Is(err, os.ErrDeadlineExceeded):
			tracing.Logger(rn.ctx, rn.a.log).Info("HTTP client cut: it stopped reading the reply", "slot", rn.slot, "tokens", nGen, "error", err)
		case errors.Is(context.Cause(rn.ctx), ErrShuttingDown): // the client is there: the stream ends saying why
			tracing.Logger(rn.ctx, rn.a.log).Info("HTTP completion cut by the shutdown", "slot", rn.slot, "tokens", nGen)
			rn.fail(ErrShuttingDown)
		case rn.ctx.Err() == nil: // else the client went away: nobody to tell
			rn.fail(err)
		}
		return nil
	}
	rn.a.s.Stats().CountTokens(host.PhaseDecode, nGen, elapsed)
	rn.a.s.Stats().CountDrafts(rn.draftN, rn.draftAccepted)
	tm := run.NewTimings(rn.nPrompt, rn.reused, rn.prompt, nGen, elapsed)
	tm.DraftN, tm.DraftNAccepted = rn.draftN, rn.draftAccepted
	end := run.End{Head: rn.observe(), Text: text, Reasoning: rn.reasoning.String(), Finish: reason, Stop: rn.stop,
		StopWord: rn.stopWord, Generated: nGen, NPast: rn.nPast, Timings: tm, PromptText: rn.promptText}
	if m := rn.message; m != nil {
		end.ToolCalls = m.ToolCalls
	}
	_ = rn.sink.End(end)
	return nil
}

// observe is the head of the reply's next event: the prompt as known now.
func (rn *completionRun) observe() run.Head {
	h := rn.head
	h.NPrompt, h.Reused = rn.nPrompt, rn.reused
	return h
}

// promptText is the prompt's text, special tokens included, as the backend
// detokenizes its tokens; false where it has none or cannot.
func (rn *completionRun) promptText() (string, bool) {
	toks := rn.c.Prefill.Tokens
	if len(toks) == 0 {
		return "", false
	}
	p, err := rn.b.Tokenize(rn.ctx, iface.PrefillRequest{Tokens: toks, Tokenize: &iface.TokenizeOptions{}})
	if err != nil {
		return "", false
	}
	return p.Text, true
}

// recordSpans makes the decode's span, from start to end, and the prompt's
// before it where the decode evaluated the prompt first.
func (rn *completionRun) recordSpans(start, end time.Time, nGen int, err error) {
	prefill := tracing.Prefill{Slot: rn.slot, PromptTokens: rn.nPrompt, Reused: rn.reused}
	switch {
	case rn.nPredict == 0: // nothing was decoded
		return
	case rn.promptDecode && rn.prompt == 0: // it ended in the prompt
		prefill.Record(rn.ctx, start, end, err)
		return
	case rn.promptDecode:
		prefill.Record(rn.ctx, start, start.Add(rn.prompt), nil)
		start = start.Add(rn.prompt)
	}
	tracing.Decode{Slot: rn.slot, Generated: nGen, PromptTokens: rn.nPrompt, Reused: rn.reused, StopReason: rn.stop,
		FirstToken: rn.firstToken}.Record(rn.ctx, start, end, err)
}

// newCompletionID is a completion's random id, which each dialect prefixes
// its own way.
func newCompletionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// decode generates up to nPredict tokens into the slot, streaming them when
// asked, and returns the text shown, the tokens generated and OpenAI's
// finish_reason. nPredict 0 (the coordinator's prefill-only call) decodes
// nothing.
func (rn *completionRun) decode() (string, int, string, error) {
	rn.nPast = rn.nPrompt
	if rn.nPredict == 0 {
		rn.stop = "length"
		return "", 0, "length", nil
	}
	ts := &stoptext.Stream{Stops: rn.c.Stops}
	if rn.c.Parsed { // the backend stops the parse at them
		ts.Stops = nil
	}
	n := 0
	nKeep := rn.c.NKeep
	if nKeep < 0 {
		nKeep = rn.nPrompt
	}
	req := iface.DecodeRequest{Slot: rn.slot, NPredict: rn.nPredict, Sampler: rn.c.Sampler,
		Logprobs: rn.c.Logprobs, NProbs: rn.c.NProbs, NKeep: nKeep, Output: rn.c.Output, Speculative: rn.c.Spec,
		LastUnevaluated: true}
	if rn.promptDecode {
		rn.c.Prefill.Slot = rn.slot
		req.Prompt = &rn.c.Prefill
	}
	start := time.Now()
	var last time.Time
	emit := func(t iface.Token) error {
		now := time.Now()
		if n == 0 {
			if rn.promptDecode {
				rn.prompt = now.Sub(start) // until res.Prompt says
			}
			rn.firstToken = now
			rn.a.metrics.ttft.WithLabelValues(rn.info.Model.Alias).Observe(now.Sub(rn.arrived).Seconds())
		} else {
			rn.interToken.Observe(now.Sub(last).Seconds())
		}
		last = now
		n++
		rn.sink.Token(t)
		if rn.c.Parsed {
			return rn.emitDeltas(t.Deltas)
		}
		out, stopped := ts.Push(t.Text)
		if err := rn.emitText(out); err != nil {
			return err
		}
		if stopped {
			return errStopString
		}
		return nil
	}
	res, err := rn.b.Decode(rn.ctx, req, emit)
	rn.countDrafts(res)
	switch {
	case res.Prompt != nil:
		rn.prompt = res.Prompt.Prefill
		rn.countPrompt(res.Prompt.Reused)
	case rn.promptDecode && n > 0: // interrupted after its prompt: how much was reused is not known
		rn.countPrompt(0)
	}
	// The shared KV cache filled before the slot did: idle HTTP sequences
	// make room for the rest of the reply, and the decode goes on.
	for err == nil && res.StopReason == run.StopNTokensLimit && n < rn.nPredict && res.NPast+1 < rn.info.SlotCtx() && !rn.info.SplitKV() {
		want := res.NPast + min(rn.nPredict-n, rn.info.SlotCtx()-res.NPast)
		if rn.a.s.MakeRoom(rn.ctx, rn.slot, want, true) == 0 {
			break
		}
		req.NPredict, req.Prompt = rn.nPredict-n, nil
		res, err = rn.b.Decode(rn.ctx, req, emit)
		rn.countDrafts(res)
	}
	rn.stop = res.StopReason
	if res.NPast > 0 {
		rn.nPast = res.NPast
	}
	if rn.c.Parsed && err == nil {
		if rn.stop == iface.StopString && len(rn.c.Stops) == 1 {
			rn.stopWord = rn.c.Stops[0]
		}
		return rn.finishParsed(n, res)
	}
	switch {
	case errors.Is(err, errStopString):
		rn.stop, rn.stopWord = iface.StopString, ts.Matched
		return rn.finishText(n, "stop")
	case err != nil:
		return rn.text.String(), n, "", err
	}
	if err := rn.emitText(ts.Flush()); err != nil {
		return rn.text.String(), n, "", err
	}
	return rn.finishText(n, finishReason(res.StopReason))
}

// countDrafts adds a decode's draft tokens to the reply's timings.
func (rn *completionRun) countDrafts(res iface.DecodeResult) {
	rn.draftN += res.DraftTokens
	rn.draftAccepted += res.DraftAccepted
}

// emitDeltas takes what a token added to the parsed reply: kept for the
// reply and streamed, one event a delta as llama-server sends them.
func (rn *completionRun) emitDeltas(ds []iface.ChatDelta) error {
	for _, d := range ds {
		var tool *run.ToolPiece
		if d.ToolCall >= 0 {
			tool = &run.ToolPiece{Index: d.ToolCall, ID: d.ToolID, Name: d.ToolName, Args: d.ToolArgs}
		}
		if err := rn.emit(run.Delta{Reasoning: d.Reasoning, Content: d.Content, Tool: tool}); err != nil {
			return err
		}
	}
	return nil
}

// finishParsed ends a parsed reply: the final parse's deltas, and
// finish_reason "tool_calls" where it calls tools, as llama-server.
func (rn *completionRun) finishParsed(n int, res iface.DecodeResult) (string, int, string, error) {
	if err := rn.emitDeltas(res.Deltas); err != nil {
		return rn.text.String(), n, "", err
	}
	reason := finishReason(res.StopReason)
	if m := res.Message; m != nil {
		rn.message = m
		// The reply is the whole parse: what the deltas streamed, and any
		// text the parser never released (a reply that failed to parse).
		rn.text.Reset()
		rn.text.WriteString(m.Content)
		rn.reasoning.Reset()
		rn.reasoning.WriteString(m.Reasoning)
		if len(m.ToolCalls) > 0 && reason == "stop" {
			reason = "tool_calls"
		}
	}
	return rn.text.String(), n, reason, nil
}

// emitText takes generated text: split into reasoning and content where the
// completion has a reasoning block, kept for the reply and streamed.
func (rn *completionRun) emitText(out string) error {
	content := out
	var reasoning string
	if rn.reasoner != nil {
		reasoning, content = rn.reasoner.Push(out)
	}
	return rn.emitParts(reasoning, content)
}

// finishText flushes what the reasoning split held back and returns the
// decode's results.
func (rn *completionRun) finishText(n int, reason string) (string, int, string, error) {
	if rn.reasoner != nil {
		if err := rn.emitParts(rn.reasoner.Flush()); err != nil {
			return rn.text.String(), n, "", err
		}
	}
	return rn.text.String(), n, reason, nil
}

func (rn *completionRun) emitParts(reasoning, content string) error {
	return rn.emit(run.Delta{Reasoning: reasoning, Content: content})
}

// emit keeps a delta's text for the reply and streams the delta.
func (rn *completionRun) emit(d run.Delta) error {
	rn.reasoning.WriteString(d.Reasoning)
	rn.text.WriteString(d.Content)
	if !rn.c.Stream {
		return nil
	}
	return rn.sink.Delta(d)
}

// fail reports a failed decode: as the reply when nothing was sent yet, else
// as a final {"error":…} event, which OpenAI clients raise as an APIError.
// Either way the client learns what failed, the log why (clientMessage).
func (rn *completionRun) fail(err error) {
	step := "generating the completion"
	if rn.promptDecode && rn.prompt == 0 { // the prompt's part failed
		step = "evaluating the prompt"
	}
	rn.sink.Fail(rn.a.apiErrorOf(rn.ctx, step, err))
}

// finishReason maps a backend stop reason to OpenAI's.
func finishReason(stop string) string {
	if stop == "eos" || stop == iface.StopString {
		return "stop"
	}
	return "length" // "length", "n_tokens_limit"
}

// fingerprint names the backend and model that answered, as OpenAI's
// system_fingerprint names a configuration.
func fingerprint(info iface.BackendInfo) string {
	h := info.Model.Hash
	if len(h) > 12 {
		h = h[:12]
	}
	return fmt.Sprintf("%s-%s-%s", info.Name, info.Version, h)
}
