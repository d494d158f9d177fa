package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/iface"
)

// OpenAI-compatible completions (protocol §8): the request bodies, their
// validation, and the error replies. completion.go runs them.

// completionRequest is the union of the chat and text completion bodies.
// Fields this engine does not know are ignored, as OpenAI clients send many.
type completionRequest struct {
	Model         string             `json:"model"`
	Messages      []host.ChatMessage `json:"messages"`
	Prompt        json.RawMessage    `json:"prompt"`
	Stream        bool               `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	NPredict            *int64          `json:"n_predict"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	MaxTokens           *int64          `json:"max_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int64          `json:"top_k"`
	Seed                *int64          `json:"seed"`
	IDSlot              *int64          `json:"id_slot"`
	Stop                json.RawMessage `json:"stop"`
	N                   *int            `json:"n"`
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
	slot         int // -1: any idle slot
	stops        []string
}

// apiError is an OpenAI error reply: {"error":{"message","type","code"}};
// the types are llama-server's, which the coordinator was written against.
type apiError struct {
	status int
	Msg    string `json:"message"`
	Type   string `json:"type"`
	Code   any    `json:"code"`
	Param  any    `json:"param"`
}

func (e *apiError) Error() string { return e.Msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...), Type: "invalid_request_error"}
}

// apiErrorOf maps an error of the step named (a slot or backend error, or
// an apiError already) to its OpenAI form, in client words (clientMessage).
func (a *api) apiErrorOf(step string, err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	e := &apiError{status: statusOf(err), Msg: a.clientMessage(step, err)}
	switch e.status {
	case http.StatusBadRequest:
		e.Type = "invalid_request_error"
	case http.StatusServiceUnavailable:
		e.Type, e.Code = "unavailable_error", "slot_busy"
	case http.StatusNotImplemented:
		e.Type = "not_supported_error"
	default:
		e.Type = "server_error"
	}
	return e
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.status, map[string]*apiError{"error": e})
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit uint64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(min(limit, math.MaxInt64))))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
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
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Msg: fmt.Sprintf("request body of %d bytes exceeds the %d-byte limit", r.ContentLength, limit)}
		}
		n = uint64(r.ContentLength)
	}
	release, err := s.AdmitPayload(r.Context(), n)
	switch {
	case errors.Is(err, host.ErrBudgetBusy):
		return nil, &apiError{status: http.StatusServiceUnavailable, Type: "unavailable_error", Code: "payload_budget", Msg: err.Error()}
	case err != nil:
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
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
	if err := decodeJSON(body, &req); err != nil {
		return completion{}, err
	}
	c := completion{chat: chat, model: req.Model, stream: req.Stream, sampler: sampler, nPredict: nPredict, slot: -1}
	c.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if req.N != nil && *req.N != 1 {
		return c, badRequest("n must be 1: this engine returns one choice")
	}
	var err error
	if c.prefill, err = parseInput(&req, chat, info); err != nil {
		return c, err
	}
	if err = c.setLimit(&req); err != nil {
		return c, err
	}
	if err = c.setSampler(&req); err != nil {
		return c, err
	}
	if c.slot, err = parseSlot(req.IDSlot); err != nil {
		return c, err
	}
	c.stops, err = parseStop(req.Stop)
	return c, err
}

// parseInput reads what to prefill: chat messages, or a text completion's
// prompt as token ids.
func parseInput(req *completionRequest, chat bool, info iface.BackendInfo) (iface.PrefillRequest, error) {
	if chat {
		if len(req.Messages) == 0 {
			return iface.PrefillRequest{}, badRequest("messages must be a non-empty array")
		}
		msgs, err := host.ToMessages(req.Messages)
		if err != nil {
			return iface.PrefillRequest{}, badRequest("%v", err)
		}
		return iface.PrefillRequest{Messages: msgs, Model: req.Model}, nil
	}
	toks, text, err := parsePrompt(req.Prompt)
	if err != nil {
		return iface.PrefillRequest{}, err
	}
	if toks == nil {
		if toks, err = tokenizeText(info, text); err != nil {
			return iface.PrefillRequest{}, err
		}
	}
	if len(toks) == 0 {
		return iface.PrefillRequest{}, badRequest("prompt is empty")
	}
	return iface.PrefillRequest{Tokens: toks, Model: req.Model}, nil
}

// setLimit reads the token limit: llama-server's n_predict first, then the
// OpenAI names.
func (c *completion) setLimit(req *completionRequest) error {
	for _, n := range []*int64{req.NPredict, req.MaxCompletionTokens, req.MaxTokens} {
		if n == nil {
			continue
		}
		if *n < -1 || *n > math.MaxInt32 {
			return badRequest("n_predict/max_tokens must be -1 (no limit) or in [0, %d], got %d", math.MaxInt32, *n)
		}
		c.nPredict = int(*n)
		return nil
	}
	return nil
}

// setSampler applies the sampler fields given over the engine's defaults.
func (c *completion) setSampler(req *completionRequest) error {
	if v := req.Temperature; v != nil {
		if *v < 0 || math.IsNaN(*v) {
			return badRequest("temperature must be >= 0, got %v", *v)
		}
		c.sampler.Temperature = float32(*v)
	}
	if v := req.TopP; v != nil {
		if !(*v > 0 && *v <= 1) {
			return badRequest("top_p must be in (0, 1], got %v", *v)
		}
		c.sampler.TopP = float32(*v)
	}
	if v := req.TopK; v != nil {
		if *v < 0 || *v > math.MaxInt32 {
			return badRequest("top_k must be in [0, %d], got %d", math.MaxInt32, *v)
		}
		c.sampler.TopK = int32(*v)
	}
	if v := req.Seed; v != nil {
		if *v < 0 { // llama-server: -1 asks for a random seed
			c.sampler.Seed = mrand.Uint64()
		} else {
			c.sampler.Seed = uint64(*v)
		}
	}
	return nil
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

// parsePrompt reads /v1/completions' prompt: a string or token ids, alone or
// as the only element of a batch (one choice per request here).
func parsePrompt(raw json.RawMessage) (toks []int32, text string, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, "", badRequest("prompt is required")
	}
	if json.Unmarshal(raw, &text) == nil {
		return nil, text, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return tokenIDs(ids)
	}
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) == nil {
		if len(batch) != 1 {
			return nil, "", badRequest("prompt batches of %d are not supported: send one prompt per request", len(batch))
		}
		return parsePrompt(batch[0])
	}
	return nil, "", badRequest("prompt must be a string or an array of token ids")
}

func tokenIDs(ids []int64) ([]int32, string, error) {
	toks := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return nil, "", badRequest("prompt token %d (%d) is not a token id", i, id)
		}
		toks[i] = int32(id)
	}
	return toks, "", nil
}

// byteTokenizers are backends whose vocabulary is one token per byte, so the
// host can tokenize a text prompt itself.
var byteTokenizers = map[string]bool{"mock": true}

// tokenizeText turns a text prompt into tokens. iface.Backend has no
// tokenizer call: only byte-vocabulary backends take text prompts here;
// other backends take token ids, or chat messages (which they template and
// tokenize in Prefill).
func tokenizeText(info iface.BackendInfo, text string) ([]int32, error) {
	if !byteTokenizers[info.Name] {
		return nil, &apiError{status: http.StatusNotImplemented, Type: "not_supported_error",
			Msg: fmt.Sprintf("backend %q cannot tokenize a text prompt through the plugin interface: send prompt as token ids, or use /v1/chat/completions", info.Name)}
	}
	toks := make([]int32, len(text))
	for i := 0; i < len(text); i++ {
		toks[i] = int32(text[i])
	}
	return toks, nil
}

// parseStop reads "stop": a string or up to 4 strings (OpenAI's limit).
func parseStop(raw json.RawMessage) ([]string, error) {
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
	if len(many) > 4 {
		return nil, badRequest("stop takes at most 4 strings, got %d", len(many))
	}
	out := many[:0]
	for _, s := range many {
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}
