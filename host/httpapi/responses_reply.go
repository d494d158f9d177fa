package httpapi

import (
	"crypto/rand"
	"encoding/hex"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
	"net/http"
	"strings"
	"time"
)

// responsesSink writes a chat completion's events as a Response (llama-server's to_json_oaicompat_resp): its
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
type responsesSink struct {
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

func newResponsesSink(w http.ResponseWriter) *responsesSink {
	return &responsesSink{w: w, calls: map[int]*respItem{}}
}

func (rw *responsesSink) Begin(h run.Head, lazy bool) error {
	rw.begun, rw.head = true, h
	if lazy {
		rw.pending = true
		return nil
	}
	return rw.start()
}

func (rw *responsesSink) Token(iface.Token) {}

func (rw *responsesSink) Started() bool { return rw.started }

func (rw *responsesSink) Delta(d run.Delta) error {
	if d.Reasoning == "" && d.Content == "" && d.Tool == nil {
		return nil
	}
	if rw.pending {
		if err := rw.start(); err != nil {
			return err
		}
	}
	if d.Reasoning != "" {
		if err := rw.reasoningDelta(d.Reasoning); err != nil {
			return err
		}
	}
	if d.Content != "" {
		if err := rw.textDelta(d.Content); err != nil {
			return err
		}
	}
	if d.Tool != nil {
		return rw.toolDelta(*d.Tool)
	}
	return nil
}

func (rw *responsesSink) End(e run.End) error {
	if !rw.begun {
		rw.reply(e)
		return nil
	}
	if rw.pending {
		if err := rw.start(); err != nil {
			return err
		}
	}
	out := 0
	if e.Timings != nil {
		out = e.Timings.PredictedN
	}
	return rw.end(e, out)
}

// Fail writes OpenAI's error, in either API: as the reply, or as the
// stream's last event as llama-server sends it and OpenAI's SDKs raise it.
func (rw *responsesSink) Fail(e *run.Error) {
	if !rw.started {
		run.WriteError(rw.w, e)
		return
	}
	_ = run.Event(rw.w, "", map[string]*run.Error{"error": e})
}

// reply writes the whole (non-streamed) Response.
func (rw *responsesSink) reply(e run.End) {
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
	run.WriteJSON(rw.w, http.StatusOK, response(e, output, e.Generated))
}

// response is the Response object of the reply that ended with e.
func response(e run.End, output []map[string]any, outTokens int) map[string]any {
	if output == nil {
		output = []map[string]any{}
	}
	r := map[string]any{"id": "resp_" + e.ID, "object": "response", "created_at": e.Created, "model": e.Model, "output": output,
		"status": "completed", "usage": map[string]any{"input_tokens": e.NPrompt, "output_tokens": outTokens,
			"total_tokens": e.NPrompt + outTokens, "input_tokens_details": map[string]any{"cached_tokens": e.Reused}}}
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
func (rw *responsesSink) start() error {
	rw.pending, rw.started = false, true
	run.StartSSE(rw.w)
	h := rw.head
	for _, name := range []string{"response.created", "response.in_progress"} {
		if err := rw.send(name, map[string]any{"response": map[string]any{"id": "resp_" + h.ID, "object": "response",
			"created_at": h.Created, "status": "in_progress", "model": h.Model, "output": []any{}}}); err != nil {
			return err
		}
	}
	return nil
}

// open adds an output item (output_item.added), and its text part where it
// has one (content_part.added).
func (rw *responsesSink) open(kind, id string, item map[string]any, part map[string]any) (*respItem, error) {
	it := &respItem{index: len(rw.items), kind: kind, id: id}
	rw.items = append(rw.items, it)
	if err := rw.send("response.output_item.added", map[string]any{"output_index": it.index, "item": item}); err != nil {
		return it, err
	}
	if part == nil {
		return it, nil
	}
	return it, rw.send("response.content_part.added", map[string]any{"item_id": id, "output_index": it.index,
		"content_index": 0, "part": part})
}

func (rw *responsesSink) reasoningDelta(text string) error {
	if rw.reasoning == nil {
		id := newID("rs_")
		var err error
		if rw.reasoning, err = rw.open("reasoning", id, map[string]any{"id": id, "summary": []any{}, "type": "reasoning",
			"content": []any{}, "encrypted_content": "", "status": "in_progress"},
			map[string]any{"type": "reasoning_text", "text": ""}); err != nil {
			return err
		}
	}
	it := rw.reasoning
	it.text.WriteString(text)
	return rw.send("response.reasoning_text.delta", map[string]any{"delta": text, "item_id": it.id,
		"output_index": it.index, "content_index": 0})
}

func (rw *responsesSink) textDelta(text string) error {
	if rw.message == nil {
		id := newID("msg_")
		var err error
		if rw.message, err = rw.open("message", id, map[string]any{"content": []any{}, "id": id, "role": "assistant",
			"status": "in_progress", "type": "message"},
			map[string]any{"type": "output_text", "text": "", "annotations": []any{}}); err != nil {
			return err
		}
	}
	it := rw.message
	it.text.WriteString(text)
	return rw.send("response.output_text.delta", map[string]any{"item_id": it.id, "delta": text,
		"output_index": it.index, "content_index": 0})
}

// toolDelta opens a call's item at its first piece (id and name, as
// llama-server streams them) and streams its arguments.
func (rw *responsesSink) toolDelta(c run.ToolPiece) error {
	it, seen := rw.calls[c.Index]
	if !seen {
		item := callOutput(c.ID, c.Name, "")
		item["status"] = "in_progress"
		var err error
		if it, err = rw.open("function_call", "fc_"+c.ID, item, nil); err != nil {
			return err
		}
		it.callID, it.name = c.ID, c.Name
		rw.calls[c.Index] = it
	}
	if c.Args == "" {
		return nil
	}
	it.text.WriteString(c.Args)
	return rw.send("response.function_call_arguments.delta", map[string]any{"delta": c.Args,
		"item_id": it.id, "output_index": it.index})
}

// end closes every item (the done events, in the order they opened) and
// sends the response: response.completed, or response.incomplete where the
// reply was cut at its limit; with llama-server's timings.
func (rw *responsesSink) end(e run.End, outTokens int) error {
	var output []map[string]any
	for _, it := range rw.items {
		var item map[string]any
		switch it.kind {
		case "reasoning":
			item = reasoningOutput(it.id, it.text.String())
		case "message":
			text := it.text.String()
			if err := rw.send("response.output_text.done", map[string]any{"item_id": it.id, "output_index": it.index,
				"content_index": 0, "text": text}); err != nil {
				return err
			}
			if err := rw.send("response.content_part.done", map[string]any{"item_id": it.id, "output_index": it.index,
				"content_index": 0, "part": textPart(text)}); err != nil {
				return err
			}
			item = messageOutput(it.id, text)
		case "function_call":
			item = callOutput(it.callID, it.name, it.text.String())
		}
		if err := rw.send("response.output_item.done", map[string]any{"output_index": it.index, "item": item}); err != nil {
			return err
		}
		output = append(output, item)
	}
	r := response(e, output, outTokens)
	name := "response.completed"
	if r["status"] == "incomplete" {
		name = "response.incomplete"
	}
	data := map[string]any{"response": r}
	if e.Timings != nil {
		data["timings"] = e.Timings
	}
	return rw.send(name, data)
}

// send writes one event, named as its type, with the next sequence_number.
func (rw *responsesSink) send(name string, data map[string]any) error {
	data["type"], data["sequence_number"] = name, rw.seq
	rw.seq++
	return run.Event(rw.w, name, data)
}
