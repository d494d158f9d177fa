package httpapi

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// responsesWriter turns the chat completion's reply, as completion.go
// writes it, into a Response (llama-server's to_json_oaicompat_resp): its
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
type responsesWriter struct {
	w      http.ResponseWriter
	status int
	sse    bool
	pass   bool         // an error reply, written as it is
	buf    bytes.Buffer // the JSON reply, or SSE bytes not yet a whole event

	// From the run (observeRun).
	nPrompt, cached int

	// Stream state.
	id, model string
	created   int64
	seq       int // sequence_number of the next event
	started   bool
	ended     bool
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

func newResponsesWriter(w http.ResponseWriter) *responsesWriter {
	return &responsesWriter{w: w, calls: map[int]*respItem{}}
}

func (rw *responsesWriter) Header() http.Header { return rw.w.Header() }

func (rw *responsesWriter) WriteHeader(code int) {
	if rw.status != 0 {
		return
	}
	rw.status = code
	switch {
	case code != http.StatusOK:
		rw.pass = true
		rw.w.WriteHeader(code)
	case strings.HasPrefix(rw.w.Header().Get("Content-Type"), "text/event-stream"):
		rw.sse = true
		rw.w.WriteHeader(code)
	}
}

func (rw *responsesWriter) Write(p []byte) (int, error) {
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.pass {
		return rw.w.Write(p)
	}
	rw.buf.Write(p)
	if !rw.sse {
		return len(p), nil
	}
	if err := eachEvent(&rw.buf, rw.convertEvent); err != nil {
		return 0, err
	}
	return len(p), nil
}

// FlushError flushes the converted events (http.ResponseController).
func (rw *responsesWriter) FlushError() error {
	if !rw.sse && !rw.pass {
		return nil
	}
	return http.NewResponseController(rw.w).Flush()
}

// Unwrap is the connection's writer, for deadlines.
func (rw *responsesWriter) Unwrap() http.ResponseWriter { return rw.w }

func (rw *responsesWriter) observeRun(rn *completionRun) {
	rw.nPrompt, rw.cached = rn.nPrompt, rn.reused
}

// finish writes a whole (non-streamed) reply once the completion returned.
func (rw *responsesWriter) finish() {
	if rw.sse || rw.pass || rw.status == 0 {
		return
	}
	var body completionBody
	if err := json.Unmarshal(rw.buf.Bytes(), &body); err != nil || len(body.Choices) != 1 || body.Choices[0].Message == nil {
		writeAPIError(rw.w, &apiError{status: http.StatusInternalServerError, Type: "server_error",
			Msg: "the chat completion's reply could not be converted"})
		return
	}
	ch := body.Choices[0]
	m := ch.Message
	var output []map[string]any
	if m.ReasoningContent != nil && *m.ReasoningContent != "" {
		output = append(output, reasoningOutput(newID("rs_"), *m.ReasoningContent))
	}
	if m.Content != nil && *m.Content != "" {
		output = append(output, messageOutput(newID("msg_"), *m.Content))
	}
	for _, c := range m.ToolCalls {
		name, args := "", ""
		if f := c.Function; f != nil {
			name = f.Name
			if f.Arguments != nil {
				args = *f.Arguments
			}
		}
		output = append(output, callOutput(c.ID, name, args))
	}
	out := usageOf(body.Usage)
	writeJSON(rw.w, http.StatusOK, rw.response(responseID(body.ID), body.Model, body.Created, ch.FinishReason, output, out))
}

// response is the Response object of a reply that ended for finish.
func (rw *responsesWriter) response(id, model string, created int64, finish *string, output []map[string]any, outTokens int) map[string]any {
	if output == nil {
		output = []map[string]any{}
	}
	r := map[string]any{"id": id, "object": "response", "created_at": created, "model": model, "output": output,
		"status": "completed", "usage": map[string]any{"input_tokens": rw.nPrompt, "output_tokens": outTokens,
			"total_tokens": rw.nPrompt + outTokens, "input_tokens_details": map[string]any{"cached_tokens": rw.cached}}}
	if finish != nil && *finish == "length" {
		r["status"], r["incomplete_details"] = "incomplete", map[string]any{"reason": "max_output_tokens"}
	} else {
		r["completed_at"] = time.Now().Unix()
	}
	return r
}

func usageOf(u *usage) int {
	if u == nil {
		return 0
	}
	return u.CompletionTokens
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

// responseID is the resp_ form of the completion's id.
func responseID(id string) string {
	if _, rest, ok := strings.Cut(id, "-"); ok {
		return "resp_" + rest
	}
	return "resp_" + id
}

func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// convertEvent turns one chat completion SSE event into the Response's.
func (rw *responsesWriter) convertEvent(ev string) error {
	data, ok := strings.CutPrefix(ev, "data: ")
	if !ok || data == "[DONE]" { // llama-server's Responses stream has no [DONE]
		return nil
	}
	var chunk struct {
		completionBody
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal([]byte(data), &chunk); err != nil {
		return err
	}
	if chunk.Error != nil { // as llama-server sends it, and OpenAI's SDKs raise it
		_, err := rw.w.Write([]byte(ev + "\n\n"))
		return err
	}
	if !rw.started {
		if err := rw.start(chunk.ID, chunk.Model, chunk.Created); err != nil {
			return err
		}
	}
	if len(chunk.Choices) == 0 || rw.ended {
		return nil
	}
	ch := chunk.Choices[0]
	if d := ch.Delta; d != nil {
		if d.ReasoningContent != nil && *d.ReasoningContent != "" {
			if err := rw.reasoningDelta(*d.ReasoningContent); err != nil {
				return err
			}
		}
		if d.Content != nil && *d.Content != "" {
			if err := rw.textDelta(*d.Content); err != nil {
				return err
			}
		}
		for _, c := range d.ToolCalls {
			if err := rw.toolDelta(c); err != nil {
				return err
			}
		}
	}
	if ch.FinishReason == nil {
		return nil
	}
	rw.ended = true
	out := 0
	if chunk.Timings != nil {
		out = chunk.Timings.PredictedN
	}
	return rw.end(ch.FinishReason, out, chunk.Timings)
}

// start sends response.created and response.in_progress.
func (rw *responsesWriter) start(id, model string, created int64) error {
	rw.started, rw.id, rw.model, rw.created = true, responseID(id), model, created
	for _, name := range []string{"response.created", "response.in_progress"} {
		if err := rw.send(name, map[string]any{"response": map[string]any{"id": rw.id, "object": "response",
			"created_at": created, "status": "in_progress", "model": model, "output": []any{}}}); err != nil {
			return err
		}
	}
	return nil
}

// open adds an output item (output_item.added), and its text part where it
// has one (content_part.added).
func (rw *responsesWriter) open(kind, id string, item map[string]any, part map[string]any) (*respItem, error) {
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

func (rw *responsesWriter) reasoningDelta(text string) error {
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

func (rw *responsesWriter) textDelta(text string) error {
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
func (rw *responsesWriter) toolDelta(c toolCall) error {
	i := 0
	if c.Index != nil {
		i = *c.Index
	}
	it, seen := rw.calls[i]
	if !seen {
		name := ""
		if c.Function != nil {
			name = c.Function.Name
		}
		item := callOutput(c.ID, name, "")
		item["status"] = "in_progress"
		var err error
		if it, err = rw.open("function_call", "fc_"+c.ID, item, nil); err != nil {
			return err
		}
		it.callID, it.name = c.ID, name
		rw.calls[i] = it
	}
	if c.Function == nil || c.Function.Arguments == nil || *c.Function.Arguments == "" {
		return nil
	}
	it.text.WriteString(*c.Function.Arguments)
	return rw.send("response.function_call_arguments.delta", map[string]any{"delta": *c.Function.Arguments,
		"item_id": it.id, "output_index": it.index})
}

// end closes every item (the done events, in the order they opened) and
// sends the response: response.completed, or response.incomplete where the
// reply was cut at its limit; with llama-server's timings.
func (rw *responsesWriter) end(finish *string, outTokens int, tm *timings) error {
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
	r := rw.response(rw.id, rw.model, rw.created, finish, output, outTokens)
	name := "response.completed"
	if r["status"] == "incomplete" {
		name = "response.incomplete"
	}
	data := map[string]any{"response": r}
	if tm != nil {
		data["timings"] = tm
	}
	return rw.send(name, data)
}

// send writes one event, named as its type, with the next sequence_number.
func (rw *responsesWriter) send(name string, data map[string]any) error {
	data["type"], data["sequence_number"] = name, rw.seq
	rw.seq++
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	_, err = rw.w.Write([]byte("event: " + name + "\ndata: " + string(b) + "\n\n"))
	return err
}
