package httpapi

import (
	"bufio"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// anthropicReply is a /v1/messages reply.
type anthropicReply struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Content []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Thinking string          `json:"thinking"`
		ID       string          `json:"id"`
		Name     string          `json:"name"`
		Input    json.RawMessage `json:"input"`
	} `json:"content"`
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        struct {
		InputTokens  int `json:"input_tokens"`
		CacheRead    int `json:"cache_read_input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeReply(t *testing.T, body string) anthropicReply {
	t.Helper()
	var r anthropicReply
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return r
}

// sseEvent is one event of an Anthropic stream.
type sseEvent struct {
	name string
	data map[string]any
}

func readEvents(t *testing.T, body string) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	var name string
	for sc.Scan() {
		line := sc.Text()
		if n, ok := strings.CutPrefix(line, "event: "); ok {
			name = n
			continue
		}
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var data map[string]any
		if err := json.Unmarshal([]byte(d), &data); err != nil {
			t.Fatalf("%v: %s", err, d)
		}
		if data["type"] != name {
			t.Errorf("event %q carries data of type %v", name, data["type"])
		}
		out = append(out, sseEvent{name, data})
		name = ""
	}
	return out
}

// reassemble is a stream's message as Anthropic's SDK builds it: the text
// and thinking of its blocks, each tool_use's input JSON, the stop reason.
func reassemble(t *testing.T, evs []sseEvent) (names []string, blocks []map[string]any, stop string) {
	t.Helper()
	for _, e := range evs {
		names = append(names, e.name)
		switch e.name {
		case "content_block_start":
			if int(e.data["index"].(float64)) != len(blocks) {
				t.Errorf("block %v opened at %d", e.data["index"], len(blocks))
			}
			b := e.data["content_block"].(map[string]any)
			b["partial_json"] = ""
			blocks = append(blocks, b)
		case "content_block_delta":
			b := blocks[int(e.data["index"].(float64))]
			d := e.data["delta"].(map[string]any)
			switch d["type"] {
			case "text_delta":
				b["text"] = b["text"].(string) + d["text"].(string)
			case "thinking_delta":
				b["thinking"] = b["thinking"].(string) + d["thinking"].(string)
			case "input_json_delta":
				b["partial_json"] = b["partial_json"].(string) + d["partial_json"].(string)
			case "signature_delta":
			default:
				t.Errorf("delta type %v", d["type"])
			}
		case "message_delta":
			stop = e.data["delta"].(map[string]any)["stop_reason"].(string)
		}
	}
	return names, blocks, stop
}

const messagesBodyText = `{"model":"m","max_tokens":8,"system":[{"type":"text","text":"Be brief."}],` +
	`"messages":[{"role":"user","content":[{"type":"text","text":"Once upon"},{"type":"text","text":" a time","cache_control":{"type":"ephemeral"}}]}]`

// TestMessagesText: a Messages reply over the mock is the chat completion
// of the converted body (the same text), as one message with a text block,
// stop_reason max_tokens, usage whose input_tokens count_tokens gives too;
// streamed, the events rebuild the same text.
func TestMessagesText(t *testing.T) {
	_, h := newTestServer(t, 1)
	chat := post(h, "/v1/chat/completions", `{"max_tokens":8,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Once upon a time"}]}`)
	var want struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(chat.Body.Bytes(), &want); err != nil || len(want.Choices) != 1 {
		t.Fatalf("%s %v", chat.Body, err)
	}
	rec := post(h, "/v1/messages", messagesBodyText+`}`)
	r := decodeReply(t, rec.Body.String())
	if rec.Code != 200 || r.Type != "message" || r.Role != "assistant" || !strings.HasPrefix(r.ID, "msg_") || len(r.Content) != 1 ||
		r.Content[0].Type != "text" || r.Content[0].Text != want.Choices[0].Message.Content || r.StopReason != "max_tokens" || r.StopSequence != nil {
		t.Fatalf("%d %s, want the text %q", rec.Code, rec.Body, want.Choices[0].Message.Content)
	}
	if r.Usage.OutputTokens != 8 || r.Usage.InputTokens+r.Usage.CacheRead != want.Usage.PromptTokens {
		t.Errorf("usage %+v, want 8 output tokens and %d prompt tokens", r.Usage, want.Usage.PromptTokens)
	}
	count := post(h, "/v1/messages/count_tokens", messagesBodyText+`}`)
	var n struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.Unmarshal(count.Body.Bytes(), &n); count.Code != 200 || err != nil || n.InputTokens != want.Usage.PromptTokens {
		t.Errorf("count_tokens: %d %s, want %d", count.Code, count.Body, want.Usage.PromptTokens)
	}
	for _, path := range []string{"/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"} {
		in := post(h, path, `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Once upon a time"}]}`)
		if in.Code != 200 || strings.TrimSpace(in.Body.String()) != `{"input_tokens":`+itoa(want.Usage.PromptTokens)+`,"object":"response.input_tokens"}` {
			t.Errorf("%s: %d %s", path, in.Code, in.Body)
		}
	}
	if in := post(h, "/v1/chat/completions/input_tokens", `{"messages":[]}`); in.Code != 400 || !strings.Contains(in.Body.String(), `"param":"messages"`) {
		t.Errorf("input_tokens of no messages: %d %s", in.Code, in.Body)
	}

	st := post(h, "/v1/messages", messagesBodyText+`,"stream":true}`)
	if ct := st.Header().Get("Content-Type"); st.Code != 200 || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("%d %s %s", st.Code, ct, st.Body)
	}
	names, blocks, stop := reassemble(t, readEvents(t, st.Body.String()))
	wantNames := []string{"message_start", "content_block_start"}
	for range names[2 : len(names)-3] {
		wantNames = append(wantNames, "content_block_delta")
	}
	wantNames = append(wantNames, "content_block_stop", "message_delta", "message_stop")
	if !reflect.DeepEqual(names, wantNames) || len(blocks) != 1 || blocks[0]["text"] != r.Content[0].Text || stop != "max_tokens" {
		t.Errorf("stream: %v %v %s, want %v with %q", names, blocks, stop, wantNames, r.Content[0].Text)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestMessagesStopSequence: a reply cut by one of stop_sequences says so and
// which.
func TestMessagesStopSequence(t *testing.T) {
	_, h := newTestServer(t, 1)
	full := decodeReply(t, post(h, "/v1/messages", `{"max_tokens":40,"messages":[{"role":"user","content":"Once"}]}`).Body.String())
	text := full.Content[0].Text
	stop := text[len(text)/2 : len(text)/2+3]
	body := `{"max_tokens":40,"messages":[{"role":"user","content":"Once"}],"stop_sequences":["@@@@",` + mustJSON(stop) + `]`
	r := decodeReply(t, post(h, "/v1/messages", body+`}`).Body.String())
	if r.StopReason != "stop_sequence" || r.StopSequence == nil || *r.StopSequence != stop || r.Content[0].Text != text[:strings.Index(text, stop)] {
		t.Errorf("%+v, want stop_sequence %q", r, stop)
	}
	evs := readEvents(t, post(h, "/v1/messages", body+`,"stream":true}`).Body.String())
	d := evs[len(evs)-2].data["delta"].(map[string]any)
	if d["stop_reason"] != "stop_sequence" || d["stop_sequence"] != stop {
		t.Errorf("streamed message_delta %v", d)
	}
}

// TestMessagesBadInput: what the engine cannot honour or read is a 400 in
// Anthropic's error shape whose message names the field; the mock, which
// cannot parse tool calls, refuses tools (501); no slot is left busy.
func TestMessagesBadInput(t *testing.T) {
	_, h := newTestServer(t, 1)
	user := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct{ body, field string }{
		{`{` + user + `,"service_tier":"auto"}`, "service_tier"},
		{`{"messages":[]}`, "messages"},
		{`{"messages":[{"role":"system","content":"hi"}]}`, "messages[0].role"},
		{`{"messages":[{"role":"user","content":"hi","name":"x"}]}`, "messages[0].name"},
		{`{"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "messages[0].content[0].type"},
		{`{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text"},
		{`{"messages":[{"role":"user","content":[{"type":"text","text":"a","citations":[]}]}]}`, "messages[0].content[0].citations"},
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":"x"}]}]}`, "messages[0].content[0].input"},
		{`{"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]}]}`, "messages[0].content[0]"},
		{`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image"}]}]}]}`, "messages[0].content[0].content[0].type"},
		{`{"messages":[{"role":"user","content":42}]}`, "messages[0].content"},
		{`{` + user + `,"system":[{"type":"image"}]}`, "system[0].type"},
		{`{` + user + `,"tools":[{"name":"f","input_schema":{},"strict":true}]}`, "tools[0].strict"},
		{`{` + user + `,"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools[0].type"},
		{`{` + user + `,"tools":[{"name":"f"}],"tool_choice":{"type":"sometimes"}}`, "tool_choice.type"},
		{`{` + user + `,"tools":[{"name":"f"}],"tool_choice":{"type":"tool"}}`, "tool_choice.name"},
		{`{` + user + `,"tools":[{"name":"f"}],"tool_choice":{"type":"tool","name":"g"}}`, "tool_choice"},
		{`{` + user + `,"thinking":{"type":"enabled","budget_tokens":-1},"max_tokens":2048}`, "thinking.budget_tokens"},
		{`{` + user + `,"thinking":{"type":"enabled","budget_tokens":10.5}}`, "field thinking.budget_tokens"},
		{`{` + user + `,"thinking":{"type":"enabled"}}`, "thinking.budget_tokens"},
		{`{` + user + `,"thinking":{"type":"sometimes"}}`, "thinking.type"},
		{`{` + user + `,"max_tokens":0}`, "max_tokens"},
		{`{` + user + `,"stop_sequences":["a","b","c","d","e"]}`, "stop_sequences"},
		{`{` + user + `,"temperature":-1}`, "temperature"},
		{`{` + user + `,"metadata":{"user_id":"u","x":1}}`, "metadata.x"},
	} {
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			rec := post(h, path, c.body)
			r := decodeReply(t, rec.Body.String())
			if path == "/v1/messages/count_tokens" && (strings.Contains(c.body, `"budget_tokens":-1`) || c.field == "temperature") {
				// counting renders the prompt only: what bounds or samples the reply is not read
				if rec.Code != 200 {
					t.Errorf("%s %s: %d %s", path, c.body, rec.Code, rec.Body)
				}
				continue
			}
			if rec.Code != 400 || r.Type != "error" || r.Error == nil || r.Error.Type != "invalid_request_error" || !strings.HasPrefix(r.Error.Message, c.field) {
				t.Errorf("%s %s: %d %s, want a 400 naming %s", path, c.body, rec.Code, rec.Body, c.field)
			}
		}
	}
	// The mock cannot parse a tool call out of its text: tools that may be
	// called are refused, saying so, in Anthropic's shape.
	rec := post(h, "/v1/messages", `{`+user+`,"tools":[{"name":"f","input_schema":{"type":"object"}}],"stream":true}`)
	r := decodeReply(t, rec.Body.String())
	if rec.Code != http.StatusNotImplemented || r.Type != "error" || r.Error == nil || !strings.Contains(r.Error.Message, "cannot constrain or parse a reply") {
		t.Errorf("tools on the mock: %d %s", rec.Code, rec.Body)
	}
	// tool_choice none: the tools only reach the template, which the mock can.
	if rec := post(h, "/v1/messages", `{`+user+`,"max_tokens":2,"tools":[{"name":"f"}],"tool_choice":{"type":"none"}}`); rec.Code != 200 {
		t.Errorf("tool_choice none: %d %s", rec.Code, rec.Body)
	}
	// The one slot is free: a request with id_slot 0 would wait otherwise.
	if rec := post(h, "/v1/chat/completions", `{"id_slot":0,"max_tokens":1,`+user+`}`); rec.Code != 200 {
		t.Errorf("after the refusals: %d %s", rec.Code, rec.Body)
	}
}

// TestMessagesToolUse: a round trip's next turn reaches the backend as the
// chat it converts to (assistant tool_calls with the thinking as reasoning,
// a tool message per tool_result, in order); the parsed reply comes back as
// thinking and tool_use blocks with their input objects and stop_reason
// tool_use, and streamed as thinking_delta and input_json_delta pieces that
// rebuild it.
func TestMessagesToolUse(t *testing.T) {
	m, info := loadMock(t, 1)
	got := &iface.DecodeRequest{}
	info.Capabilities = append(info.Capabilities, iface.CapOutput)
	_, h := serve(t, &parsingBackend{Backend: m, got: got}, info, nil)
	body := `{"max_tokens":64,"system":"sys","tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}},{"name":"get_time"}],` +
		`"tool_choice":{"type":"any","disable_parallel_tool_use":true},"stop_sequences":["END"],"messages":[` +
		`{"role":"user","content":"weather?"},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":""},{"type":"text","text":"checking"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}],"is_error":false},{"type":"text","text":"and the time?"}]}]`
	rec := post(h, "/v1/messages", body+`}`)
	r := decodeReply(t, rec.Body.String())
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	chat := got.Output.Chat
	if chat == nil || chat.ToolChoice != "required" || chat.ParallelToolCalls == nil || *chat.ParallelToolCalls || len(chat.Tools) != 2 ||
		!reflect.DeepEqual(got.Output.Stops, []string{"END"}) {
		t.Fatalf("backend got %+v", got.Output)
	}
	roles := []string{}
	for _, m := range chat.Messages {
		roles = append(roles, m.Role)
	}
	ms := chat.Messages
	if !reflect.DeepEqual(roles, []string{"system", "user", "assistant", "tool", "user"}) || ms[0].Content != "sys" ||
		ms[2].Content != "checking" || ms[2].ReasoningContent != "hm" || len(ms[2].ToolCalls) != 1 ||
		ms[2].ToolCalls[0].ID != "toolu_1" || ms[2].ToolCalls[0].Arguments != `{"city":"Paris"}` ||
		ms[3].ToolCallID != "toolu_1" || ms[3].Content != "sunny" || ms[4].Content != "and the time?" {
		t.Errorf("messages %+v", ms)
	}
	var tools []map[string]any
	for _, s := range chat.Tools {
		var tl map[string]any
		_ = json.Unmarshal([]byte(s), &tl)
		tools = append(tools, tl)
	}
	if fn := tools[0]["function"].(map[string]any); fn["name"] != "get_weather" || fn["description"] != "d" || fn["parameters"].(map[string]any)["type"] != "object" {
		t.Errorf("tools %v", tools)
	}
	if r.StopReason != "tool_use" || len(r.Content) != 3 || r.Content[0].Type != "thinking" || r.Content[0].Thinking != "need weather" ||
		r.Content[1].Type != "tool_use" || r.Content[1].ID != "call_a" || r.Content[1].Name != "get_weather" || string(r.Content[1].Input) != `{"city":"Paris"}` ||
		r.Content[2].Name != "get_time" || string(r.Content[2].Input) != `{"zone":"CET"}` {
		t.Errorf("reply %s", rec.Body)
	}
	// A named tool is OpenAI's named function.
	post(h, "/v1/messages", strings.Replace(body, `{"type":"any","disable_parallel_tool_use":true}`, `{"type":"tool","name":"get_time"}`, 1)+`}`)
	if c := got.Output.Chat; c.ToolChoice != "required" || c.ToolChoiceName != "get_time" || !*c.ParallelToolCalls {
		t.Errorf("named tool: %q %q %v", c.ToolChoice, c.ToolChoiceName, *c.ParallelToolCalls)
	}

	st := post(h, "/v1/messages", body+`,"stream":true}`)
	names, blocks, stop := reassemble(t, readEvents(t, st.Body.String()))
	if stop != "tool_use" || len(blocks) != 3 || blocks[0]["type"] != "thinking" || blocks[0]["thinking"] != "need weather" ||
		blocks[1]["type"] != "tool_use" || blocks[1]["id"] != "call_a" || blocks[1]["name"] != "get_weather" || blocks[1]["partial_json"] != `{"city":"Paris"}` ||
		blocks[2]["name"] != "get_time" || blocks[2]["partial_json"] != `{"zone":"CET"}` {
		t.Errorf("stream %v: %v %s\n%s", names, blocks, stop, st.Body)
	}
	if names[0] != "message_start" || names[len(names)-1] != "message_stop" || strings.Count(strings.Join(names, " "), "content_block_stop") != 3 {
		t.Errorf("events %v", names)
	}
}
