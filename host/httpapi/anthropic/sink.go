package anthropic

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Sink writes a chat completion's events as Anthropic's reply: a
// message with content blocks (to_json_anthropic), or its event stream
// (message_start, content_block_start / delta / stop, message_delta,
// message_stop), and errors in Anthropic's shape. Blocks stream in the
// order their deltas come, each closed before the next opens.
type Sink struct {
	w http.ResponseWriter

	head    run.Head
	begun   bool // the reply is a stream
	pending bool // the stream starts with its first event (lazy)
	started bool // message_start sent
	next    int  // index of the next block
	open    string
	openIdx int
	tools   map[int]int // tool call index → block index
}

// NewSink is the reply to w.
func NewSink(w http.ResponseWriter) *Sink {
	return &Sink{w: w, tools: map[int]int{}}
}

func (s *Sink) Begin(h run.Head, lazy bool) error {
	s.begun, s.head = true, h
	if lazy {
		s.pending = true
		return nil
	}
	return s.start(h)
}

// start sends the stream's header and message_start, its usage the
// prompt's as known now.
func (s *Sink) start(h run.Head) error {
	s.pending, s.started = false, true
	run.StartSSE(s.w)
	return s.send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_" + h.ID, "type": "message", "role": "assistant", "content": []any{}, "model": h.Model,
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{
			"input_tokens": h.NPrompt - h.Reused, "cache_read_input_tokens": h.Reused, "output_tokens": 0}}})
}

func (s *Sink) Token(iface.Token) {}

func (s *Sink) Started() bool { return s.started }

func (s *Sink) Delta(d run.Delta) error {
	if d.Empty() {
		return nil
	}
	if s.pending {
		if err := s.start(s.head); err != nil {
			return err
		}
	}
	return d.Each(s.thinkingDelta, s.textDelta, s.toolDelta)
}

// thinkingDelta streams reasoning into the open thinking block.
func (s *Sink) thinkingDelta(text string) error {
	return s.delta("thinking", map[string]any{"type": "thinking", "thinking": ""},
		map[string]any{"type": "thinking_delta", "thinking": text})
}

// textDelta streams content into the open text block.
func (s *Sink) textDelta(text string) error {
	return s.delta("text", map[string]any{"type": "text", "text": ""},
		map[string]any{"type": "text_delta", "text": text})
}

func (s *Sink) End(e run.End) error {
	if !s.begun {
		s.reply(e)
		return nil
	}
	if s.pending {
		if err := s.start(e.Head); err != nil {
			return err
		}
	}
	if err := s.closeBlock(); err != nil {
		return err
	}
	if err := s.send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stopReason(e), "stop_sequence": stopSequence(e)},
		"usage": map[string]any{"output_tokens": e.Generated}}); err != nil {
		return err
	}
	return s.send("message_stop", map[string]any{"type": "message_stop"})
}

// Fail is Anthropic's error reply where nothing went out, else its error
// event, typed as the OpenAI error's type reads.
func (s *Sink) Fail(e *run.Error) {
	if !s.started {
		run.RetryAfter(s.w, e)
		WriteError(s.w, e.Status, e.Msg)
		return
	}
	_ = s.send("error", errorBody(statusOfType(e.Type), e.Msg))
}

// reply writes the whole (non-streamed) message.
func (s *Sink) reply(e run.End) {
	content := []map[string]any{}
	if e.Reasoning != "" {
		content = append(content, map[string]any{"type": "thinking", "thinking": e.Reasoning, "signature": ""})
	}
	if e.Text != "" {
		content = append(content, map[string]any{"type": "text", "text": e.Text})
	}
	for _, c := range e.ToolCalls {
		content = append(content, toolUseBlock(c.ID, c.Name, c.Arguments, true))
	}
	out := map[string]any{"id": "msg_" + e.ID, "type": "message", "role": "assistant", "content": content,
		"model": e.Model, "stop_reason": stopReason(e), "stop_sequence": stopSequence(e),
		"usage": map[string]any{"input_tokens": e.NPrompt - e.Reused, "cache_read_input_tokens": e.Reused, "output_tokens": e.Generated}}
	run.WriteJSON(s.w, http.StatusOK, out)
}

// toolUseBlock is a call as a tool_use block: with its input parsed (an
// unparsable one is {}, as llama-server), or empty to stream it.
func toolUseBlock(id, name, args string, whole bool) map[string]any {
	input := json.RawMessage(`{}`)
	if whole {
		if a := json.RawMessage(args); json.Valid(a) && bytes.HasPrefix(bytes.TrimSpace(a), []byte("{")) {
			input = a
		}
	}
	return map[string]any{"type": "tool_use", "id": id, "name": name, "input": input}
}

// stopReason is Anthropic's stop_reason for how the reply ended.
func stopReason(e run.End) string {
	switch {
	case e.Finish == "tool_calls":
		return "tool_use"
	case e.Finish == "length":
		return "max_tokens"
	case e.Stop == iface.StopString:
		return "stop_sequence"
	}
	return "end_turn"
}

// stopSequence is the stop string that ended the reply, where known.
func stopSequence(e run.End) any {
	if e.Stop == iface.StopString && e.StopWord != "" {
		return e.StopWord
	}
	return nil
}

// delta streams a piece of the block of kind, opening it (start) first
// when another block is open.
func (s *Sink) delta(kind string, start, delta map[string]any) error {
	if s.open != kind {
		if err := s.openBlock(kind, start); err != nil {
			return err
		}
	}
	return s.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.openIdx, "delta": delta})
}

func (s *Sink) toolDelta(c run.ToolPiece) error {
	kind := "tool_use:" + strconv.Itoa(c.Index)
	idx, seen := s.tools[c.Index]
	if !seen {
		if err := s.openBlock(kind, toolUseBlock(c.ID, c.Name, "", false)); err != nil {
			return err
		}
		idx = s.openIdx
		s.tools[c.Index] = idx
	}
	if c.Args == "" {
		return nil
	}
	return s.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": idx,
		"delta": map[string]any{"type": "input_json_delta", "partial_json": c.Args}})
}

func (s *Sink) openBlock(kind string, block map[string]any) error {
	if err := s.closeBlock(); err != nil {
		return err
	}
	s.open, s.openIdx = kind, s.next
	s.next++
	return s.send("content_block_start", map[string]any{"type": "content_block_start", "index": s.openIdx, "content_block": block})
}

// closeBlock ends the open block; a thinking block gets its (empty)
// signature first, which Anthropic's clients expect.
func (s *Sink) closeBlock() error {
	if s.open == "" {
		return nil
	}
	if s.open == "thinking" {
		if err := s.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.openIdx,
			"delta": map[string]any{"type": "signature_delta", "signature": ""}}); err != nil {
			return err
		}
	}
	s.open = ""
	return s.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": s.openIdx})
}

func (s *Sink) send(event string, data any) error {
	return run.Event(s.w, event, data)
}

// statusOfType is the HTTP status an OpenAI error type stands for, to name
// Anthropic's error type in a stream.
func statusOfType(t string) int {
	switch t {
	case "invalid_request_error":
		return http.StatusBadRequest
	case "unavailable_error":
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// errorBody is Anthropic's error: {"type":"error","error":{type,
// message}}, the type its status's. The message names the field at fault.
func errorBody(status int, msg string) map[string]any {
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

// WriteError writes Anthropic's error of status as the whole reply.
func WriteError(w http.ResponseWriter, status int, msg string) {
	run.WriteJSON(w, status, errorBody(status, msg))
}
