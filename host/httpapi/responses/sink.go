package responses

import (
	"crypto/rand"
	"encoding/hex"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
	"net/http"
	"strings"
	"time"
)

// Sink writes a chat completion's events as a Response (llama-server's to_json_oaicompat_resp): its
// output items (reasoning, a message of output_text, function calls), or
// its event stream (to_json_oaicompat_resp_stream and the partial results'
// events). Errors are OpenAI's in either API and pass as they are.
//
// Beyond llama-server's events and fields, each event has OpenAI's
// sequence_number, and those of an item its output_index (and
// content_index), response.created carries the response's output and model,
// and a reasoning item's text part is announced (content_part.added) before
// its deltas: OpenAI's SDKs build the streamed response from those. A reply
// cut at max_output_tokens is "incomplete", as OpenAI's, where llama-server
// says "completed".
type Sink struct {
	w http.ResponseWriter

	head      run.Head
	begun     bool // the reply is a stream
	pending   bool // the stream starts with its first event (lazy)
	started   bool // response.created sent
	seq       int  // sequence_number of the next event
	items     []*respItem
	reasoning *respItem
	message   *respItem
	calls     map[int]*respItem // tool call index → its item
}

// respItem is a streamed output item: what its deltas carried so far.
type respItem struct {
	index        int
	kind         string // "reasoning", "message", "function_call"
	id           string
	callID, name string
	text         strings.Builder // the reasoning, the message's text, the call's arguments
}

// NewSink is the reply to w.
func NewSink(w http.ResponseWriter) *Sink {
	return &Sink{w: w, calls: map[int]*respItem{}}
}

func (s *Sink) Begin(h run.Head, lazy bool) error {
	s.begun, s.head = true, h
	if lazy {
		s.pending = true
		return nil
	}
	return s.start()
}

func (s *Sink) Token(iface.Token) {}

func (s *Sink) Started() bool { return s.started }

func (s *Sink) Delta(d run.Delta) error {
	if d.Empty() {
		return nil
	}
	if s.pending {
		if err := s.start(); err != nil {
			return err
		}
	}
	return d.Each(s.reasoningDelta, s.textDelta, s.toolDelta)
}

func (s *Sink) End(e run.End) error {
	if !s.begun {
		s.reply(e)
		return nil
	}
	if s.pending {
		if err := s.start(); err != nil {
			return err
		}
	}
	return s.end(e)
}

// Fail writes OpenAI's error, in either API: as the reply, or as the
// stream's last event as llama-server sends it and OpenAI's SDKs raise it.
func (s *Sink) Fail(e *run.Error) {
	if !s.started {
		run.WriteError(s.w, e)
		return
	}
	_ = run.Event(s.w, "", map[string]*run.Error{"error": e})
}

// reply writes the whole (non-streamed) Response.
func (s *Sink) reply(e run.End) {
	var output []map[string]any
	if e.Reasoning != "" {
		output = append(output, reasoningOutput(newID("rs_"), e.Reasoning))
	}
	if e.Text != "" {
		output = append(output, messageOutput(newID("msg_"), e.Text))
	}
	for _, c := range e.ToolCalls {
		output = append(output, callOutput(c.ID, c.Name, c.Arguments))
	}
	run.WriteJSON(s.w, http.StatusOK, response(e, output))
}

// response is the Response object of the reply that ended with e.
func response(e run.End, output []map[string]any) map[string]any {
	if output == nil {
		output = []map[string]any{}
	}
	r := map[string]any{"id": "resp_" + e.ID, "object": "response", "created_at": e.Created, "model": e.Model, "output": output,
		"status": "completed", "usage": map[string]any{"input_tokens": e.NPrompt, "output_tokens": e.Generated,
			"total_tokens": e.NPrompt + e.Generated, "input_tokens_details": map[string]any{"cached_tokens": e.Reused}}}
	if e.Finish == "length" {
		r["status"], r["incomplete_details"] = "incomplete", map[string]any{"reason": "max_output_tokens"}
	} else {
		r["completed_at"] = time.Now().Unix()
	}
	return r
}

func reasoningOutput(id, text string) map[string]any {
	return map[string]any{"id": id, "summary": []any{}, "type": "reasoning", "encrypted_content": "", "status": "completed",
		"content": []any{map[string]any{"type": "reasoning_text", "text": text}}}
}

func textPart(text string) map[string]any {
	return map[string]any{"type": "output_text", "annotations": []any{}, "logprobs": []any{}, "text": text}
}

func messageOutput(id, text string) map[string]any {
	return map[string]any{"id": id, "type": "message", "role": "assistant", "status": "completed", "content": []any{textPart(text)}}
}

// callOutput is a function call item; its ids are llama-server's, fc_ and
// call_ before the call's own id.
func callOutput(id, name, args string) map[string]any {
	return map[string]any{"id": "fc_" + id, "type": "function_call", "status": "completed", "arguments": args,
		"call_id": "call_" + id, "name": name}
}

func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// start sends response.created and response.in_progress.
func (s *Sink) start() error {
	s.pending, s.started = false, true
	run.StartSSE(s.w)
	h := s.head
	for _, name := range []string{"response.created", "response.in_progress"} {
		if err := s.send(name, map[string]any{"response": map[string]any{"id": "resp_" + h.ID, "object": "response",
			"created_at": h.Created, "status": "in_progress", "model": h.Model, "output": []any{}}}); err != nil {
			return err
		}
	}
	return nil
}

// open adds an output item (output_item.added), and its text part where it
// has one (content_part.added).
func (s *Sink) open(kind, id string, item map[string]any, part map[string]any) (*respItem, error) {
	it := &respItem{index: len(s.items), kind: kind, id: id}
	s.items = append(s.items, it)
	if err := s.send("response.output_item.added", map[string]any{"output_index": it.index, "item": item}); err != nil {
		return it, err
	}
	if part == nil {
		return it, nil
	}
	return it, s.send("response.content_part.added", map[string]any{"item_id": id, "output_index": it.index,
		"content_index": 0, "part": part})
}

func (s *Sink) reasoningDelta(text string) error {
	if s.reasoning == nil {
		id := newID("rs_")
		var err error
		if s.reasoning, err = s.open("reasoning", id, map[string]any{"id": id, "summary": []any{}, "type": "reasoning",
			"content": []any{}, "encrypted_content": "", "status": "in_progress"},
			map[string]any{"type": "reasoning_text", "text": ""}); err != nil {
			return err
		}
	}
	it := s.reasoning
	it.text.WriteString(text)
	return s.send("response.reasoning_text.delta", map[string]any{"delta": text, "item_id": it.id,
		"output_index": it.index, "content_index": 0})
}

func (s *Sink) textDelta(text string) error {
	if s.message == nil {
		id := newID("msg_")
		var err error
		if s.message, err = s.open("message", id, map[string]any{"content": []any{}, "id": id, "role": "assistant",
			"status": "in_progress", "type": "message"},
			map[string]any{"type": "output_text", "text": "", "annotations": []any{}}); err != nil {
			return err
		}
	}
	it := s.message
	it.text.WriteString(text)
	return s.send("response.output_text.delta", map[string]any{"item_id": it.id, "delta": text,
		"output_index": it.index, "content_index": 0})
}

// toolDelta opens a call's item at its first piece (id and name, as
// llama-server streams them) and streams its arguments.
func (s *Sink) toolDelta(c run.ToolPiece) error {
	it, seen := s.calls[c.Index]
	if !seen {
		item := callOutput(c.ID, c.Name, "")
		item["status"] = "in_progress"
		var err error
		if it, err = s.open("function_call", "fc_"+c.ID, item, nil); err != nil {
			return err
		}
		it.callID, it.name = c.ID, c.Name
		s.calls[c.Index] = it
	}
	if c.Args == "" {
		return nil
	}
	it.text.WriteString(c.Args)
	return s.send("response.function_call_arguments.delta", map[string]any{"delta": c.Args,
		"item_id": it.id, "output_index": it.index})
}

// end closes every item (the done events, in the order they opened) and
// sends the response: response.completed, or response.incomplete where the
// reply was cut at its limit; with llama-server's timings.
func (s *Sink) end(e run.End) error {
	var output []map[string]any
	for _, it := range s.items {
		var item map[string]any
		switch it.kind {
		case "reasoning":
			item = reasoningOutput(it.id, it.text.String())
		case "message":
			text := it.text.String()
			if err := s.send("response.output_text.done", map[string]any{"item_id": it.id, "output_index": it.index,
				"content_index": 0, "text": text}); err != nil {
				return err
			}
			if err := s.send("response.content_part.done", map[string]any{"item_id": it.id, "output_index": it.index,
				"content_index": 0, "part": textPart(text)}); err != nil {
				return err
			}
			item = messageOutput(it.id, text)
		case "function_call":
			item = callOutput(it.callID, it.name, it.text.String())
		}
		if err := s.send("response.output_item.done", map[string]any{"output_index": it.index, "item": item}); err != nil {
			return err
		}
		output = append(output, item)
	}
	r := response(e, output)
	name := "response.completed"
	if r["status"] == "incomplete" {
		name = "response.incomplete"
	}
	data := map[string]any{"response": r}
	if e.Timings != nil {
		data["timings"] = e.Timings
	}
	return s.send(name, data)
}

// send writes one event, named as its type, with the next sequence_number.
func (s *Sink) send(name string, data map[string]any) error {
	data["type"], data["sequence_number"] = name, s.seq
	s.seq++
	return run.Event(s.w, name, data)
}
