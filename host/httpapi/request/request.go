// Package request is the engine's own completion request: the chat or text
// completion body (OpenAI's, with llama-server's fields) that every HTTP
// dialect's request becomes, and Parse, which validates it into a
// Completion the run takes. It imports no dialect: the dialects import it.
package request

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strings"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Body is the union of the chat and text completion bodies.
// Fields this engine does not know are ignored, as OpenAI clients send many.
type Body struct {
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

// Completion is a validated request.
type Completion struct {
	Chat         bool
	Model        string
	Prefill      iface.PrefillRequest // Slot filled in once one is taken
	Stream       bool
	IncludeUsage bool
	NPredict     int // -1: until EOS or the context is full
	Sampler      iface.SamplerParams
	Logprobs     bool // report each token's log-probability
	NProbs       int  // and that many alternatives
	Slot         int  // -1: any idle slot
	// Pieces is a prompt of text and token ids mixed, which the backend
	// tokenizes piece by piece before the run.
	Pieces []Piece
	Stops  []string
	NKeep  int                      // tokens a context shift keeps (-1: the whole prompt)
	Spec   *iface.SpeculativeParams // speculative.*; nil: none given
	// NoCache: nothing of the slot's sequence is reused, the prompt is
	// evaluated whole (llama-server's cache_prompt false).
	NoCache bool
	// Output is what the reply must be (response_format, json_schema,
	// grammar) and, for a chat whose reply is parsed (Parsed: tools may be
	// called, or the reply is constrained), the chat it answers and its
	// stops: the backend then sends the reply as parsed deltas.
	Output *iface.Output
	Parsed bool
	budget reasoningBudgetRequest // SetReasoningBudget puts it into Output
}

// badRequest is a 400 whose param is the field its message starts with.
func badRequest(format string, args ...any) *run.Error { return run.BadRequest(format, args...) }

// FieldError makes a host.FieldError (a body's fault) a 400 whose param
// names the field; any other error is returned as it is.
func FieldError(err error) error {
	var fe *host.FieldError
	if errors.As(err, &fe) {
		e := badRequest("%s", fe.Msg)
		e.Param = fe.Param
		return e
	}
	return err
}

// Decode reads a chat (chat set) or text completion body without
// validating its values.
func Decode(body []byte, chat bool, info iface.BackendInfo) (Body, error) {
	var req Body
	if chat {
		if err := host.CheckMessageCountJSON(body, info); err != nil {
			return req, badRequest("%v", err)
		}
	}
	return req, run.DecodeJSON(body, &req)
}

// Parse validates a body; sampler and nPredict are the engine's defaults.
func Parse(body []byte, chat bool, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (Completion, error) {
	req, err := Decode(body, chat, info)
	if err != nil {
		return Completion{}, err
	}
	return parse(req, chat, sampler, nPredict, info)
}

// ParseDecoded validates a body Decode read: a caller that checked a long
// prompt already decodes the rest once and sets Prompt on each copy.
func ParseDecoded(req Body, chat bool, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (Completion, error) {
	return parse(req, chat, sampler, nPredict, info)
}

// parse validates a decoded body.
func parse(req Body, chat bool, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (Completion, error) {
	var err error
	c := Completion{Chat: chat, Model: req.Model, Stream: req.Stream, Sampler: sampler, NPredict: nPredict, Slot: -1}
	c.IncludeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if req.N != nil && *req.N != 1 {
		return c, badRequest("n must be 1: this engine returns one choice")
	}
	if c.Prefill, c.Pieces, err = parseInput(&req, chat, info); err != nil {
		return c, err
	}
	if err = host.CheckPromptSize(sizeOf(c.Prefill, c.Pieces), info); err != nil {
		return c, badRequest("%v", err)
	}
	if err = c.setLimit(&req); err != nil {
		return c, err
	}
	if err = c.setSampler(&req, info); err != nil {
		return c, err
	}
	if c.Slot, err = parseSlot(req.IDSlot); err != nil {
		return c, err
	}
	if v := req.NKeep; v != nil {
		if *v < -1 || *v > math.MaxInt32 {
			return c, badRequest("n_keep must be -1 (the whole prompt) or in [0, %d], got %d", math.MaxInt32, *v)
		}
		c.NKeep = int(*v)
	}
	if c.Spec, err = req.speculativeFields.parse(); err != nil {
		return c, err
	}
	if c.Stops, err = ReadStops(req.Stop, openAIStops); err != nil {
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
func (c *Completion) setOutput(req *Body, info iface.BackendInfo) error {
	o, err := req.OutputFields.Output()
	if err != nil {
		return FieldError(err)
	}
	if c.Chat && (o != nil || host.CallsTools(c.Prefill)) {
		if o == nil {
			o = &iface.Output{}
		}
		chat := c.Prefill
		o.Chat, o.Stops, c.Parsed = &chat, c.Stops, true
	}
	if o != nil && !slices.Contains(info.Capabilities, iface.CapOutput) {
		return &run.Error{Status: http.StatusNotImplemented, Type: "not_supported_error",
			Msg: fmt.Sprintf("the %s backend cannot constrain or parse a reply (tools with tool_choice other than \"none\", response_format, json_schema, grammar)", info.Name)}
	}
	c.Output = o
	return nil
}

// parseInput reads what to prefill: chat messages, or a text completion's
// prompt as text, token ids, or pieces of both to tokenize.
func parseInput(req *Body, chat bool, info iface.BackendInfo) (iface.PrefillRequest, []Piece, error) {
	if chat {
		p, err := req.ChatPrefill(info)
		return p, nil, err
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

// ChatPrefill is the chat's prompt: RPC PREFILL's for the same body.
func (req *Body) ChatPrefill(info iface.BackendInfo) (iface.PrefillRequest, error) {
	p, err := req.ChatBody.Prefill(0, info)
	return p, FieldError(err)
}

// sizeOf is the prompt CheckPromptSize judges: the request's, or a mixed
// prompt's token ids and text together.
func sizeOf(req iface.PrefillRequest, pieces []Piece) iface.PrefillRequest {
	var text strings.Builder
	for _, p := range pieces {
		req.Tokens = append(req.Tokens, p.Tokens...)
		text.WriteString(p.Text)
	}
	if pieces != nil {
		req.Text = text.String()
	}
	return req
}

// setLimit reads the token limit: llama-server's n_predict first, then the
// OpenAI names.
func (c *Completion) setLimit(req *Body) error {
	for i, n := range []*int64{req.NPredict, req.MaxCompletionTokens, req.MaxTokens} {
		if n == nil {
			continue
		}
		if *n < -1 || *n > math.MaxInt32 { // -1 is llama-server's n_predict -1: until EOS or the context is full
			name := []string{"n_predict", "max_completion_tokens", "max_tokens"}[i]
			return badRequest("%s must be -1 (no limit) or in [0, %d], got %d", name, math.MaxInt32, *n)
		}
		c.NPredict = int(*n)
		return nil
	}
	return nil
}

// setSampler applies the sampler fields given over the engine's defaults.
func (c *Completion) setSampler(req *Body, info iface.BackendInfo) error {
	if err := req.SamplerFields.Validate(info.SlotCtx()); err != nil {
		return badRequest("%v", err)
	}
	req.SamplerFields.Apply(&c.Sampler)
	if v := req.Seed; v != nil {
		if *v < 0 { // llama-server: -1 asks for a random seed
			c.Sampler.Seed = mrand.Uint64()
		} else {
			c.Sampler.Seed = uint64(*v)
		}
	}
	bias, err := parseLogitBias(req.LogitBias, info.NVocab)
	if err != nil {
		return err
	}
	if bias != nil {
		c.Sampler.LogitBias = bias
	}
	return c.setLogprobs(req)
}

// MaxTopLogprobs is OpenAI's limit on alternatives per position.
const MaxTopLogprobs = 20

// setLogprobs reads the ways of asking for log-probabilities: chat's
// logprobs true with top_logprobs N, the text API's logprobs N, and
// llama-server's n_probs N.
func (c *Completion) setLogprobs(req *Body) error {
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
		if *v < 0 || *v > MaxTopLogprobs {
			return badRequest("%s must be in [0, %d], got %d", name, MaxTopLogprobs, *v)
		}
		n = max(n, *v)
	}
	if n > MaxTopLogprobs {
		return badRequest("logprobs must be in [0, %d], got %d", MaxTopLogprobs, n)
	}
	c.Logprobs, c.NProbs = n >= 0, int(max(n, 0))
	return nil
}
