//go:build llama

package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
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

// TestLlamaAnthropicThinkingBudget runs tests/anthropic/thinking.mjs, the
// Anthropic SDK, against the llama plugin with the random-weight Qwen3
// model under a Qwen3 template that opens the reasoning in the generation
// prompt (as Qwen3's thinking models' do), so that every reply reasons until
// something ends it: thinking.budget_tokens N ends it after N tokens and the
// reply goes on as text, streamed as at most N thinking deltas before the
// text's; budget 0 has no thinking; a budget max_tokens reaches first leaves
// it all thinking; a negative or fractional budget is a 400 naming the
// field.
func TestLlamaAnthropicThinkingBudget(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "bin", "tokenizers", "qwen3", "tokenizer_config.json"))
	if err != nil {
		t.Skipf("no Qwen3 tokenizer: %v (make tokenizers)", err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	const gen = `{{- '<|im_start|>assistant\n' }}`
	if !strings.Contains(cfg.ChatTemplate, gen) {
		t.Fatalf("the Qwen3 template has no generation prompt %s", gen)
	}
	tmpl := filepath.Join(t.TempDir(), "qwen3-thinking.jinja")
	if err := os.WriteFile(tmpl, []byte(strings.Replace(cfg.ChatTemplate, gen, `{{- '<|im_start|>assistant\n<think>\n' }}`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := runSDKScript(t, "Anthropic", "anthropic", "@anthropic-ai/sdk", "anthropic-client", "thinking.mjs",
		"--backend-opt", "chat_template_file="+tmpl)
	type block struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		Thinking string `json:"thinking"`
	}
	type message struct {
		Content    []block `json:"content"`
		StopReason string  `json:"stop_reason"`
	}
	type stream struct {
		Deltas  []string `json:"deltas"`
		Message message  `json:"message"`
	}
	var got struct {
		Budget, Unbounded message
		Five, Zero        stream
		Bad               []struct {
			Status  int    `json:"status"`
			Type    string `json:"type"`
			Message string `json:"message"`
		}
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("thinking.mjs printed %s: %v", out, err)
	}
	// parts is a message's thinking and text.
	parts := func(m message) (thinking, text string) {
		for _, b := range m.Content {
			thinking += b.Thinking
			text += b.Text
		}
		return thinking, text
	}
	if th, tx := parts(got.Budget); th == "" || tx == "" {
		t.Errorf("budget 8: thinking %q, text %q: want both", th, tx)
	}
	if th, tx := parts(got.Unbounded); th == "" || tx != "" {
		t.Errorf("budget past max_tokens: thinking %q, text %q: want thinking alone", th, tx)
	}
	if th, tx := parts(got.Zero.Message); th != "" || tx == "" || slices.Contains(got.Zero.Deltas, "thinking_delta") {
		t.Errorf("budget 0: thinking %q, text %q, deltas %v: want text alone", th, tx, got.Zero.Deltas)
	}
	d := got.Five.Deltas
	n := 0
	for n < len(d) && d[n] == "thinking_delta" {
		n++
	}
	if n == 0 || n > 5 || !slices.Contains(d[n:], "text_delta") || slices.Contains(d[n:], "thinking_delta") {
		t.Errorf("budget 5: deltas %v: want 1 to 5 thinking deltas, then text", d)
	}
	if th, tx := parts(got.Five.Message); th == "" || tx == "" {
		t.Errorf("budget 5: the SDK rebuilt thinking %q, text %q", th, tx)
	}
	if len(got.Bad) != 2 {
		t.Fatalf("bad budgets: %+v", got.Bad)
	}
	for i, want := range []string{"thinking.budget_tokens", "field thinking.budget_tokens"} {
		if b := got.Bad[i]; b.Status != 400 || b.Type != "invalid_request_error" || !strings.HasPrefix(b.Message, want) {
			t.Errorf("bad budget %d: %+v, want a 400 naming %s", i, b, want)
		}
	}
	t.Logf("%s", out)
}
