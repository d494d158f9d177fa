package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// prompt is one prompt text with its tokens (the model's own tokenizer, BOS
// first, through llama-batched -tokenize), so that a server taking token ids
// and one taking text evaluate the same tokens.
type prompt struct {
	Text   string
	Tokens []int32
}

// call is one completion request: generate n tokens from p, greedy.
type call struct {
	p    prompt
	n    int
	slot int // ours: id_slot; -1 for any
}

// api is one way of asking a server for a streamed completion.
type api struct {
	name    string // in the report: the endpoint and how the prompt goes
	path    string
	counter string // what gives the token count: "usage" or "eval_count"
	body    func(model string, c call) any
	parse   func(io.Reader, func(event) error) error
}

// Seed for every request: greedy decoding does not use it, but a server
// that samples anyway does so reproducibly.
const seed = 42

// oursRaw is our engine's text completion with the prompt as token ids (the
// engine does not tokenize for the llama plugin), usage in the last chunk.
var oursRaw = api{
	name: "POST /v1/completions, prompt as token ids", path: "/v1/completions", counter: "usage",
	body: func(model string, c call) any {
		b := map[string]any{
			"model": model, "prompt": c.p.Tokens, "stream": true,
			"stream_options": map[string]any{"include_usage": true},
			"max_tokens":     c.n, "temperature": 0, "seed": seed,
		}
		if c.slot >= 0 {
			b["id_slot"] = c.slot
		}
		return b
	},
	parse: parseSSE,
}

// ollamaRaw is Ollama's native generate with raw: true (the prompt text as
// is, no template; its llamarunner tokenizes it with BOS, as -tokenize
// does). repeat_penalty 1: Ollama's default 1.1 applies even at
// temperature 0, and greedy decoding is what the other systems do.
var ollamaRaw = api{
	name: "POST /api/generate, raw: true, prompt as text", path: "/api/generate", counter: "eval_count",
	body: func(model string, c call) any {
		return map[string]any{
			"model": model, "prompt": c.p.Text, "raw": true, "stream": true,
			"options": map[string]any{"num_predict": c.n, "temperature": 0, "seed": seed, "repeat_penalty": 1},
		}
	},
	parse: parseNDJSON,
}

// openAIChat is the chat completion both servers serve: one user message,
// each server applying the model's chat template (ChatML for gguf-gen's
// models). Ollama maps max_tokens to num_predict, keeps temperature and
// seed, and takes repeat_penalty from the model (PARAMETER in the
// Modelfile).
var openAIChat = api{
	name: "POST /v1/chat/completions, one user message", path: "/v1/chat/completions", counter: "usage",
	body: func(model string, c call) any {
		b := map[string]any{
			"model": model, "messages": []map[string]string{{"role": "user", "content": c.p.Text}},
			"stream": true, "stream_options": map[string]any{"include_usage": true},
			"max_tokens": c.n, "temperature": 0, "seed": seed,
		}
		if c.slot >= 0 {
			b["id_slot"] = c.slot
		}
		return b
	},
	parse: parseSSE,
}

// byteBias bans the tokens of gguf-gen's vocabulary that are bytes
// 0x80–0xFF (<0x80>…<0xFF>, ids 133–260): a random-weight model emits them
// as invalid UTF-8, on which llama-server's stream parser fails the request
// ("does not match the expected Content-only format"). Every OpenAI-shaped
// request of every system carries it, so each pays the same sampler.
func byteBias() map[string]float64 {
	const firstByte = 5 // gguf.Vocab: five special tokens, then <0x00>…<0xFF>
	b := map[string]float64{}
	for id := firstByte + 0x80; id <= firstByte+0xFF; id++ {
		b[strconv.Itoa(id)] = -100
	}
	return b
}

// withByteBias is ap with byteBias in every request's body.
func withByteBias(ap api) api {
	body := ap.body
	ap.body = func(model string, c call) any {
		b := body(model, c).(map[string]any)
		b["logit_bias"] = byteBias()
		return b
	}
	ap.name += ", gguf-gen's bytes 0x80–0xFF banned (logit_bias)"
	return ap
}

// sample is what one request measured. Times are from the round's start.
type sample struct {
	Start   time.Duration `json:"start_ns"`
	First   time.Duration `json:"first_ns"` // the first message with text (or the last, if none had any)
	Last    time.Duration `json:"last_ns"`  // the last message with text
	End     time.Duration `json:"end_ns"`   // the stream's end
	Tokens  int           `json:"tokens"`
	Counted string        `json:"counted"` // usage, eval_count or chunks
	Chunks  int           `json:"chunks"`  // messages with text
	Prompt  int           `json:"prompt_tokens"`
	Text    string        `json:"text"`
	Slot    int           `json:"slot"`
	Busy    int           `json:"busy_retries"` // 503s before a slot was free (ours: no queue)
	// Draft tokens verified and accepted (speculative decoding); 0 without.
	DraftN        int    `json:"draft_n,omitempty"`
	DraftAccepted int    `json:"draft_n_accepted,omitempty"`
	Err           string `json:"error,omitempty"`
}

func (s sample) ttft() time.Duration { return s.First - s.Start }

// decodeRate is the stream's tokens per second after its first.
func (s sample) decodeRate() float64 {
	d := (s.Last - s.First).Seconds()
	if s.Tokens < 2 || d <= 0 {
		return 0
	}
	return float64(s.Tokens-1) / d
}

// endpoint is one server's completion API.
type endpoint struct {
	base  string // http://host:port
	model string
	api   api
	http  *http.Client
}

func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns: 512, MaxIdleConnsPerHost: 512, DisableCompression: true, IdleConnTimeout: time.Minute,
	}}
}

// busyRetry is how soon a request refused for want of a free slot (503)
// is sent again: ours has no queue, a client retries, and the wait counts
// in the request's time to first token.
const busyRetry = 20 * time.Millisecond

// do runs one streamed completion; t0 is the round's start. onFirst, if
// set, is called at the first token.
func (e *endpoint) do(ctx context.Context, t0 time.Time, c call, onFirst func()) sample {
	s := sample{Start: time.Since(t0), Slot: -1, Counted: "chunks"}
	body, err := json.Marshal(e.api.body(e.model, c))
	if err != nil {
		s.Err = err.Error()
		return s
	}
	resp, err := e.post(ctx, body, &s.Busy)
	if err != nil {
		s.Err = err.Error()
		s.End = time.Since(t0)
		return s
	}
	defer resp.Body.Close()
	var text bytes.Buffer
	first := false
	err = e.api.parse(resp.Body, func(ev event) error {
		now := time.Since(t0)
		if ev.Text != "" {
			text.WriteString(ev.Text)
			s.Chunks++
			s.Last = now
		}
		if !first && (ev.Text != "" || ev.Final) {
			first, s.First = true, now
			if onFirst != nil {
				onFirst()
			}
		}
		if ev.Tokens >= 0 {
			s.Tokens, s.Counted = ev.Tokens, e.api.counter
		}
		if ev.Prompt >= 0 {
			s.Prompt = ev.Prompt
		}
		if ev.Slot >= 0 {
			s.Slot = ev.Slot
		}
		if ev.DraftN > 0 {
			s.DraftN, s.DraftAccepted = ev.DraftN, ev.DraftAccepted
		}
		return nil
	})
	s.End = time.Since(t0)
	s.Text = text.String()
	if s.Counted == "chunks" {
		s.Tokens = s.Chunks
	}
	if s.Last == 0 {
		s.Last = s.First
	}
	if err != nil {
		s.Err = err.Error()
	}
	return s
}

// post sends the request, again after busyRetry while the server answers
// 503 (all slots busy), and returns a 200 response.
func (e *endpoint) post(ctx context.Context, body []byte, busy *int) (*http.Response, error) {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base+e.api.path, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := e.http.Do(req)
		if err != nil {
			return nil, err
		}
		switch resp.StatusCode {
		case http.StatusOK:
			return resp, nil
		case http.StatusServiceUnavailable:
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			*busy++
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(busyRetry):
			}
			continue
		}
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s: %s", e.api.path, resp.Status, bytes.TrimSpace(msg))
	}
}
