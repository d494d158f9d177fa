package anthropic

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/request/requesttest"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// TestConvert: a Messages body becomes the chat it runs as (compared as the
// chat completion body it stands for), or a 400 naming what is wrong,
// without anything else to ask.
func TestConvert(t *testing.T) {
	for _, c := range []struct {
		name     string
		body     string
		counting bool
		want     string // the chat body, as JSON
		err      string // or the refusal's message
		param    any    // and its param
	}{{
		name: "text",
		body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		want: `{"model":"m","stream":false,"max_tokens":4096,"messages":[{"role":"user","content":"hi"}]}`,
	}, {
		name: "system blocks, stops and sampling",
		body: `{"max_tokens":8,"stream":true,"system":[{"type":"text","text":"Be "},{"type":"text","text":"brief."}],` +
			`"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],` +
			`"stop_sequences":["END"],"temperature":0.5,"top_k":3}`,
		want: `{"stream":true,"max_tokens":8,"stop":["END"],"temperature":0.5,"top_k":3,` +
			`"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]}`,
	}, {
		name: "tool use and results",
		body: `{"max_tokens":8,"messages":[{"role":"user","content":"weather?"},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"look it up","signature":""},{"type":"text","text":"Let me see."},` +
			`{"type":"tool_use","id":"t1","name":"get_weather","input":{"city":"Paris"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"thanks"}]}],` +
			`"tools":[{"name":"get_weather","description":"the weather","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}}`,
		want: `{"stream":false,"max_tokens":8,"messages":[{"role":"user","content":"weather?"},` +
			`{"role":"assistant","content":"Let me see.","reasoning_content":"look it up","tool_calls":[{"id":"t1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
			`{"role":"tool","tool_call_id":"t1","content":"sunny"},{"role":"user","content":"thanks"}],` +
			`"tools":[{"type":"function","function":{"name":"get_weather","description":"the weather","parameters":{"type":"object"}}}],` +
			`"tool_choice":"required","parallel_tool_calls":true}`,
	}, {
		name: "a named tool, one call at a time",
		body: `{"max_tokens":8,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f"}],` +
			`"tool_choice":{"type":"tool","name":"f","disable_parallel_tool_use":true}}`,
		want: `{"stream":false,"max_tokens":8,"messages":[{"role":"user","content":"hi"}],` +
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],` +
			`"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false}`,
	}, {
		name: "thinking with a budget",
		body: `{"max_tokens":8,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":100},"chat_template_kwargs":{"x":1}}`,
		want: `{"stream":false,"max_tokens":8,"messages":[{"role":"user","content":"hi"}],"thinking_budget_tokens":100,` +
			`"chat_template_kwargs":{"x":1,"enable_thinking":true}}`,
	}, {
		name:     "counting takes no budget",
		body:     `{"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":-5}}`,
		counting: true,
		want:     `{"stream":false,"max_tokens":4096,"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":true}}`,
	}, {
		name: "unknown field", body: `{"messages":[{"role":"user","content":"hi"}],"service_tier":"auto"}`,
		err: "service_tier is not supported by this engine", param: "service_tier",
	}, {
		name: "unknown nested field", body: `{"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","strict":true}]}`,
		err: "tools[0].strict is not supported by this engine", param: "tools[0].strict",
	}, {
		name: "no messages", body: `{"messages":[]}`,
		err: "messages must be a non-empty array", param: "messages",
	}, {
		name: "bad max_tokens", body: `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`,
		err: "max_tokens must be at least 1, got 0", param: "max_tokens",
	}, {
		name: "wrong type", body: `{"messages":[{"role":"user","content":"hi"}],"max_tokens":"8"}`,
		err: "field max_tokens: expected an integer, got a string", param: "max_tokens",
	}, {
		name: "system role in messages", body: `{"messages":[{"role":"system","content":"hi"}]}`,
		err: `messages[0].role must be "user" or "assistant", got "system"`, param: "messages[0].role",
	}, {
		name: "image block", body: `{"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`,
		err: `messages[0].content[0].type "image" is not supported (text, thinking, tool_use and tool_result are)`, param: "messages[0].content[0].type",
	}, {
		name: "tool_result from the assistant", body: `{"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]}]}`,
		err: "messages[0].content[0]: a tool_result block cannot be in a assistant message", param: "messages[0].content[0]",
	}, {
		name: "thinking without a budget", body: `{"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled"}}`,
		err: `thinking.budget_tokens is required with type "enabled"`,
	}, {
		name: "a tool choice without its name", body: `{"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"tool"}}`,
		err: `tool_choice.name is required with type "tool"`, param: "tool_choice.name",
	}, {
		name: "too many stop sequences", body: `{"messages":[{"role":"user","content":"hi"}],"stop_sequences":["a","b","c","d","e"]}`,
		err: "stop_sequences takes at most 4 strings here, got 5",
	}, {
		name: "messages not an array", body: `{"messages":"hi"}`,
		err: "messages must be an array", param: "messages",
	}, {
		name: "a body that is no object", body: `[1]`,
		err: "request body must be a JSON object",
	}, {
		name: "a field that is no object", body: `{"messages":[{"role":"user","content":"hi"}],"metadata":[1]}`,
		err: "metadata must be a JSON object",
	}} {
		t.Run(c.name, func(t *testing.T) {
			got, _, err := Convert([]byte(c.body), c.counting)
			if c.err != "" {
				var e *run.Error
				if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Msg != c.err || e.Param != c.param {
					t.Fatalf("error %#v, want 400 %q (param %v)", err, c.err, c.param)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var w any
			if err := json.Unmarshal([]byte(c.want), &w); err != nil {
				t.Fatal(err)
			}
			if g := requesttest.ChatJSON(t, got); !reflect.DeepEqual(g, requesttest.Empty(w)) {
				t.Errorf("got  %v\nwant %s", g, c.want)
			}
		})
	}
}
