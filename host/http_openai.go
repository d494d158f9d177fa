package host

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// OpenAI-compatible completions (protocol §8). The prompt is prefilled into
// a slot taken from the slot table, then decoded; with "stream":true every
// token the backend emits goes out at once as a server-sent event.

// completionRequest is the union of the chat and text completion bodies.
// Fields this engine does not know are ignored, as OpenAI clients send many.
type completionRequest struct {
	Model         string          `json:"model"`
	Messages      []chatMessage   `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
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

// apiErrorOf maps a slot or backend error to its OpenAI form.
func apiErrorOf(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	e := &apiError{status: httpStatusOf(err), Msg: err.Error()}
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

func writeAPIError(w http.ResponseWriter, err error) {
	e := apiErrorOf(err)
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeHTTPJSON(w, e.status, map[string]*apiError{"error": e})
}

// parseCompletion validates a body; sampler holds the engine's defaults.
func parseCompletion(body []byte, chat bool, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (completion, error) {
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return completion{}, badRequest("request body is not a valid JSON object: %v", err)
	}
	c := completion{chat: chat, model: req.Model, stream: req.Stream, sampler: sampler, nPredict: nPredict, slot: -1}
	c.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if req.N != nil && *req.N != 1 {
		return c, badRequest("n must be 1: this engine returns one choice")
	}
	if chat {
		if len(req.Messages) == 0 {
			return c, badRequest("messages must be a non-empty array")
		}
		msgs, err := toMessages(req.Messages)
		if err != nil {
			return c, badRequest("%v", err)
		}
		c.prefill = iface.PrefillRequest{Messages: msgs, Model: req.Model}
	} else {
		toks, text, err := parsePrompt(req.Prompt)
		if err != nil {
			return c, err
		}
		if toks == nil {
			if toks, err = tokenizeText(info, text); err != nil {
				return c, err
			}
		}
		if len(toks) == 0 {
			return c, badRequest("prompt is empty")
		}
		c.prefill = iface.PrefillRequest{Tokens: toks, Model: req.Model}
	}
	// llama-server's n_predict first, then the OpenAI names.
	for _, n := range []*int64{req.NPredict, req.MaxCompletionTokens, req.MaxTokens} {
		if n != nil {
			if *n < -1 || *n > math.MaxInt32 {
				return c, badRequest("n_predict/max_tokens must be -1 (no limit) or in [0, %d], got %d", math.MaxInt32, *n)
			}
			c.nPredict = int(*n)
			break
		}
	}
	if v := req.Temperature; v != nil {
		if *v < 0 || math.IsNaN(*v) {
			return c, badRequest("temperature must be >= 0, got %v", *v)
		}
		c.sampler.Temperature = float32(*v)
	}
	if v := req.TopP; v != nil {
		if !(*v > 0 && *v <= 1) {
			return c, badRequest("top_p must be in (0, 1], got %v", *v)
		}
		c.sampler.TopP = float32(*v)
	}
	if v := req.TopK; v != nil {
		if *v < 0 || *v > math.MaxInt32 {
			return c, badRequest("top_k must be in [0, %d], got %d", math.MaxInt32, *v)
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
	if v := req.IDSlot; v != nil && *v != -1 {
		if *v < 0 || *v > math.MaxInt32 {
			return c, badRequest("id_slot %d is not a slot id", *v)
		}
		c.slot = int(*v)
	}
	stops, err := parseStop(req.Stop)
	if err != nil {
		return c, err
	}
	c.stops = stops
	return c, nil
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

func (a *httpAPI) chatCompletions(w http.ResponseWriter, r *http.Request) { a.complete(w, r, true) }
func (a *httpAPI) textCompletions(w http.ResponseWriter, r *http.Request) { a.complete(w, r, false) }

// usage is OpenAI's token count.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// timings is llama-server's, which the coordinator reads.
type timings struct {
	PromptN             int     `json:"prompt_n"`
	PromptMS            float64 `json:"prompt_ms"`
	PromptPerTokenMS    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMS         float64 `json:"predicted_ms"`
	PredictedPerTokenMS float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

func newTimings(nPrompt int, prompt time.Duration, nPred int, pred time.Duration) *timings {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	per := func(n int, d time.Duration) (perToken, perSecond float64) {
		if n > 0 && d > 0 {
			return ms(d) / float64(n), float64(n) / d.Seconds()
		}
		return 0, 0
	}
	t := &timings{PromptN: nPrompt, PromptMS: ms(prompt), PredictedN: nPred, PredictedMS: ms(pred)}
	t.PromptPerTokenMS, t.PromptPerSecond = per(nPrompt, prompt)
	t.PredictedPerTokenMS, t.PredictedPerSecond = per(nPred, pred)
	return t
}

// message and choice cover both response shapes; nil fields are omitted.
type message struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type choice struct {
	Index        int      `json:"index"`
	Message      *message `json:"message,omitempty"` // chat, whole reply
	Delta        *message `json:"delta,omitempty"`   // chat, streamed chunk
	Text         *string  `json:"text,omitempty"`    // text completion
	Logprobs     any      `json:"logprobs"`
	FinishReason *string  `json:"finish_reason"`
}

type completionBody struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"`
	Created           int64    `json:"created"`
	Model             string   `json:"model"`
	SystemFingerprint string   `json:"system_fingerprint"`
	Choices           []choice `json:"choices"`
	Usage             *usage   `json:"usage,omitempty"`
	Timings           *timings `json:"timings,omitempty"`
	IDSlot            *int     `json:"id_slot,omitempty"`
}

// finishReason maps a backend stop reason to OpenAI's.
func finishReason(stop string) string {
	if stop == "eos" {
		return "stop"
	}
	return "length" // "length", "n_tokens_limit"
}

// errStopString ends a decode whose text reached a stop string.
var errStopString = errors.New("stop string reached")

// completionRun is one completion in flight.
type completionRun struct {
	c       completion
	w       http.ResponseWriter
	rc      *http.ResponseController
	body    completionBody
	started bool // SSE headers sent
}

func (a *httpAPI) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	ctx := r.Context()
	body, err := readBody(w, r, a.s.cfg.MaxJSONBytes)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	b, info := a.s.Backend()
	c, err := parseCompletion(body, chat, a.s.tun.Sampler(), a.s.tun.NPredict(), info)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	slot := c.slot
	if slot < 0 {
		slot, err = a.acquireIdle()
	} else {
		err = a.s.slots.acquire(slot, slotProcessing)
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	var after *iface.SlotInfo
	defer func() { a.s.slots.release(slot, after) }()
	defer func() {
		if si, err := b.Slot(a.s.ctx, slot); err == nil {
			after = &si
		}
	}()

	// The prompt is evaluated before any byte of the reply, so a bad prompt
	// gets a real HTTP status even when streaming.
	c.prefill.Slot = slot
	pstart := time.Now()
	pres, err := b.Prefill(ctx, c.prefill)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	pdur := time.Since(pstart)
	nPrompt := len(pres.Slot.Tokens)
	a.s.stats.tokens(PhasePrefill, nPrompt, pdur)

	nPredict := c.nPredict
	if nPredict < 0 {
		nPredict = math.MaxInt32
		if info.NCtx > 0 {
			nPredict = max(info.NCtx-pres.Slot.NPast, 0)
		}
	}
	taskID := a.beginTask(slot, nPrompt, nPredict)

	rn := &completionRun{c: c, w: w, rc: http.NewResponseController(w)}
	rn.body = completionBody{ID: newCompletionID(chat), Object: "text_completion", Created: time.Now().Unix(),
		Model: info.Model.Alias, SystemFingerprint: fingerprint(info)}
	switch {
	case chat && c.stream:
		rn.body.Object = "chat.completion.chunk"
	case chat:
		rn.body.Object = "chat.completion"
	}
	if c.stream {
		if err := rn.startStream(); err != nil {
			return // the client is gone
		}
	}

	dstart := time.Now()
	text, nGen, reason, err := rn.decode(ctx, b, slot, nPredict)
	ddur := time.Since(dstart)
	a.endTask(slot, taskID, nGen, nPredict)
	if err != nil {
		if ctx.Err() == nil { // else the client went away: nobody to tell
			rn.fail(err)
		}
		return
	}
	a.s.stats.tokens(PhaseDecode, nGen, ddur)

	u := &usage{PromptTokens: nPrompt, CompletionTokens: nGen, TotalTokens: nPrompt + nGen}
	tm := newTimings(nPrompt, pdur, nGen, ddur)
	if c.stream {
		rn.finishStream(reason, u, tm, slot)
		return
	}
	ch := choice{FinishReason: &reason}
	if chat {
		ch.Message = &message{Role: "assistant", Content: &text}
	} else {
		ch.Text = &text
	}
	rn.body.Choices, rn.body.Usage, rn.body.Timings, rn.body.IDSlot = []choice{ch}, u, tm, &slot
	writeHTTPJSON(w, http.StatusOK, rn.body)
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

// beginTask records a completion on slot for /slots and returns its id.
func (a *httpAPI) beginTask(slot, nPrompt, nRemain int) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	id := a.next
	a.next++
	a.tasks[slot] = slotTask{id: id, nPrompt: nPrompt, nRemain: nRemain, processed: time.Now()}
	return id
}

func (a *httpAPI) endTask(slot int, id int64, nDecoded, nPredict int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t, ok := a.tasks[slot]; ok && t.id == id {
		t.nDecoded, t.nRemain, t.processed = nDecoded, max(nPredict-nDecoded, 0), time.Now()
		a.tasks[slot] = t
	}
}

func newCompletionID(chat bool) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	if chat {
		return "chatcmpl-" + hex.EncodeToString(b[:])
	}
	return "cmpl-" + hex.EncodeToString(b[:])
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

// decode generates up to nPredict tokens into the slot, streaming them when
// asked, and returns the text shown, the tokens generated and OpenAI's
// finish_reason. nPredict 0 (the coordinator's prefill-only call) decodes
// nothing.
func (rn *completionRun) decode(ctx context.Context, b iface.Backend, slot, nPredict int) (string, int, string, error) {
	if nPredict == 0 {
		return "", 0, "length", nil
	}
	ts := &textStream{stops: rn.c.stops}
	var text strings.Builder
	n := 0
	res, err := b.Decode(ctx, iface.DecodeRequest{Slot: slot, NPredict: nPredict, Sampler: rn.c.sampler}, func(t iface.Token) error {
		n++
		out, stopped := ts.push(t.Text)
		text.WriteString(out)
		if rn.c.stream && out != "" {
			if err := rn.chunk(out, nil); err != nil {
				return err
			}
		}
		if stopped {
			return errStopString
		}
		return nil
	})
	switch {
	case errors.Is(err, errStopString):
		return text.String(), n, "stop", nil
	case err != nil:
		return text.String(), n, "", err
	}
	rest := ts.flush()
	text.WriteString(rest)
	if rn.c.stream && rest != "" {
		if err := rn.chunk(rest, nil); err != nil {
			return text.String(), n, "", err
		}
	}
	return text.String(), n, finishReason(res.StopReason), nil
}

// startStream sends the SSE headers and, for chat, the role-only first
// chunk OpenAI clients expect.
func (rn *completionRun) startStream() error {
	h := rn.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // keep reverse proxies from batching events
	rn.w.WriteHeader(http.StatusOK)
	rn.started = true
	if !rn.c.chat {
		return rn.rc.Flush()
	}
	empty := ""
	return rn.event(rn.chunkBody(&message{Role: "assistant", Content: &empty}, nil, nil))
}

// chunkBody is one streamed chunk with a delta (chat) or text.
func (rn *completionRun) chunkBody(delta *message, text *string, reason *string) completionBody {
	b := rn.body
	ch := choice{Delta: delta, Text: text, FinishReason: reason}
	if rn.c.chat && delta == nil {
		ch.Delta = &message{}
	}
	b.Choices = []choice{ch}
	return b
}

// chunk streams a piece of generated text.
func (rn *completionRun) chunk(s string, reason *string) error {
	if rn.c.chat {
		return rn.event(rn.chunkBody(&message{Content: &s}, nil, reason))
	}
	return rn.event(rn.chunkBody(nil, &s, reason))
}

// finishStream sends the chunk carrying finish_reason (with llama-server's
// timings), the usage chunk if asked for, and [DONE].
func (rn *completionRun) finishStream(reason string, u *usage, tm *timings, slot int) {
	var last completionBody
	if rn.c.chat {
		last = rn.chunkBody(nil, nil, &reason)
	} else {
		empty := ""
		last = rn.chunkBody(nil, &empty, &reason)
	}
	last.Timings, last.IDSlot = tm, &slot
	if rn.event(last) != nil {
		return
	}
	if rn.c.includeUsage {
		ub := rn.body
		ub.Choices, ub.Usage = []choice{}, u
		if rn.event(ub) != nil {
			return
		}
	}
	if _, err := rn.w.Write([]byte("data: [DONE]\n\n")); err == nil {
		_ = rn.rc.Flush()
	}
}

// fail reports an error: as the reply when nothing was sent yet, else as a
// final {"error":…} event, which OpenAI clients raise as an APIError.
func (rn *completionRun) fail(err error) {
	if !rn.started {
		writeAPIError(rn.w, err)
		return
	}
	_ = rn.event(map[string]*apiError{"error": apiErrorOf(err)})
}

// event writes one SSE event and flushes it to the client.
func (rn *completionRun) event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(append(append(buf, "data: "...), b...), "\n\n"...)
	if _, err := rn.w.Write(buf); err != nil {
		return err
	}
	return rn.rc.Flush()
}
