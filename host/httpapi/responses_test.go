package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// responseReply is a Response object.
type responseReply struct {
	ID                string           `json:"id"`
	Object            string           `json:"object"`
	Status            string           `json:"status"`
	Model             string           `json:"model"`
	IncompleteDetails *json.RawMessage `json:"incomplete_details"`
	Output            []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"output"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
		Details      struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

func decodeResponse(t *testing.T, body []byte) responseReply {
	t.Helper()
	var r responseReply
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return r
}

// chatReply is the text and usage of a chat completion.
func chatReply(t *testing.T, h http.Handler, body string) (string, string, usage) {
	t.Helper()
	rec := post(h, "/v1/chat/completions", body)
	var r struct {
		Choices []struct {
			FinishReason string                   `json:"finish_reason"`
			Message      struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &r) != nil || len(r.Choices) != 1 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	return r.Choices[0].Message.Content, r.Choices[0].FinishReason, r.Usage
}

// streamed is a Responses stream as OpenAI's SDK reassembles it: the
// output items by output_index, each with its text or arguments from the
// deltas, and the response of the last event.
type streamed struct {
	names []string
	items []map[string]any
	final map[string]any
}

func reassembleResponse(t *testing.T, body string) streamed {
	t.Helper()
	var s streamed
	for i, e := range readEvents(t, body) {
		s.names = append(s.names, e.name)
		if e.data["sequence_number"] != float64(i) {
			t.Errorf("event %d (%s) has sequence_number %v", i, e.name, e.data["sequence_number"])
		}
		item := func() map[string]any {
			i := int(e.data["output_index"].(float64))
			if i >= len(s.items) {
				t.Fatalf("%s for output %d of %d", e.name, i, len(s.items))
			}
			return s.items[i]
		}
		switch e.name {
		case "response.output_item.added":
			it := e.data["item"].(map[string]any)
			it["text"] = ""
			if int(e.data["output_index"].(float64)) != len(s.items) {
				t.Errorf("item added at %v, %d open", e.data["output_index"], len(s.items))
			}
			s.items = append(s.items, it)
		case "response.output_text.delta", "response.reasoning_text.delta":
			it := item()
			if it["id"] != e.data["item_id"] || e.data["content_index"] != 0.0 {
				t.Errorf("%s for %v at %v", e.name, e.data["item_id"], e.data["content_index"])
			}
			it["text"] = it["text"].(string) + e.data["delta"].(string)
		case "response.function_call_arguments.delta":
			it := item()
			if it["id"] != e.data["item_id"] {
				t.Errorf("arguments for %v in %v", e.data["item_id"], it["id"])
			}
			it["arguments"] = it["arguments"].(string) + e.data["delta"].(string)
		case "response.completed", "response.incomplete", "response.created":
			s.final = e.data["response"].(map[string]any)
		}
	}
	return s
}

// TestResponsesText: a Response over the mock is the chat completion of the
// converted body (instructions a system message, a string input the
// user's): one message of output_text, usage from the run, "incomplete"
// where max_output_tokens cut it; input_tokens counts the same prompt;
// streamed, the events rebuild the same text, with no [DONE].
func TestResponsesText(t *testing.T) {
	_, h := newTestServer(t, 1)
	text, finish, u := chatReply(t, h, `{"max_tokens":8,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Once upon a time"}]}`)
	body := `{"model":"m","instructions":"Be brief.","input":"Once upon a time","max_output_tokens":8,"metadata":{"k":"v"},"store":false,"prompt_cache_key":"p"`
	rec := post(h, "/v1/responses", body+`}`)
	r := decodeResponse(t, rec.Body.Bytes())
	if rec.Code != 200 || r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || r.Model != "mock" || len(r.Output) != 1 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	o := r.Output[0]
	if o.Type != "message" || o.Role != "assistant" || o.Status != "completed" || !strings.HasPrefix(o.ID, "msg_") ||
		len(o.Content) != 1 || o.Content[0].Type != "output_text" || o.Content[0].Text != text {
		t.Errorf("output %+v, want the text %q", r.Output, text)
	}
	if want := map[string]string{"length": "incomplete", "stop": "completed"}[finish]; r.Status != want || (r.IncompleteDetails != nil) != (want == "incomplete") {
		t.Errorf("finish %q: status %q, incomplete_details %v", finish, r.Status, r.IncompleteDetails)
	}
	if r.Usage.InputTokens != u.PromptTokens || r.Usage.OutputTokens != u.CompletionTokens || r.Usage.TotalTokens != u.TotalTokens ||
		r.Usage.Details.CachedTokens == 0 {
		t.Errorf("usage %+v, want %+v with the prompt cached from the chat completion", r.Usage, u)
	}
	for _, path := range []string{"/v1/responses/input_tokens", "/responses/input_tokens"} {
		in := post(h, path, body+`}`)
		if in.Code != 200 || strings.TrimSpace(in.Body.String()) != `{"input_tokens":`+itoa(u.PromptTokens)+`,"object":"response.input_tokens"}` {
			t.Errorf("%s: %d %s", path, in.Code, in.Body)
		}
	}

	st := post(h, "/responses", body+`,"stream":true}`)
	if ct := st.Header().Get("Content-Type"); st.Code != 200 || !strings.HasPrefix(ct, "text/event-stream") || strings.Contains(st.Body.String(), "[DONE]") {
		t.Fatalf("%d %s %s", st.Code, ct, st.Body)
	}
	s := reassembleResponse(t, st.Body.String())
	end := "response." + r.Status
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	for range s.names[4 : len(s.names)-4] {
		want = append(want, "response.output_text.delta")
	}
	want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", end)
	if !reflect.DeepEqual(s.names, want) || len(s.items) != 1 || s.items[0]["text"] != text {
		t.Errorf("stream %v %v, want %v with %q", s.names, s.items, want, text)
	}
	out := s.final["output"].([]any)
	if s.final["status"] != r.Status || len(out) != 1 || out[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"] != text {
		t.Errorf("the stream's response %v", s.final)
	}
}

// TestResponsesReasoning: reasoning.effort reaches the template as the chat
// body's reasoning_effort does ("none": thinking off), and the reasoning
// budget llama-server's fields give bounds the reply's reasoning.
func TestResponsesReasoning(t *testing.T) {
	m, info := loadMock(t, 1)
	got := &iface.DecodeRequest{}
	info.Capabilities = append(info.Capabilities, iface.CapOutput, iface.CapReasoningBudget)
	_, h := serve(t, &parsingBackend{Backend: m, got: got}, info, nil)
	for _, c := range []struct{ body, kwargs string }{
		{`{"input":"x","reasoning":{"effort":"none"},"chat_template_kwargs":{"reasoning_effort":"low","a":1},"reasoning_budget_tokens":16,"reasoning_budget_message":"enough"}`,
			`{"a":1,"enable_thinking":false}`},
		{`{"input":"x","reasoning":{"effort":"low"},"reasoning_budget_tokens":16,"reasoning_budget_message":"enough"}`, `{"reasoning_effort":"low"}`},
	} {
		if rec := post(h, "/v1/responses", c.body); rec.Code != 200 {
			t.Fatalf("%s: %d %s", c.body, rec.Code, rec.Body)
		}
		o := got.Output
		if o == nil || o.Chat == nil || o.Chat.TemplateKwargs != c.kwargs || o.ReasoningBudget == nil || o.ReasoningBudget.Tokens != 16 ||
			o.ReasoningBudget.Message != "enough" {
			t.Errorf("%s: the backend got %+v", c.body, o)
		}
	}
}

// TestResponsesToolCalls: a parsed reply comes back as its reasoning item
// and function_call items (llama-server's fc_ and call_ ids), the tools and
// named choice reach the backend as the chat's; streamed, the events
// rebuild the reasoning and each call's arguments.
func TestResponsesToolCalls(t *testing.T) {
	m, info := loadMock(t, 1)
	got := &iface.DecodeRequest{}
	info.Capabilities = append(info.Capabilities, iface.CapOutput)
	_, h := serve(t, &parsingBackend{Backend: m, got: got}, info, nil)
	body := `{"input":[{"role":"user","content":"weather?"},{"type":"function_call","call_id":"call_0","name":"get_weather","arguments":"{}"},` +
		`{"type":"function_call_output","call_id":"call_0","output":"rain"}],` +
		`"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},{"type":"function","name":"get_time"}],` +
		`"tool_choice":{"type":"function","name":"get_time"}`
	rec := post(h, "/v1/responses", body+`}`)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	chat := got.Output.Chat
	if chat.ToolChoice != "required" || chat.ToolChoiceName != "get_time" || len(chat.Tools) != 2 || !strings.Contains(chat.Tools[0], `"strict":true`) {
		t.Errorf("backend got %+v", chat)
	}
	if ms := chat.Messages; len(ms) != 3 || ms[1].Role != "assistant" || len(ms[1].ToolCalls) != 1 || ms[1].ToolCalls[0].ID != "call_0" ||
		ms[2].Role != "tool" || ms[2].ToolCallID != "call_0" || ms[2].Content != "rain" {
		t.Errorf("messages %+v", ms)
	}
	r := decodeResponse(t, rec.Body.Bytes())
	var kinds []string
	for _, o := range r.Output {
		kinds = append(kinds, o.Type)
	}
	if !reflect.DeepEqual(kinds, []string{"reasoning", "function_call", "function_call"}) || r.Output[0].Content[0].Text != "need weather" ||
		r.Status != "completed" {
		t.Fatalf("reply %s", rec.Body)
	}
	for i, o := range r.Output[1:] {
		w := parsedReply.ToolCalls[i]
		if o.ID != "fc_"+w.ID || o.CallID != "call_"+w.ID || o.Name != w.Name || o.Arguments != w.Arguments || o.Status != "completed" {
			t.Errorf("call %d: %+v, want %+v", i, o, w)
		}
	}

	s := reassembleResponse(t, post(h, "/v1/responses", body+`,"stream":true}`).Body.String())
	if len(s.items) != 3 || s.items[0]["type"] != "reasoning" || s.items[0]["text"] != "need weather" ||
		s.items[1]["id"] != "fc_call_a" || s.items[1]["call_id"] != "call_call_a" || s.items[1]["arguments"] != `{"city":"Paris"}` ||
		s.items[2]["name"] != "get_time" || s.items[2]["arguments"] != `{"zone":"CET"}` {
		t.Errorf("stream items %v\n%v", s.items, s.names)
	}
	out := s.final["output"].([]any)
	if s.final["status"] != "completed" || len(out) != 3 || out[2].(map[string]any)["arguments"] != `{"zone":"CET"}` ||
		out[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"] != "need weather" {
		t.Errorf("the stream's response %v", s.final)
	}
	if strings.Count(strings.Join(s.names, " "), "response.output_item.done") != 3 || s.names[3] != "response.content_part.added" {
		t.Errorf("events %v", s.names)
	}
}

// TestResponsesBadInput: what the engine cannot honour or read is a 400
// naming the field (as the message's start and the error's param), before
// any stream; the mock, which cannot parse tool calls, refuses callable
// tools (501); no slot is left busy.
func TestResponsesBadInput(t *testing.T) {
	s, h := newTestServer(t, 1)
	for _, c := range []struct{ body, field string }{
		{`{"input":"x","tools":[{"type":"web_search"}]}`, "tools[0].type"},
		{`{"input":"x","tools":[{"type":"function","name":"f","defer_loading":true}]}`, "tools[0].defer_loading"},
		{`{"input":"x","tool_choice":{"type":"file_search"}}`, "tool_choice.type"},
		{`{"input":"x","tool_choice":{"type":"allowed_tools","mode":"auto","tools":[]}}`, "tool_choice.type"},
		{`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`, "input[0].content[0].type"},
		{`{"input":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`, "input[0].content[0].type"},
		{`{"input":[{"role":"user","content":[{"type":"input_text"}]}]}`, "input[0].content[0].text"},
		{`{"input":[{"type":"item_reference","id":"x"}]}`, "input[0].type"},
		{`{"input":[{"role":"tool","content":"x"}]}`, "input[0].role"},
		{`{"input":[{"role":"user","content":"x","name":"n"}]}`, "input[0].name"},
		{`{"input":[{"type":"function_call","call_id":"c","name":"f"}]}`, "input[0]"},
		{`{"input":[{"type":"function_call_output","call_id":"c"}]}`, "input[0].output"},
		{`{"input":[{"type":"reasoning","summary":[],"content":[]}]}`, "input[0].content"},
		{`{"input":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"t"}]}]}`, "input[0].summary"},
		{`{"input":[{"type":"reasoning","summary":[],"encrypted_content":"gAAA","content":[{"type":"reasoning_text","text":"t"}]}]}`, "input[0].encrypted_content"},
		{`{"input":[1]}`, "input[0]"},
		{`{"input":[]}`, "input"},
		{`{"input":42}`, "input"},
		{`{}`, "input"},
		{`{"input":"x","instructions":["a"]}`, "field instructions"},
		{`{"input":"x","previous_response_id":"resp_1"}`, "previous_response_id"},
		{`{"input":"x","store":true}`, "store"},
		{`{"input":"x","include":["reasoning.encrypted_content"]}`, "include"},
		{`{"input":"x","truncation":"auto"}`, "truncation"},
		{`{"input":"x","background":true}`, "background"},
		{`{"input":"x","stream_options":{"include_obfuscation":true}}`, "stream_options.include_obfuscation"},
		{`{"input":"x","reasoning":{"summary":"auto"}}`, "reasoning.summary"},
		{`{"input":"x","reasoning":{"effort":"max"}}`, "reasoning.effort"},
		{`{"input":"x","reasoning":{"effort":"low","budget":3}}`, "reasoning.budget"},
		{`{"input":"x","text":{"verbosity":"low"}}`, "text.verbosity"},
		{`{"input":"x","text":{"format":{"type":"xml"}}}`, "text.format.type"},
		{`{"input":"x","text":{"format":{"type":"json_schema","name":"p"}}}`, "text.format.schema"},
		{`{"input":"x","max_output_tokens":0}`, "max_output_tokens"},
		{`{"input":"x","service_tier":"flex"}`, "service_tier"},
		{`{"input":"x","top_logprobs":2}`, "top_logprobs"},
		{`{"input":"x","temperature":-1}`, "temperature"},
		{`{"input":"x","stream":true,"max_tool_calls":1}`, "max_tool_calls"},
	} {
		for _, path := range []string{"/v1/responses", "/v1/responses/input_tokens"} {
			rec := post(h, path, c.body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &e)
			param := strings.TrimPrefix(c.field, "field ")
			if path == "/v1/responses/input_tokens" && c.field == "temperature" { // counting samples nothing
				if rec.Code != 200 {
					t.Errorf("%s %s: %d %s", path, c.body, rec.Code, rec.Body)
				}
				continue
			}
			if rec.Code != 400 || !strings.HasPrefix(e.Error.Message, c.field) || e.Error.Param == nil || *e.Error.Param != param {
				t.Errorf("%s %s: %d %s, want a 400 naming %s", path, c.body, rec.Code, rec.Body, c.field)
			}
		}
	}
	rec := post(h, "/v1/responses", `{"input":"x","stream":true,"tools":[{"type":"function","name":"f"}]}`)
	if rec.Code != 501 || !strings.Contains(rec.Body.String(), "cannot constrain or parse a reply") {
		t.Errorf("tools on the mock: %d %s", rec.Code, rec.Body)
	}
	if rec := post(h, "/v1/responses", `{"input":"x","max_output_tokens":2,"tools":[{"type":"function","name":"f"}],"tool_choice":"none"}`); rec.Code != 200 {
		t.Errorf("tool_choice none: %d %s", rec.Code, rec.Body)
	}
	for i, v := range s.Slots() {
		if v.Processing {
			t.Errorf("slot %d left busy", i)
		}
	}
}

// TestResponsesStreamError: a failure once the stream is under way is the
// chat path's error event, as llama-server sends it, and ends the stream.
func TestResponsesStreamError(t *testing.T) {
	m, info := loadMock(t, 1)
	_, h := serve(t, cutBackend{Backend: m, after: 2}, info, nil)
	body := post(h, "/v1/responses", `{"input":"x","stream":true,"max_output_tokens":8}`).Body.String()
	evs := strings.Split(strings.TrimSpace(body), "\n\n")
	last := evs[len(evs)-1]
	if !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "generating the completion failed") || strings.Contains(body, "response.completed") {
		t.Errorf("stream %s", body)
	}
	if n := strings.Count(body, "response.output_text.delta\n"); n != 2 {
		t.Errorf("%d deltas before the error: %s", n, body)
	}
}

// cutBackend fails every decode after its first tokens.
type cutBackend struct {
	iface.Backend
	after int
}

func (b cutBackend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	n := 0
	res, err := b.Backend.Decode(ctx, req, func(t iface.Token) error {
		if n == b.after {
			return fmt.Errorf("decode cut by the test")
		}
		n++
		return emit(t)
	})
	return res, err
}
