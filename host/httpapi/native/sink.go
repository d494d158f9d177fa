package native

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's native completion reply (/completion, /infill): a chunk a
// token, each with its text (maybe none while a stop string may be
// starting) and the token, then a last event with the whole reply's fields
// and no [DONE]; or that last event alone as the whole reply. The
// completions of one request (prompts × n_cmpl) answer in one array, or in
// one stream, each with its index.

// Reply is the one reply of a request's completions, which run one after
// another, each into a Sink of its own.
type Reply struct {
	w       http.ResponseWriter
	many    bool              // the completions' replies go in one array
	replies []json.RawMessage // the whole replies so far (many)
	started bool              // the stream's header went out
}

// NewReply is the reply to w of a request of n completions.
func NewReply(w http.ResponseWriter, n int) *Reply {
	return &Reply{w: w, many: n > 1}
}

// Finish writes the array of the whole replies once every completion ended.
func (r *Reply) Finish() {
	if r.many && !r.started {
		run.WriteJSON(r.w, http.StatusOK, r.replies)
	}
}

// Sink writes one completion's events into its request's reply.
type Sink struct {
	reply *Reply
	c     Completion

	head    run.Head
	pending bool          // the stream starts with its first event (lazy)
	started bool          // this completion's stream began
	tokens  []iface.Token // the tokens not yet sent
	count   int           // tokens generated
	wrote   bool          // something of the completion went out
	failed  bool          // an error went out
}

// Sink is the sink of completion c, whose events go into r.
func (r *Reply) Sink(c Completion) *Sink { return &Sink{reply: r, c: c} }

// Done reports whether the completion's reply went out whole: the next
// completion of the request may run.
func (s *Sink) Done() bool { return s.wrote && !s.failed }

func (s *Sink) Begin(h run.Head, lazy bool) error {
	s.head = h
	if lazy {
		s.pending = true
		return nil
	}
	return s.start()
}

// start begins the completion's part of the stream: the stream's header
// with the first completion's.
func (s *Sink) start() error {
	s.pending, s.started, s.wrote = false, true, true
	if !s.reply.started {
		s.reply.started = true
		run.StartSSE(s.reply.w)
	}
	return http.NewResponseController(s.reply.w).Flush()
}

func (s *Sink) Token(t iface.Token) {
	s.tokens = append(s.tokens, t)
	s.count++
}

func (s *Sink) Started() bool { return s.started }

// Delta streams a chunk for each token, even one whose text is held back.
func (s *Sink) Delta(d run.Delta) error {
	if d.Content == "" && len(s.tokens) == 0 {
		return nil
	}
	return s.event(s.chunk(d.Content))
}

func (s *Sink) End(e run.End) error {
	if s.pending || s.started {
		return s.event(s.final("", e))
	}
	s.wrote = true
	if !s.reply.many {
		run.WriteJSON(s.reply.w, http.StatusOK, s.final(e.Text, e))
		return nil
	}
	b, err := json.Marshal(s.final(e.Text, e))
	if err != nil {
		return err
	}
	s.reply.replies = append(s.reply.replies, b)
	return nil
}

// Fail is the reply where nothing of the request's went out, else the
// stream's last event.
func (s *Sink) Fail(e *run.Error) {
	s.failed, s.wrote = true, true
	if !s.reply.started {
		run.WriteError(s.reply.w, e)
		return
	}
	if !s.started {
		run.RetryAfter(s.reply.w, e)
	}
	_ = run.Event(s.reply.w, "", map[string]*run.Error{"error": e})
}

// event writes one event, starting a lazy stream first.
func (s *Sink) event(v any) error {
	if s.pending {
		if err := s.start(); err != nil {
			return err
		}
	}
	return run.Event(s.reply.w, "", v)
}

// takeTokens returns the tokens not yet sent and forgets them.
func (s *Sink) takeTokens() []iface.Token {
	toks := s.tokens
	s.tokens = nil
	return toks
}

// chunk is a streamed chunk: the text that the token (or tokens) since the
// last chunk released, and those tokens.
func (s *Sink) chunk(content string) map[string]any {
	toks := s.takeTokens()
	out := map[string]any{"index": s.c.Index, "content": content, "tokens": tokenIDList(toks), "stop": false,
		"id_slot": s.head.Slot, "tokens_predicted": s.count, "tokens_evaluated": s.head.NPrompt}
	if s.c.Request.Logprobs && len(toks) > 0 {
		out["completion_probabilities"] = probs(toks)
	}
	return out
}

// final is a completion's whole reply, or its stream's last event (content
// "": the chunks carried it), with llama-server's fields.
func (s *Sink) final(content string, e run.End) map[string]any {
	toks := s.takeTokens()
	ids := []int32{}
	if s.c.ReturnTokens && !s.c.Request.Stream {
		ids = tokenIDList(toks)
	}
	kind, truncated := stopType(e.Stop)
	stopWord := ""
	if kind == "word" {
		stopWord = e.StopWord
	}
	prompt, ok := e.PromptText()
	if !ok {
		prompt = s.c.PromptText
	}
	out := map[string]any{"index": s.c.Index, "content": content, "tokens": ids, "id_slot": e.Slot, "stop": true,
		"model": e.Model, "tokens_predicted": e.Generated, "tokens_evaluated": e.NPrompt,
		"generation_settings": settings(s.c.Request), "prompt": prompt,
		"has_new_line": strings.Contains(e.Text, "\n"), "truncated": truncated, "stop_type": kind,
		"stopping_word": stopWord, "tokens_cached": e.NPast, "timings": e.Timings}
	if s.c.Request.Logprobs && !s.c.Request.Stream && len(toks) > 0 {
		out["completion_probabilities"] = probs(shownTokens(toks, len(content)))
	}
	if f := s.c.ResponseFields; len(f) > 0 {
		return pickFields(out, f)
	}
	return out
}

func tokenIDList(toks []iface.Token) []int32 {
	ids := make([]int32, len(toks))
	for i, t := range toks {
		ids[i] = t.ID
	}
	return ids
}

// shownTokens are the tokens whose text lies within the reply's n bytes: a
// stop string's tokens, cut from the text, have no probabilities listed
// either, as in llama-server.
func shownTokens(toks []iface.Token, n int) []iface.Token {
	at := 0
	for i, t := range toks {
		if at += len(t.Text); at > n {
			return toks[:i]
		}
	}
	return toks
}

// stopType is llama-server's stop_type for a backend's stop reason,
// and whether the context ran out (truncated).
func stopType(stop string) (string, bool) {
	switch stop {
	case "eos":
		return "eos", false
	case iface.StopString:
		return "word", false
	case run.StopNTokensLimit:
		return "limit", true
	case "length":
		return "limit", false
	}
	return "none", false
}

// settings is generation_settings: the parameters the completion ran
// with, and offFields' features at the values that leave them off.
func settings(c request.Completion) map[string]any {
	sp := c.Sampler
	bias := []map[string]any{}
	for _, id := range slices.Sorted(maps.Keys(sp.LogitBias)) {
		bias = append(bias, map[string]any{"token": id, "bias": sp.LogitBias[id]})
	}
	grammar := ""
	if c.Output != nil {
		grammar = c.Output.Grammar
	}
	out := map[string]any{"seed": sp.Seed, "temperature": sp.Temperature, "top_k": sp.TopK, "top_p": sp.TopP, "min_p": sp.MinP,
		"repeat_last_n": sp.RepeatLastN, "repeat_penalty": sp.RepeatPenalty, "presence_penalty": sp.PresencePenalty,
		"frequency_penalty": sp.FrequencyPenalty, "stop": nonNilStrings(c.Stops), "max_tokens": c.NPredict,
		"n_predict": c.NPredict, "n_keep": c.NKeep, "ignore_eos": sp.IgnoreEOS, "stream": c.Stream, "logit_bias": bias,
		"n_probs": c.NProbs, "grammar": grammar}
	if c.Output != nil && c.Output.JSONSchema != "" {
		out["json_schema"] = json.RawMessage(c.Output.JSONSchema)
	}
	for _, f := range offFields {
		out[f.name] = f.off
	}
	return out
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// pickFields is llama-server's response_fields: each path's value (a path's
// keys joined by "/" reach into objects), under the path as its key; a
// path that leads nowhere is left out.
func pickFields(reply map[string]any, paths []string) map[string]any {
	b, _ := json.Marshal(reply)
	var generic map[string]any
	_ = json.Unmarshal(b, &generic)
	out := map[string]any{}
	for _, path := range paths {
		var v any = generic
		for key := range strings.SplitSeq(path, "/") {
			obj, ok := v.(map[string]any)
			if !ok {
				v = nil
				break
			}
			if v, ok = obj[key]; !ok {
				break
			}
		}
		if v != nil {
			out[path] = v
		}
	}
	return out
}
