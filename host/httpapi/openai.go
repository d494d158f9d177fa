package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// OpenAI-compatible completions (protocol §8): the request bodies, their
// validation, and the error replies. completion.go runs them.

// completionRequest is the union of the chat and text completion bodies.
// Fields this engine does not know are ignored, as OpenAI clients send many.
type completionRequest struct {
	// The chat's prompt and the reply's constraints, as RPC PREFILL reads
	// them (host.ChatBody; a text completion takes its model and output
	// fields).
	host.ChatBody
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	NPredict            *int64 `json:"n_predict"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	MaxTokens           *int64 `json:"max_tokens"`
	host.SamplerFields
	Seed      *int64          `json:"seed"`
	LogitBias json.RawMessage `json:"logit_bias"`
	// Chat: logprobs true and top_logprobs N; text: logprobs N; both:
	// llama-server's n_probs.
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs *int64          `json:"top_logprobs"`
	NProbs      *int64          `json:"n_probs"`
	IDSlot      *int64          `json:"id_slot"`
	Stop        json.RawMessage `json:"stop"`
	N           *int            `json:"n"`
	NKeep       *int64          `json:"n_keep"`
	ReasoningBudgetFields
	speculativeFields
}

// completion is a validated request.
type completion struct {
	chat         bool
	model        string
	prefill      iface.PrefillRequest // Slot filled in once one is taken
	stream       bool
	includeUsage bool
	nPredict     int // -1: until EOS or the context is full
	sampler      iface.SamplerParams
	logprobs     bool // report each token's log-probability
	nProbs       int  // and that many alternatives
	slot         int  // -1: any idle slot
	// pieces is a prompt of text and token ids mixed, which the backend
	// tokenizes piece by piece before the run (promptTokens).
	pieces []promptPiece
	stops  []string
	// opensThinking: the prompt's template opened a reasoning block, so the
	// reply starts inside it (Tokenize says).
	opensThinking bool
	nKeep         int                      // tokens a context shift keeps (-1: the whole prompt)
	spec          *iface.SpeculativeParams // speculative.*; nil: none given
	// noCache: nothing of the slot's sequence is reused, the prompt is
	// evaluated whole (llama-server's cache_prompt false).
	noCache bool
	// native: the reply is llama-server's /completion's (native.go), not
	// OpenAI's.
	native *nativeOptions
	// arrived is when the request came, where its time to first token starts.
	arrived time.Time
	// output is what the reply must be (response_format, json_schema,
	// grammar) and, for a chat whose reply is parsed (parsed: tools may be
	// called, or the reply is constrained), the chat it answers and its
	// stops: the backend then sends the reply as parsed deltas.
	output *iface.Output
	parsed bool
	budget reasoningBudgetRequest // setReasoningBudget puts it into output
}

// apiError is a request's failure, in OpenAI's shape unless a dialect
// words it its own way.
type apiError = run.Error

func badRequest(format string, args ...any) *apiError { return run.BadRequest(format, args...) }

// fieldError is a body's fault as a 400 whose param names the field.
func fieldError(err error) error {
	var fe *host.FieldError
	if errors.As(err, &fe) {
		e := badRequest("%s", fe.Msg)
		e.Param = fe.Param
		return e
	}
	return err
}

// apiErrorOf maps an error of the step named (a slot or backend error, or
// an apiError already) to its OpenAI form, in client words (clientMessage).
func (a *api) apiErrorOf(ctx context.Context, step string, err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	e := &apiError{Status: statusOf(err), Msg: a.clientMessage(ctx, step, err)}
	switch e.Status {
	case http.StatusBadRequest:
		e.Type, e.Param = "invalid_request_error", run.ParamOf(e.Msg)
	case http.StatusServiceUnavailable:
		e.Type, e.Code = "unavailable_error", "slot_busy"
		if errors.Is(err, ErrShuttingDown) {
			e.Code = "shutting_down"
		}
	case http.StatusNotImplemented:
		e.Type = "not_supported_error"
	default:
		e.Type = "server_error"
	}
	return e
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit uint64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(min(limit, math.MaxInt64))))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Msg: fmt.Sprintf("request body exceeds the %d-byte limit", mbe.Limit)}
		}
		return nil, badRequest("reading the request body: %v", err)
	}
	return b, nil
}

// readAdmittedBody reads a request body of at most s's MaxJSONBytes (and
// payload budget) once the budget admitted it (host.AdmitPayload): its
// Content-Length, or the whole limit when the length is not announced. The
// budget is given back when the request ends. A body larger than the limit
// is refused before it is read (413); a budget that stays short answers 503.
func readAdmittedBody(w http.ResponseWriter, r *http.Request, s *host.Server) ([]byte, error) {
	limit := min(s.Config().MaxJSONBytes, s.PayloadBudgetSize())
	n := limit
	if r.ContentLength >= 0 {
		if uint64(r.ContentLength) > limit {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Msg: fmt.Sprintf("request body of %d bytes exceeds the %d-byte limit", r.ContentLength, limit)}
		}
		n = uint64(r.ContentLength)
	}
	release, err := s.AdmitPayload(r.Context(), n)
	switch {
	case errors.Is(err, host.ErrBudgetBusy):
		return nil, &apiError{Status: http.StatusServiceUnavailable, Type: "unavailable_error", Code: "payload_budget", Msg: err.Error()}
	case err != nil:
		return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
			Msg: fmt.Sprintf("request body of %d bytes: %v", n, err)}
	}
	context.AfterFunc(r.Context(), release)
	if r.ContentLength < 0 {
		return readBody(w, r, n)
	}
	// Announced: read into one buffer of that size, so the body costs what
	// the budget admitted and not io.ReadAll's doublings.
	b := make([]byte, n)
	if _, err := io.ReadFull(r.Body, b); err != nil {
		return nil, badRequest("reading the request body: %v", err)
	}
	return b, nil
}

// parseCompletion validates a body; sampler and nPredict are the engine's
// defaults.
func parseCompletion(body []byte, chat bool, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (completion, error) {
	var req completionRequest
	if chat {
		if err := host.CheckMessageCountJSON(body, info); err != nil {
			return completion{}, badRequest("%v", err)
		}
	}
	if err := run.DecodeJSON(body, &req); err != nil {
		return completion{}, err
	}
	c := completion{chat: chat, model: req.Model, stream: req.Stream, sampler: sampler, nPredict: nPredict, slot: -1}
	c.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if req.N != nil && *req.N != 1 {
		return c, badRequest("n must be 1: this engine returns one choice")
	}
	var err error
	if c.prefill, c.pieces, err = parseInput(&req, chat, info); err != nil {
		return c, err
	}
	if err = host.CheckPromptSize(sizeOf(c.prefill, c.pieces), info); err != nil {
		return c, badRequest("%v", err)
	}
	if err = c.setLimit(&req); err != nil {
		return c, err
	}
	if err = c.setSampler(&req, info); err != nil {
		return c, err
	}
	if c.slot, err = parseSlot(req.IDSlot); err != nil {
		return c, err
	}
	if v := req.NKeep; v != nil {
		if *v < -1 || *v > math.MaxInt32 {
			return c, badRequest("n_keep must be -1 (the whole prompt) or in [0, %d], got %d", math.MaxInt32, *v)
		}
		c.nKeep = int(*v)
	}
	if c.spec, err = req.speculativeFields.parse(); err != nil {
		return c, err
	}
	if c.stops, err = readStops(req.Stop, openAIStops); err != nil {
		return c, err
	}
	if c.budget, err = req.ReasoningBudgetFields.parse(); err != nil {
		return c, err
	}
	return c, c.setOutput(&req, info)
}

// setOutput reads what the reply must be. A chat reply is parsed by the
// backend (tool calls, reasoning) where tools may be called or the reply is
// constrained; the stop strings then go with it, as the parse ends there.
func (c *completion) setOutput(req *completionRequest, info iface.BackendInfo) error {
	o, err := req.OutputFields.Output()
	if err != nil {
		return fieldError(err)
	}
	if c.chat && (o != nil || host.CallsTools(c.prefill)) {
		if o == nil {
			o = &iface.Output{}
		}
		chat := c.prefill
		o.Chat, o.Stops, c.parsed = &chat, c.stops, true
	}
	if o != nil && !slices.Contains(info.Capabilities, iface.CapOutput) {
		return &apiError{Status: http.StatusNotImplemented, Type: "not_supported_error",
			Msg: fmt.Sprintf("the %s backend cannot constrain or parse a reply (tools with tool_choice other than \"none\", response_format, json_schema, grammar)", info.Name)}
	}
	c.output = o
	return nil
}

// parseInput reads what to prefill: chat messages, or a text completion's
// prompt as text, token ids, or pieces of both to tokenize (promptTokens).
func parseInput(req *completionRequest, chat bool, info iface.BackendInfo) (iface.PrefillRequest, []promptPiece, error) {
	if chat { // RPC PREFILL's prompt for the same body
		p, err := req.ChatBody.Prefill(0, info)
		return p, nil, fieldError(err)
	}
	p, err := parsePrompt(req.Prompt)
	if err != nil {
		return iface.PrefillRequest{}, nil, err
	}
	switch {
	case p.pieces != nil:
		return iface.PrefillRequest{Model: req.Model}, p.pieces, nil
	case p.tokens == nil && p.text == "":
		return iface.PrefillRequest{}, nil, badRequest("prompt is empty")
	case p.tokens == nil:
		return iface.PrefillRequest{Text: p.text, Model: req.Model}, nil, nil
	case len(p.tokens) == 0:
		return iface.PrefillRequest{}, nil, badRequest("prompt is empty")
	}
	return iface.PrefillRequest{Tokens: p.tokens, Model: req.Model}, nil, nil
}

// sizeOf is the prompt CheckPromptSize judges: the request's, or a mixed
// prompt's token ids and text together.
func sizeOf(req iface.PrefillRequest, pieces []promptPiece) iface.PrefillRequest {
	var text strings.Builder
	for _, p := range pieces {
		req.Tokens = append(req.Tokens, p.tokens...)
		text.WriteString(p.text)
	}
	if pieces != nil {
		req.Text = text.String()
	}
	return req
}

// setLimit reads the token limit: llama-server's n_predict first, then the
// OpenAI names.
func (c *completion) setLimit(req *completionRequest) error {
	for i, n := range []*int64{req.NPredict, req.MaxCompletionTokens, req.MaxTokens} {
		if n == nil {
			continue
		}
		if *n < -1 || *n > math.MaxInt32 { // -1 is llama-server's n_predict -1: until EOS or the context is full
			name := []string{"n_predict", "max_completion_tokens", "max_tokens"}[i]
			return badRequest("%s must be -1 (no limit) or in [0, %d], got %d", name, math.MaxInt32, *n)
		}
		c.nPredict = int(*n)
		return nil
	}
	return nil
}

// setSampler applies the sampler fields given over the engine's defaults.
func (c *completion) setSampler(req *completionRequest, info iface.BackendInfo) error {
	if err := req.SamplerFields.Validate(info.SlotCtx()); err != nil {
		return badRequest("%v", err)
	}
	req.SamplerFields.Apply(&c.sampler)
	if v := req.Seed; v != nil {
		if *v < 0 { // llama-server: -1 asks for a random seed
			c.sampler.Seed = mrand.Uint64()
		} else {
			c.sampler.Seed = uint64(*v)
		}
	}
	bias, err := parseLogitBias(req.LogitBias, info.NVocab)
	if err != nil {
		return err
	}
	if bias != nil {
		c.sampler.LogitBias = bias
	}
	return c.setLogprobs(req)
}

// maxTopLogprobs is OpenAI's limit on alternatives per position.
const maxTopLogprobs = 20

// setLogprobs reads the ways of asking for log-probabilities: chat's
// logprobs true with top_logprobs N, the text API's logprobs N, and
// llama-server's n_probs N.
func (c *completion) setLogprobs(req *completionRequest) error {
	n := int64(-1)
	switch raw := strings.TrimSpace(string(req.Logprobs)); {
	case raw == "" || raw == "null" || raw == "false":
	case raw == "true":
		n = 0
	default:
		if err := json.Unmarshal(req.Logprobs, &n); err != nil || n < 0 {
			return badRequest("logprobs must be true, false or a count of alternatives >= 0")
		}
	}
	for name, v := range map[string]*int64{"top_logprobs": req.TopLogprobs, "n_probs": req.NProbs} {
		if v == nil {
			continue
		}
		if *v < 0 || *v > maxTopLogprobs {
			return badRequest("%s must be in [0, %d], got %d", name, maxTopLogprobs, *v)
		}
		n = max(n, *v)
	}
	if n > maxTopLogprobs {
		return badRequest("logprobs must be in [0, %d], got %d", maxTopLogprobs, n)
	}
	c.logprobs, c.nProbs = n >= 0, int(max(n, 0))
	return nil
}

// parseLogitBias reads logit_bias: OpenAI's object of token id → bias, or
// llama-server's [[id, bias], …] (a bias of false bans the token). A bias is
// clamped to OpenAI's [-100, 100], which is already a ban or a certainty.
func parseLogitBias(raw json.RawMessage, nVocab int) (map[int32]float32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	out := map[int32]float32{}
	add := func(id int64, bias float64) error {
		if id < 0 || (nVocab > 0 && id >= int64(nVocab)) || id > math.MaxInt32 {
			return badRequest("logit_bias: token %d is outside the vocabulary", id)
		}
		if math.IsNaN(bias) {
			return badRequest("logit_bias: bias of token %d is not a number", id)
		}
		out[int32(id)] = float32(min(max(bias, -100), 100))
		return nil
	}
	var obj map[string]float64
	if json.Unmarshal(raw, &obj) == nil {
		for k, v := range obj {
			id, err := strconv.ParseInt(k, 10, 64)
			if err != nil {
				return nil, badRequest("logit_bias: key %q is not a token id", k)
			}
			if err := add(id, v); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	var pairs [][2]json.RawMessage
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, badRequest("logit_bias must be an object of token id to bias, or [[id, bias], …]")
	}
	for _, p := range pairs {
		var id int64
		if err := json.Unmarshal(p[0], &id); err != nil {
			return nil, badRequest("logit_bias: %s is not a token id", p[0])
		}
		bias := -math.MaxFloat64 // false: never this token
		if string(p[1]) != "false" {
			if err := json.Unmarshal(p[1], &bias); err != nil {
				return nil, badRequest("logit_bias: the bias of token %d must be a number or false", id)
			}
		}
		if err := add(id, bias); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parseSlot reads id_slot: absent or -1 is any idle slot (-1).
func parseSlot(v *int64) (int, error) {
	if v == nil || *v == -1 {
		return -1, nil
	}
	if *v < 0 || *v > math.MaxInt32 {
		return -1, badRequest("id_slot %d is not a slot id", *v)
	}
	return int(*v), nil
}

// textPrompt is a text completion's prompt: text, token ids, or pieces of
// text and token ids mixed.
type textPrompt struct {
	text   string
	tokens []int32
	pieces []promptPiece
}

// promptPiece is a piece of a mixed prompt ([12, "text", 34], as
// llama-server takes one): text, or a run of token ids (tokens set).
type promptPiece struct {
	text   string
	tokens []int32
}

// parsePrompt reads a text completion's prompt: a string, token ids, or
// strings and token ids mixed, alone or as the only element of a batch (one
// choice per request here).
func parsePrompt(raw json.RawMessage) (textPrompt, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return textPrompt{}, badRequest("prompt is required")
	}
	var p textPrompt
	if json.Unmarshal(raw, &p.text) == nil {
		return p, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		var err error
		p.tokens, err = tokenIDs(ids, 0)
		return p, err
	}
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) != nil {
		return p, badRequest("prompt must be a string, an array of token ids, or strings and token ids mixed")
	}
	if pieces, ok, err := mixedPieces(batch); ok || err != nil {
		p.pieces = pieces
		return p, err
	}
	if len(batch) != 1 {
		return p, badRequest("prompt batches of %d are not supported: send one prompt per request", len(batch))
	}
	return parsePrompt(batch[0])
}

// mixedPieces reads an array of strings and token ids with both in it
// (ok); any other array is not a mixed prompt.
func mixedPieces(elems []json.RawMessage) (pieces []promptPiece, ok bool, err error) {
	var hasText, hasID bool
	for _, e := range elems {
		var s string
		var id int64
		switch {
		case string(bytes.TrimSpace(e)) == "null": // decodes as "" and 0 alike: neither
			return nil, false, nil
		case json.Unmarshal(e, &s) == nil:
			hasText = true
		case json.Unmarshal(e, &id) == nil:
			hasID = true
		default:
			return nil, false, nil
		}
	}
	if !hasText || !hasID {
		return nil, false, nil
	}
	for i, e := range elems {
		var s string
		if json.Unmarshal(e, &s) == nil {
			pieces = append(pieces, promptPiece{text: s})
			continue
		}
		var id int64
		_ = json.Unmarshal(e, &id)
		toks, err := tokenIDs([]int64{id}, i)
		if err != nil {
			return nil, true, err
		}
		if n := len(pieces); n > 0 && pieces[n-1].tokens != nil {
			pieces[n-1].tokens = append(pieces[n-1].tokens, toks...)
		} else {
			pieces = append(pieces, promptPiece{tokens: toks})
		}
	}
	return pieces, true, nil
}

// tokenIDs checks prompt token ids, the first at position first.
func tokenIDs(ids []int64, first int) ([]int32, error) {
	toks := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, badRequest("prompt token %d (%d) is not a token id", first+i, id)
		}
		toks[i] = int32(id)
	}
	return toks, nil
}

// openAIStops is OpenAI's limit on stop strings; llama-server's native
// /completion takes any number.
const openAIStops = 4

// readStops reads "stop": a string or an array of strings, at most max of
// them (0: any number), empty ones dropped.
func readStops(raw json.RawMessage, max int) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop must be a string or an array of strings")
	}
	if max > 0 && len(many) > max {
		return nil, badRequest("stop takes at most %d strings, got %d", max, len(many))
	}
	return slices.DeleteFunc(many, func(s string) bool { return s == "" }), nil
}
