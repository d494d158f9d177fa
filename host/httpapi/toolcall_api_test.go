package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/iface"
)

// parsingBackend is the mock that parses its replies: each decode sends
// deltas (reasoning, a call's name, its arguments in two pieces, a second
// call), then the final parse's, and keeps the request it got.
type parsingBackend struct {
	iface.Backend
	got *iface.DecodeRequest
}

var parsedDeltas = [][]iface.ChatDelta{
	{{Reasoning: "need weather", ToolCall: -1}},
	{},
	{{ToolCall: 0, ToolID: "call_a", ToolName: "get_weather", ToolArgs: `{"city":`}},
	{{ToolCall: 0, ToolArgs: `"Paris"}`}},
	{{ToolCall: 1, ToolID: "call_b", ToolName: "get_time", ToolArgs: `{"zone":"CET"}`}},
}

var parsedReply = iface.ChatReply{Reasoning: "need weather", ToolCalls: []iface.ToolCall{
	{ID: "call_a", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {ID: "call_b", Name: "get_time", Arguments: `{"zone":"CET"}`}}}

func (b parsingBackend) Info(ctx context.Context) (iface.BackendInfo, error) {
	i, err := b.Backend.Info(ctx)
	i.Capabilities = append(i.Capabilities, iface.CapOutput)
	return i, err
}

func (b parsingBackend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	*b.got = req
	for i, d := range parsedDeltas {
		if err := emit(iface.Token{ID: int32(i), Text: "x", Deltas: d}); err != nil {
			return iface.DecodeResult{}, err
		}
	}
	r := parsedReply
	return iface.DecodeResult{TokensGenerated: len(parsedDeltas), StopReason: "eos", Message: &r}, nil
}

func parsingServer(t *testing.T) (*iface.DecodeRequest, *parsingBackend, func(body string) (int, string)) {
	m, info := loadMock(t, 1)
	got := &iface.DecodeRequest{}
	b := &parsingBackend{Backend: m, got: got}
	info.Capabilities = append(info.Capabilities, iface.CapOutput)
	_, h := serve(t, b, info, nil)
	return got, b, func(body string) (int, string) {
		rec := post(h, "/v1/chat/completions", body)
		return rec.Code, rec.Body.String()
	}
}

const toolsJSON = `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}},` +
	`{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}]`

// TestToolCallsReply: a parsed reply's tool calls come back as OpenAI's
// message.tool_calls with finish_reason "tool_calls", and streamed as
// llama-server streams them: index, id, type and name first, then argument
// pieces; the request's tool choice, stops and schema reach the backend.
func TestToolCallsReply(t *testing.T) {
	got, _, call := parsingServer(t)
	body := `{"messages":[{"role":"user","content":"weather?"}],"tools":` + toolsJSON +
		`,"tool_choice":{"type":"function","function":{"name":"get_time"}},"parallel_tool_calls":false,"stop":["END"]`
	code, out := call(body + `}`)
	if code != 200 {
		t.Fatalf("%d %s", code, out)
	}
	var r struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Content          *string `json:"content"`
				ReasoningContent string  `json:"reasoning_content"`
				ToolCalls        []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("%v: %s", err, out)
	}
	ch := r.Choices[0]
	if ch.FinishReason != "tool_calls" || ch.Message.ReasoningContent != "need weather" || len(ch.Message.ToolCalls) != 2 {
		t.Fatalf("reply %s", out)
	}
	for i, c := range ch.Message.ToolCalls {
		w := parsedReply.ToolCalls[i]
		if c.ID != w.ID || c.Type != "function" || c.Function.Name != w.Name || c.Function.Arguments != w.Arguments {
			t.Errorf("call %d: %+v, want %+v", i, c, w)
		}
	}
	o := got.Output
	if o == nil || o.Chat == nil || o.Chat.ToolChoice != "required" || o.Chat.ToolChoiceName != "get_time" ||
		o.Chat.ParallelToolCalls == nil || *o.Chat.ParallelToolCalls || !slices.Equal(o.Stops, []string{"END"}) || len(o.Chat.Tools) != 2 {
		t.Fatalf("the backend got output %+v", o)
	}

	// Streamed: the chunks' tool call pieces, as the SDK reassembles them.
	code, out = call(body + `,"stream":true}`)
	if code != 200 {
		t.Fatalf("stream: %d %s", code, out)
	}
	type piece struct {
		Index    *int   `json:"index"`
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function *struct {
			Name      string  `json:"name"`
			Arguments *string `json:"arguments"`
		} `json:"function"`
	}
	var pieces []piece
	var reasoning, finish string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
				Delta        struct {
					ReasoningContent string  `json:"reasoning_content"`
					ToolCalls        []piece `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil || len(ev.Choices) != 1 {
			t.Fatalf("chunk %s: %v", data, err)
		}
		d := ev.Choices[0]
		reasoning += d.Delta.ReasoningContent
		pieces = append(pieces, d.Delta.ToolCalls...)
		if d.FinishReason != nil {
			finish = *d.FinishReason
		}
	}
	if finish != "tool_calls" || reasoning != "need weather" || len(pieces) != 3 {
		t.Fatalf("streamed finish %q reasoning %q, %d tool call pieces: %s", finish, reasoning, len(pieces), out)
	}
	first := pieces[0]
	if *first.Index != 0 || first.ID != "call_a" || first.Type != "function" || first.Function.Name != "get_weather" || *first.Function.Arguments != `{"city":` {
		t.Errorf("first piece %+v", first)
	}
	if p := pieces[1]; *p.Index != 0 || p.ID != "" || p.Type != "" || p.Function.Name != "" || *p.Function.Arguments != `"Paris"}` {
		t.Errorf("second piece %+v", p)
	}
	if p := pieces[2]; *p.Index != 1 || p.ID != "call_b" || p.Function.Name != "get_time" {
		t.Errorf("third piece %+v", p)
	}
}

// TestOutputFields: response_format, json_schema and grammar reach the
// backend as its Output (chat parsed, text not), and a body that asks the
// impossible is a 400 naming the field.
func TestOutputFields(t *testing.T) {
	got, _, call := parsingServer(t)
	msgs := `{"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		body   string
		schema string
	}{
		{`,"response_format":{"type":"json_object"}}`, `{"type":"object"}`},
		{`,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string"},"strict":true}}}`, `{"type":"string"}`},
		{`,"json_schema":{"type":"integer"}}`, `{"type":"integer"}`},
	} {
		if code, out := call(msgs + c.body); code != 200 {
			t.Fatalf("%s: %d %s", c.body, code, out)
		}
		if got.Output == nil || got.Output.JSONSchema != c.schema || got.Output.Chat == nil {
			t.Errorf("%s: output %+v", c.body, got.Output)
		}
	}
	if code, out := call(msgs + `,"response_format":{"type":"text"}}`); code != 200 || got.Output != nil {
		t.Errorf("text format: %d %s, output %+v", code, out, got.Output)
	}
	for _, c := range []struct{ body, param string }{
		{`,"response_format":{"type":"xml"}}`, "response_format.type"},
		{`,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}`, "response_format.json_schema.schema"},
		{`,"json_schema":"{}"}`, "json_schema"},
		{`,"json_schema":{},"grammar":"root ::= \"a\""}`, "grammar"},
		{`,"tools":[{"type":"function"}]}`, "tools[0]"},
		{`,"tools":[{"type":"retrieval","function":{"name":"x"}}]}`, "tools[0]"},
		{`,"tools":` + toolsJSON + `,"tool_choice":"sometimes"}`, "tool_choice"},
		{`,"tools":` + toolsJSON + `,"tool_choice":{"type":"function","function":{"name":"nope"}}}`, "tool_choice"},
		{`,"tool_choice":"required"}`, "tool_choice"},
		{`,"chat_template_kwargs":[1]}`, "chat_template_kwargs"},
	} {
		code, out := call(msgs + c.body)
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		if code != 400 || json.Unmarshal([]byte(out), &e) != nil || e.Error.Param != c.param {
			t.Errorf("%s: %d %s, want a 400 naming %s", c.body, code, out, c.param)
		}
	}
	// A backend that cannot honour them says so before taking a slot.
	_, h := newTestServer(t, 1)
	for _, body := range []string{msgs + `,"json_schema":{}}`, msgs + `,"tools":` + toolsJSON + `}`} {
		if rec := post(h, "/v1/chat/completions", body); rec.Code != 501 || !strings.Contains(rec.Body.String(), "cannot constrain or parse") {
			t.Errorf("mock, %s: %d %s", body, rec.Code, rec.Body)
		}
	}
	if rec := post(h, "/v1/chat/completions", msgs+`,"tools":`+toolsJSON+`,"tool_choice":"none","max_tokens":2}`); rec.Code != 200 {
		t.Errorf("mock, tool_choice none: %d %s", rec.Code, rec.Body)
	}
}

// TestPrefillMatchesChat: RPC PREFILL and the HTTP chat completion read one
// body into one prompt request, whatever it carries (tools, tool choice,
// kwargs, multi-turn tool calls and results): the backend tokenizes the
// same request to the same tokens, so a P/D split reuses the prefilled cells.
func TestPrefillMatchesChat(t *testing.T) {
	_, info := loadMock(t, 1)
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"weather?"},` +
		`{"role":"assistant","content":null,"reasoning_content":"look it up","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","name":"get_weather","content":"sunny"},{"role":"user","content":[{"type":"text","text":"and "},{"type":"text","text":"time?"}]}],` +
		`"tools":` + toolsJSON + `,"tool_choice":"auto","parallel_tool_calls":true,"chat_template_kwargs":{"enable_thinking":false},` +
		`"response_format":{"type":"json_object"},"temperature":0.3}`
	info.Capabilities = append(info.Capabilities, iface.CapOutput)
	c, err := request.Parse([]byte(body), true, iface.SamplerParams{}, 16, info)
	if err != nil {
		t.Fatal(err)
	}
	rpc, err := host.ParsePrefill([]byte(body), 0, info)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Prefill, rpc) {
		t.Fatalf("HTTP renders from %+v,\nPREFILL from %+v", c.Prefill, rpc)
	}
	if len(rpc.Tools) != 2 || rpc.TemplateKwargs == "" || rpc.ParallelToolCalls == nil || len(rpc.Messages[2].ToolCalls) != 1 {
		t.Fatalf("the prompt request lost fields: %+v", rpc)
	}
}

// TestTopLogprobsFlat: a chat reply's top_logprobs entries are tokens
// without alternatives of their own, as OpenAI sends them.
func TestTopLogprobsFlat(t *testing.T) {
	_, h := newTestServer(t, 1)
	rec := post(h, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"logprobs":true,"top_logprobs":2}`)
	var r struct {
		Choices []struct {
			Logprobs struct {
				Content []struct {
					Token       string                       `json:"token"`
					TopLogprobs []map[string]json.RawMessage `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || len(r.Choices) != 1 || len(r.Choices[0].Logprobs.Content) == 0 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	for _, e := range r.Choices[0].Logprobs.Content {
		if len(e.TopLogprobs) != 2 {
			t.Fatalf("entry %q has %d alternatives: %s", e.Token, len(e.TopLogprobs), rec.Body)
		}
		for _, alt := range e.TopLogprobs {
			if _, nested := alt["top_logprobs"]; nested || alt["token"] == nil || alt["logprob"] == nil || alt["bytes"] == nil {
				t.Fatalf("alternative %v of %q", alt, e.Token)
			}
		}
	}
}

// TestUnknownPathsJSON: GET / and paths no route serves answer a JSON 404
// in llama-server's shape.
func TestUnknownPathsJSON(t *testing.T) {
	_, h := newTestServer(t, 1)
	for _, c := range []struct{ method, path string }{{"GET", "/"}, {"GET", "/nope"}, {"POST", "/lora-adapters"}, {"POST", "/v1/audio/transcriptions"}} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, strings.NewReader("{}")))
		var e struct {
			Error struct {
				Code int    `json:"code"`
				Type string `json:"type"`
			} `json:"error"`
		}
		if rec.Code != 404 || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != 404 || e.Error.Type != "not_found_error" {
			t.Errorf("%s %s: %d %s", c.method, c.path, rec.Code, rec.Body)
		}
	}
	if rec := post(h, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1}`); rec.Code != 200 {
		t.Errorf("a route behind the catch-all: %d %s", rec.Code, rec.Body)
	}
}

// stayingSwitcher is a router whose other models never load (a test's
// switcher: the names are what is checked).
type stayingSwitcher struct{ names []string }

func (s stayingSwitcher) Models() []string                           { return s.names }
func (s stayingSwitcher) Switch(ctx context.Context, _ string) error { return nil }
func (s stayingSwitcher) Unload(ctx context.Context) error           { return nil }

// TestRouterModelNotFound: in router mode a model the engine does not
// serve is OpenAI's 404 model_not_found naming the field; with one model,
// any name is answered and the reply names the model that answered.
func TestRouterModelNotFound(t *testing.T) {
	s, h := newTestServer(t, 1)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}],"max_tokens":1}`
	rec := post(h, "/v1/chat/completions", body)
	var r struct {
		Model string `json:"model"`
	}
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &r) != nil || r.Model != "mock" {
		t.Fatalf("one model: %d %s", rec.Code, rec.Body)
	}
	s.SetModelSwitcher(stayingSwitcher{names: []string{"mock", "other"}})
	rec = post(h, "/v1/chat/completions", body)
	var e struct {
		Error struct {
			Code  string `json:"code"`
			Param string `json:"param"`
		} `json:"error"`
	}
	if rec.Code != 404 || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != "model_not_found" || e.Error.Param != "model" {
		t.Fatalf("router, unknown model: %d %s", rec.Code, rec.Body)
	}
	if rec := post(h, "/v1/chat/completions", strings.Replace(body, "gpt-4o", "mock", 1)); rec.Code != 200 {
		t.Fatalf("router, the resident model: %d %s", rec.Code, rec.Body)
	}
}

// TestErrorParam: a 400's param names the field at fault; max_tokens -1 is
// llama-server's n_predict -1 (no limit), other negatives are refused.
func TestErrorParam(t *testing.T) {
	_, info := loadMock(t, 1)
	for body, param := range map[string]any{
		`{"prompt":"a","max_tokens":-2}`:              "max_tokens",
		`{"prompt":"a","n_predict":-3}`:               "n_predict",
		`{"prompt":"a","n_keep":-2}`:                  "n_keep",
		`{"prompt":"a","logit_bias":{"x":1}}`:         "logit_bias",
		`{"prompt":"a","id_slot":-5}`:                 "id_slot",
		`{"prompt":"a","stop":["1","2","3","4","5"]}`: "stop",
		`{"prompt":"a","top_logprobs":99}`:            "top_logprobs",
		`{"prompt":"a","n":2}`:                        "n",
		`{"prompt":"a","temperature":-1}`:             "temperature",
		`{"prompt":[]}`:                               "prompt",
		`[1]`:                                         nil,
	} {
		_, err := request.Parse([]byte(body), false, iface.SamplerParams{}, 16, info)
		e, ok := err.(*apiError)
		if !ok || e.Status != 400 || e.Param != param {
			t.Errorf("%s: %v (param %v), want a 400 naming %v", body, err, e.Param, param)
		}
	}
	c, err := request.Parse([]byte(`{"prompt":"a","max_tokens":-1}`), false, iface.SamplerParams{}, 16, info)
	if err != nil || c.NPredict != -1 {
		t.Errorf("max_tokens -1: %v, n_predict %d", err, c.NPredict)
	}
}
