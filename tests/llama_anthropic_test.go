//go:build llama

package tests

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestLlamaAnthropicSDK runs tests/anthropic/client.mjs, the official
// Anthropic Node SDK, against /v1/messages on the llama plugin with a
// random-weight Qwen3 model carrying Qwen3's real tokenizer and chat
// template: a named tool call (tool_use with its input object), count_tokens
// of the same request, the tool_result and the next turn; a required call
// streamed and rebuilt by the SDK from the events; a tool_choice naming no
// tool raised as a 400 naming the field. It skips, saying what to install,
// only where node, the SDK (make anthropic-client) or the tokenizer (make
// tokenizers) is missing.
func TestLlamaAnthropicSDK(t *testing.T) {
	out, _ := runSDKClient(t, "Anthropic", "anthropic", "@anthropic-ai/sdk", "anthropic-client")
	type block struct {
		Type  string          `json:"type"`
		Text  *string         `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	type message struct {
		ID         string  `json:"id"`
		Type       string  `json:"type"`
		Role       string  `json:"role"`
		Content    []block `json:"content"`
		StopReason string  `json:"stop_reason"`
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			CacheRead    int `json:"cache_read_input_tokens"`
			OutputTokens int `json:"output_tokens"`
		} `json:"usage"`
	}
	var got struct {
		Call, Next message
		Count      struct {
			InputTokens int `json:"input_tokens"`
		}
		Stream struct {
			Events  []string `json:"events"`
			Message message  `json:"message"`
		}
		Bad struct {
			Status  int    `json:"status"`
			Type    string `json:"type"`
			Message string `json:"message"`
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client.mjs printed %s: %v", out, err)
	}
	for name, m := range map[string]message{"call": got.Call, "stream": got.Stream.Message} {
		var use *block
		for i := range m.Content {
			if m.Content[i].Type == "tool_use" {
				use = &m.Content[i]
				break
			}
		}
		if m.StopReason != "tool_use" || use == nil || m.Role != "assistant" || !strings.HasPrefix(m.ID, "msg_") {
			t.Errorf("%s: stop %q, no tool_use: %s", name, m.StopReason, out)
			continue
		}
		var in struct {
			City *string `json:"city"`
		}
		if use.ID == "" || use.Name != "get_weather" || json.Unmarshal(use.Input, &in) != nil || in.City == nil {
			t.Errorf("%s: tool_use %+v (input %s)", name, use, use.Input)
		}
		if m.Usage.OutputTokens == 0 || m.Usage.InputTokens+m.Usage.CacheRead == 0 {
			t.Errorf("%s: usage %+v", name, m.Usage)
		}
	}
	if u := got.Call.Usage; got.Count.InputTokens != u.InputTokens+u.CacheRead {
		t.Errorf("count_tokens %d, the call's prompt %d tokens (%+v)", got.Count.InputTokens, u.InputTokens+u.CacheRead, u)
	}
	ev := strings.Join(got.Stream.Events, " ")
	if !strings.HasPrefix(ev, "message_start content_block_start") || !strings.HasSuffix(ev, "message_delta message_stop") ||
		!strings.Contains(ev, "content_block_delta") || !strings.Contains(ev, "content_block_stop") {
		t.Errorf("stream events: %s", ev)
	}
	if n := got.Next; n.StopReason == "" || n.StopReason == "tool_use" || n.Usage.OutputTokens == 0 {
		t.Errorf("next turn: %+v", n)
	}
	if got.Bad.Status != 400 || got.Bad.Type != "invalid_request_error" || !strings.HasPrefix(got.Bad.Message, "tool_choice") {
		t.Errorf("unknown tool: %+v", got.Bad)
	}
	t.Logf("%s", out)
}
