package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// anthropicWriter turns the chat completion's reply, as completion.go writes
// it, into Anthropic's: a message with content blocks (to_json_anthropic),
// or its event stream (message_start, content_block_start / delta / stop,
// message_delta, message_stop), and errors in Anthropic's shape. Blocks
// stream in the order their deltas come, each closed before the next opens.
type anthropicWriter struct {
	w      http.ResponseWriter
	status int
	sse    bool
	buf    bytes.Buffer // JSON reply, or SSE bytes not yet a whole event

	// From the run (observeRun).
	nPrompt, cached int
	stopString      bool
	stopWord        string

	// Stream state.
	id      string
	started bool // message_start sent
	ended   bool // message_stop sent
	next    int  // index of the next block
	open    string
	openIdx int
	tools   map[int]int // tool call index → block index
}

func newAnthropicWriter(w http.ResponseWriter) *anthropicWriter {
	return &anthropicWriter{w: w, tools: map[int]int{}}
}

func (aw *anthropicWriter) Header() http.Header { return aw.w.Header() }

func (aw *anthropicWriter) WriteHeader(code int) {
	if aw.status != 0 {
		return
	}
	aw.status = code
	if code == http.StatusOK && strings.HasPrefix(aw.w.Header().Get("Content-Type"), "text/event-stream") {
		aw.sse = true
		aw.w.WriteHeader(code)
	}
}

func (aw *anthropicWriter) Write(p []byte) (int, error) {
	if aw.status == 0 {
		aw.WriteHeader(http.StatusOK)
	}
	aw.buf.Write(p)
	if !aw.sse {
		return len(p), nil
	}
	if err := eachEvent(&aw.buf, aw.convertEvent); err != nil {
		return 0, err
	}
	return len(p), nil
}

// eachEvent hands convert every whole server-sent event buf holds (the
// text before its blank line), leaving the bytes of an event not yet whole:
// a converting writer's Write gets the chat completion's stream in pieces.
func eachEvent(buf *bytes.Buffer, convert func(ev string) error) error {
	for {
		b := buf.Bytes()
		i := bytes.Index(b, []byte("\n\n"))
		if i < 0 {
			return nil
		}
		ev := string(b[:i])
		buf.Next(i + 2)
		if err := convert(ev); err != nil {
			return err
		}
	}
}

// FlushError flushes the converted events (http.ResponseController).
func (aw *anthropicWriter) FlushError() error {
	if !aw.sse {
		return nil
	}
	return http.NewResponseController(aw.w).Flush()
}

// Unwrap is the connection's writer, for deadlines.
func (aw *anthropicWriter) Unwrap() http.ResponseWriter { return aw.w }

func (aw *anthropicWriter) observeRun(rn *completionRun) {
	aw.nPrompt, aw.cached = rn.nPrompt, rn.reused
	aw.stopString, aw.stopWord = rn.stop == iface.StopString, rn.stopWord
}

// finish writes a whole (non-streamed) reply once the completion returned.
func (aw *anthropicWriter) finish() {
	if aw.sse || aw.status == 0 {
		return
	}
	if aw.status != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(aw.buf.Bytes(), &e)
		writeAnthropicError(aw.w, aw.status, e.Error.Message)
		return
	}
	var body completionBody
	if err := json.Unmarshal(aw.buf.Bytes(), &body); err != nil || len(body.Choices) != 1 || body.Choices[0].Message == nil {
		writeAnthropicError(aw.w, http.StatusInternalServerError, "the chat completion's reply could not be converted")
		return
	}
	ch := body.Choices[0]
	m := ch.Message
	content := []map[string]any{}
	if m.ReasoningContent != nil && *m.ReasoningContent != "" {
		content = append(content, map[string]any{"type": "thinking", "thinking": *m.ReasoningContent, "signature": ""})
	}
	if m.Content != nil && *m.Content != "" {
		content = append(content, map[string]any{"type": "text", "text": *m.Content})
	}
	for _, c := range m.ToolCalls {
		content = append(content, toolUseBlock(c, true))
	}
	out := map[string]any{"id": messageID(body.ID), "type": "message", "role": "assistant", "content": content,
		"model": body.Model, "stop_reason": aw.stopReason(ch.FinishReason), "stop_sequence": aw.stopSequence(),
		"usage": aw.usage(body.Usage)}
	writeJSON(aw.w, http.StatusOK, out)
}

// toolUseBlock is a call as a tool_use block: with its input parsed (an
// unparsable one is {}, as llama-server), or empty to stream it.
func toolUseBlock(c toolCall, whole bool) map[string]any {
	name := ""
	if c.Function != nil {
		name = c.Function.Name
	}
	input := json.RawMessage(`{}`)
	if whole && c.Function != nil && c.Function.Arguments != nil {
		if a := json.RawMessage(*c.Function.Arguments); json.Valid(a) && bytes.HasPrefix(bytes.TrimSpace(a), []byte("{")) {
			input = a
		}
	}
	return map[string]any{"type": "tool_use", "id": c.ID, "name": name, "input": input}
}

// messageID is Anthropic's msg_ form of the completion's id.
func messageID(id string) string {
	if _, rest, ok := strings.Cut(id, "-"); ok {
		return "msg_" + rest
	}
	return "msg_" + id
}

func (aw *anthropicWriter) stopReason(finish *string) string {
	switch {
	case finish == nil:
		return "end_turn"
	case *finish == "tool_calls":
		return "tool_use"
	case *finish == "length":
		return "max_tokens"
	case aw.stopString:
		return "stop_sequence"
	}
	return "end_turn"
}

func (aw *anthropicWriter) stopSequence() any {
	if aw.stopString && aw.stopWord != "" {
		return aw.stopWord
	}
	return nil
}

// usage is Anthropic's, as llama-server counts it: input_tokens are the
// prompt's tokens not read from the slot's cache.
func (aw *anthropicWriter) usage(u *usage) map[string]any {
	out := 0
	if u != nil {
		out = u.CompletionTokens
	}
	return map[string]any{"input_tokens": aw.nPrompt - aw.cached, "cache_read_input_tokens": aw.cached, "output_tokens": out}
}

// convertEvent turns one OpenAI SSE event into Anthropic's.
func (aw *anthropicWriter) convertEvent(ev string) error {
	data, ok := strings.CutPrefix(ev, "data: ")
	if !ok || data == "[DONE]" {
		return nil
	}
	var chunk struct {
		completionBody
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal([]byte(data), &chunk); err != nil {
		return err
	}
	if chunk.Error != nil {
		return aw.send("error", anthropicErrorBody(aw.statusOfType(chunk.Error.Type), chunk.Error.Msg))
	}
	if !aw.started {
		aw.started, aw.id = true, messageID(chunk.ID)
		if err := aw.send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": aw.id, "type": "message", "role": "assistant", "content": []any{}, "model": chunk.Model,
			"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{
				"input_tokens": aw.nPrompt - aw.cached, "cache_read_input_tokens": aw.cached, "output_tokens": 0}}}); err != nil {
			return err
		}
	}
	if len(chunk.Choices) == 0 || aw.ended {
		return nil
	}
	ch := chunk.Choices[0]
	if d := ch.Delta; d != nil {
		if d.ReasoningContent != nil && *d.ReasoningContent != "" {
			if err := aw.delta("thinking", map[string]any{"type": "thinking", "thinking": ""},
				map[string]any{"type": "thinking_delta", "thinking": *d.ReasoningContent}); err != nil {
				return err
			}
		}
		if d.Content != nil && *d.Content != "" {
			if err := aw.delta("text", map[string]any{"type": "text", "text": ""},
				map[string]any{"type": "text_delta", "text": *d.Content}); err != nil {
				return err
			}
		}
		for _, c := range d.ToolCalls {
			if err := aw.toolDelta(c); err != nil {
				return err
			}
		}
	}
	if ch.FinishReason == nil {
		return nil
	}
	if err := aw.closeBlock(); err != nil {
		return err
	}
	out := 0
	if chunk.Timings != nil {
		out = chunk.Timings.PredictedN
	}
	aw.ended = true
	if err := aw.send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": aw.stopReason(ch.FinishReason), "stop_sequence": aw.stopSequence()},
		"usage": map[string]any{"output_tokens": out}}); err != nil {
		return err
	}
	return aw.send("message_stop", map[string]any{"type": "message_stop"})
}

// delta streams a piece of the block of kind, opening it (start) first
// when another block is open.
func (aw *anthropicWriter) delta(kind string, start, delta map[string]any) error {
	if aw.open != kind {
		if err := aw.openBlock(kind, start); err != nil {
			return err
		}
	}
	return aw.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": aw.openIdx, "delta": delta})
}

func (aw *anthropicWriter) toolDelta(c toolCall) error {
	i := 0
	if c.Index != nil {
		i = *c.Index
	}
	kind := "tool_use:" + strconv.Itoa(i)
	idx, seen := aw.tools[i]
	if !seen {
		if err := aw.openBlock(kind, toolUseBlock(c, false)); err != nil {
			return err
		}
		idx = aw.openIdx
		aw.tools[i] = idx
	}
	if c.Function == nil || c.Function.Arguments == nil || *c.Function.Arguments == "" {
		return nil
	}
	return aw.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx,
		"delta": map[string]any{"type": "input_json_delta", "partial_json": *c.Function.Arguments}})
}

func (aw *anthropicWriter) openBlock(kind string, block map[string]any) error {
	if err := aw.closeBlock(); err != nil {
		return err
	}
	aw.open, aw.openIdx = kind, aw.next
	aw.next++
	return aw.send("content_block_start", map[string]any{"type": "content_block_start", "index": aw.openIdx, "content_block": block})
}

// closeBlock ends the open block; a thinking block gets its (empty)
// signature first, which Anthropic's clients expect.
func (aw *anthropicWriter) closeBlock() error {
	if aw.open == "" {
		return nil
	}
	if aw.open == "thinking" {
		if err := aw.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": aw.openIdx,
			"delta": map[string]any{"type": "signature_delta", "signature": ""}}); err != nil {
			return err
		}
	}
	aw.open = ""
	return aw.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": aw.openIdx})
}

func (aw *anthropicWriter) send(event string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	_, err = aw.w.Write([]byte("event: " + event + "\ndata: " + string(b) + "\n\n"))
	return err
}

// statusOfType is the HTTP status an OpenAI error type stands for, to name
// Anthropic's error type in a stream.
func (aw *anthropicWriter) statusOfType(t string) int {
	switch t {
	case "invalid_request_error":
		return http.StatusBadRequest
	case "unavailable_error":
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// anthropicErrorBody is Anthropic's error: {"type":"error","error":{type,
// message}}, the type its status's. The message names the field at fault.
func anthropicErrorBody(status int, msg string) map[string]any {
	t := "api_error"
	switch {
	case status == http.StatusUnauthorized:
		t = "authentication_error"
	case status == http.StatusForbidden:
		t = "permission_error"
	case status == http.StatusNotFound:
		t = "not_found_error"
	case status == http.StatusRequestEntityTooLarge:
		t = "request_too_large"
	case status == http.StatusTooManyRequests:
		t = "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		t = "overloaded_error"
	case status >= 400 && status < 500:
		t = "invalid_request_error"
	}
	return map[string]any{"type": "error", "error": map[string]any{"type": t, "message": msg}}
}

func writeAnthropicError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, anthropicErrorBody(status, msg))
}
