package responses

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/request/requesttest"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// TestConvertInputItems: input items reach the backend as the chat
// llama-server converts them to: messages of input_text parts, an
// assistant's output_text, reasoning and function_call items merged into
// one assistant message, function_call_output a tool message.
func TestConvertInputItems(t *testing.T) {
	cases := []struct {
		input string
		want  []map[string]any
	}{
		{`[{"role":"developer","content":"rules"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]`,
			[]map[string]any{{"role": "developer", "content": "rules"}, {"role": "user", "content": "ab"}}},
		{`[{"role":"user","content":"weather?"},` +
			`{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"look it up"}],"encrypted_content":"","status":"completed"},` +
			`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"checking","annotations":[],"logprobs":[]}]},` +
			`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}","status":"completed"},` +
			`{"type":"function_call_output","call_id":"call_1","output":[{"type":"input_text","text":"sunny"}]},` +
			`{"role":"assistant","content":"It is sunny."}]`,
			[]map[string]any{{"role": "user", "content": "weather?"},
				{"role": "assistant", "content": "checking", "reasoning_content": "look it up", "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
					"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
				{"role": "tool", "tool_call_id": "call_1", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}}},
		{`[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}]`,
			[]map[string]any{{"role": "assistant", "tool_calls": []any{map[string]any{"id": "c", "type": "function",
				"function": map[string]any{"name": "f", "arguments": "{}"}}}}, {"role": "tool", "tool_call_id": "c", "content": "ok"}}},
	}
	for _, c := range cases {
		chat, _, err := Convert([]byte(`{"input":` + c.input + `}`))
		if err != nil {
			t.Fatalf("%s: %v", c.input, err)
		}
		got := requesttest.ChatJSON(t, chat)["messages"]
		if want := requesttest.Empty(normalize(t, c.want)); !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", c.input, got, c.want)
		}
	}
}

// normalize is v as JSON decodes it.
func normalize(t *testing.T, v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// TestConvertFields: the rest of the body as the chat completion body
// it runs as: function tools under function with strict true where not
// given, a named tool_choice as the chat's, max_output_tokens as max_tokens,
// reasoning.effort as the template's variables, text.format as
// response_format, llama-server's own sampling fields passed on.
func TestConvertFields(t *testing.T) {
	body := `{"input":"x","tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object"}},` +
		`{"type":"function","name":"g","strict":false}],"tool_choice":{"type":"function","name":"g"},"parallel_tool_calls":false,` +
		`"max_output_tokens":5,"temperature":0.5,"top_k":3,"seed":7,"reasoning":{"effort":"high"},"chat_template_kwargs":{"a":1},` +
		`"text":{"format":{"type":"json_schema","name":"p","schema":{"type":"object"},"strict":true},"verbosity":"medium"},"stream":true}`
	chat, _, err := Convert([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	got := requesttest.ChatJSON(t, chat)
	delete(got, "messages")
	want := map[string]any{"stream": true, "max_tokens": 5.0, "temperature": 0.5, "top_k": 3.0, "seed": 7.0, "parallel_tool_calls": false,
		"reasoning_effort": "high", "chat_template_kwargs": map[string]any{"a": 1.0},
		"tools": []any{
			map[string]any{"type": "function", "function": map[string]any{"name": "f", "description": "d", "parameters": map[string]any{"type": "object"}, "strict": true}},
			map[string]any{"type": "function", "function": map[string]any{"name": "g", "strict": false}}},
		"tool_choice":     map[string]any{"type": "function", "function": map[string]any{"name": "g"}},
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p", "schema": map[string]any{"type": "object"}, "strict": true}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("converted\n %v\nwant %v", got, want)
	}
	chat, _, err = Convert([]byte(`{"input":"x","tool_choice":"required","text":{"format":{"type":"json_object"}},"reasoning_budget_tokens":4}`))
	got = requesttest.ChatJSON(t, chat)
	if err != nil || got["tool_choice"] != "required" || !reflect.DeepEqual(got["response_format"], map[string]any{"type": "json_object"}) ||
		got["reasoning_budget_tokens"] != 4.0 {
		t.Errorf("required, json_object, a budget: %v %v", got, err)
	}
}

// TestConvertRefusals: a body the engine cannot honour is a 400 whose
// message and param name the field at fault.
func TestConvertRefusals(t *testing.T) {
	for _, c := range []struct{ body, err, param string }{
		{`{}`, "input is required", "input"},
		{`{"input":[]}`, "input must not be empty", "input"},
		{`{"input":42}`, "input must be a string or an array of input items", "input"},
		{`{"input":"x","service_tier":"flex"}`, "service_tier is not supported by this engine", "service_tier"},
		{`{"input":"x","max_output_tokens":0}`, "max_output_tokens must be at least 1, got 0", "max_output_tokens"},
		{`{"input":"x","instructions":["a"]}`, "field instructions: expected a string, got an array", "instructions"},
		{`{"input":"x","store":true}`, "store true is not supported: this engine keeps no responses (send false or leave it out)", "store"},
		{`{"input":"x","tools":[{"type":"web_search"}]}`, `tools[0].type "web_search" is not supported: only function tools are`, "tools[0].type"},
		{`{"input":[{"role":"tool","content":"x"}]}`, `input[0].role must be "user", "system", "developer" or "assistant", got "tool"`, "input[0].role"},
		{`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`,
			`input[0].content[0].type "input_image" is not supported: this engine's models read text only (input_text are)`, "input[0].content[0].type"},
		{`{"input":[{"type":"function_call","call_id":"c","name":"f"}]}`, "input[0]: a function_call item needs call_id, name and arguments (strings)", "input[0]"},
		{`{"input":"x","reasoning":{"effort":"max"}}`, "reasoning.effort must be one of none, minimal, low, medium, high, xhigh, got \"max\"", "reasoning.effort"},
		{`{"input":"x","text":{"format":{"type":"json_schema","name":"p"}}}`, "text.format.schema must be a JSON schema object", "text.format.schema"},
	} {
		_, _, err := Convert([]byte(c.body))
		var e *run.Error
		if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Msg != c.err || e.Param != c.param {
			t.Errorf("%s: %#v, want 400 %q (param %s)", c.body, err, c.err, c.param)
		}
	}
}
