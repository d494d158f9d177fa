package cudallama

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// TestRequiredGrammar: a required call's grammar is the lazy grammar with
// its root cut to the first alternative, the template's tool-call rule; a
// root that is no rule name is left as it is.
func TestRequiredGrammar(t *testing.T) {
	lazy := "space ::= \" \"?\nroot ::= tool-call | tool-calls\ntool-call ::= \"<tool_call>\" space\ntool-calls ::= (tool-call? space)+"
	got := requiredGrammar(lazy)
	want := "space ::= \" \"?\nroot ::= tool-call\ntool-call ::= \"<tool_call>\" space\ntool-calls ::= (tool-call? space)+"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	for _, g := range []string{"root ::= \"[\" call \"]\"", "root ::= (a | b)"} {
		if got := requiredGrammar(g); got != g {
			t.Errorf("%q became %q", g, got)
		}
	}
}

// TestChatGrammar: llama-server's sampler grammar from an apply result:
// a non-lazy grammar starts after the generation prompt, a lazy one waits
// for its triggers; a required call's lazy grammar starts at once.
func TestChatGrammar(t *testing.T) {
	trig := []grammarTrigger{{Type: 1, Value: "<tool_call>"}}
	p := chatParams{Grammar: "root ::= x", GrammarLazy: true, Triggers: trig, GenerationPrompt: "<|im_start|>assistant\n"}
	if g := chatGrammar(p, false); !g.Lazy || g.Prefill != "" || len(g.Triggers) != 1 {
		t.Errorf("lazy: %+v", g)
	}
	if g := chatGrammar(p, true); g.Lazy || g.Prefill != "" || g.Triggers != nil {
		t.Errorf("required: %+v", g)
	}
	p.GrammarLazy, p.Triggers = false, nil
	if g := chatGrammar(p, false); g.Lazy || g.Prefill != p.GenerationPrompt {
		t.Errorf("non-lazy: %+v", g)
	}
	if chatGrammar(chatParams{}, true) != nil {
		t.Error("no grammar became one")
	}
}

// TestReasoningBudgetSpec: a budget's sampler is built where the format
// has thinking tags, from the request's budget, or unbounded for a lazy
// grammar (which it keeps asleep in the reasoning), as common_sampler_init.
func TestReasoningBudgetSpec(t *testing.T) {
	p := chatParams{ThinkingStart: "<think>", ThinkingEnds: []string{"</think>", "<tool_call>"}, GenerationPrompt: "<|im_start|>assistant\n"}
	b := &iface.ReasoningBudget{Tokens: 0, Message: "Done."}
	lazy := &grammarSpec{Grammar: "root ::= x", Lazy: true}
	want := budgetSpec{Start: "<think>", Ends: p.ThinkingEnds, Message: "Done.", Budget: 0, Prefill: p.GenerationPrompt}
	if got := reasoningBudget(p, b, nil); got == nil || !reflect.DeepEqual(*got, want) {
		t.Errorf("budget 0: %+v, want %+v", got, want)
	}
	if got := reasoningBudget(p, nil, lazy); got == nil || got.Budget >= 0 || got.Message != "" {
		t.Errorf("lazy grammar, no budget: %+v, want an unbounded one", got)
	}
	for name, g := range map[string]*grammarSpec{"none": nil, "not lazy": {Grammar: "root ::= x"}} {
		if got := reasoningBudget(p, nil, g); got != nil {
			t.Errorf("no budget, grammar %s: %+v", name, got)
		}
	}
	for name, q := range map[string]chatParams{"no tags": {}, "no end tag": {ThinkingStart: "<think>", ThinkingEnds: []string{""}},
		"no start tag": {ThinkingEnds: []string{"</think>"}}} {
		if got := reasoningBudget(q, b, lazy); got != nil {
			t.Errorf("%s: %+v", name, got)
		}
	}
}

// TestCommonChatRequest: the apply request in llama-server's field names; a
// named choice keeps its tool alone, and one naming no tool is refused.
func TestCommonChatRequest(t *testing.T) {
	yes := true
	p := iface.PrefillRequest{Messages: []iface.Message{{Role: "user", Content: "hi"},
		{Role: "assistant", ToolCalls: []iface.ToolCall{{ID: "c", Name: "f", Arguments: `{"a":1}`}}},
		{Role: "tool", ToolCallID: "c", Name: "f", Content: "ok"}},
		Tools:             []string{`{"type":"function","function":{"name":"f"}}`, `{"type":"function","function":{"name":"g"}}`},
		ToolChoiceName:    "g",
		ParallelToolCalls: &yes}
	b, err := newCommonChatRequest(p, toolChoice(p), map[string]any{"enable_thinking": false}, &iface.Output{JSONSchema: `{"type":"object"}`})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"messages": []any{map[string]any{"role": "user", "content": "hi"},
			map[string]any{"role": "assistant", "content": "", "tool_calls": []any{map[string]any{"id": "c", "type": "function",
				"function": map[string]any{"name": "f", "arguments": `{"a":1}`}}}},
			map[string]any{"role": "tool", "content": "ok", "tool_call_id": "c", "name": "f"}},
		"tools":                []any{map[string]any{"type": "function", "function": map[string]any{"name": "g"}}},
		"tool_choice":          "required",
		"parallel_tool_calls":  true,
		"json_schema":          map[string]any{"type": "object"},
		"chat_template_kwargs": map[string]any{"enable_thinking": false},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %s", b)
	}
	p.ToolChoiceName = "h"
	if _, err := newCommonChatRequest(p, toolChoice(p), nil, nil); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), `"h"`) {
		t.Errorf("unknown name: %v", err)
	}
	for in, want := range map[string]string{"": "auto", "none": "none", "required": "required", "auto": "auto"} {
		if got := toolChoice(iface.PrefillRequest{ToolChoice: in}); got != want {
			t.Errorf("tool_choice %q: %q", in, got)
		}
	}
}

// TestGenericCalls: a template without tool calls of its own gets
// {"name","arguments"} objects, one or an array, read back into calls.
func TestGenericCalls(t *testing.T) {
	tools := []string{`{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}`,
		`{"type":"function","function":{"name":"g"}}`}
	s, err := genericCallSchema(tools, false)
	if err != nil || !strings.Contains(s, `"const":"f"`) || !strings.Contains(s, `"arguments":{"type":"object"}`) || strings.Contains(s, `"array"`) {
		t.Errorf("schema %s, %v", s, err)
	}
	if s, _ := genericCallSchema(tools, true); !strings.HasPrefix(s, `{"items":`) || !strings.Contains(s, `"minItems":1`) {
		t.Errorf("parallel schema %s", s)
	}
	if _, err := genericCallSchema([]string{`{"type":"function"}`}, false); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("a tool without a name: %v", err)
	}
	n := 0
	id := func() string { n++; return string(rune('0' + n)) }
	calls, err := genericCalls(` {"name":"f","arguments":{"a":1}} `, id)
	if err != nil || !reflect.DeepEqual(calls, []iface.ToolCall{{ID: "1", Name: "f", Arguments: `{"a":1}`}}) {
		t.Errorf("one call: %+v, %v", calls, err)
	}
	calls, err = genericCalls(`[{"name":"f","arguments":{}},{"name":"g","arguments":{"b":"x"}}]`, id)
	if err != nil || len(calls) != 2 || calls[1] != (iface.ToolCall{ID: "3", Name: "g", Arguments: `{"b":"x"}`}) {
		t.Errorf("two calls: %+v, %v", calls, err)
	}
	if _, err := genericCalls(`{"name":"f","argu`, id); err == nil {
		t.Error("a cut call parsed")
	}
	if c := newToolCallID(); len(c) != 32 || c == newToolCallID() {
		t.Errorf("tool call id %q", c)
	}
}

// TestReplyText: the parser reads text cut at the first stop (the request's
// or the template's), never a split character, and invalid bytes as U+FFFD.
func TestReplyText(t *testing.T) {
	r := newReplyText([]string{"END"}, []string{"", "<|im_end|>"})
	var got []string
	for _, p := range []string{"ab\xc3", "\xa9<|im", "_end|>tail"} {
		out, stopped := r.push(p)
		got = append(got, out)
		if stopped != (p == "_end|>tail") {
			t.Errorf("%q: stopped %v", p, stopped)
		}
	}
	if !reflect.DeepEqual(got, []string{"ab", "é", ""}) || !r.stopped {
		t.Errorf("released %q, stopped %v", got, r.stopped)
	}
	r = newReplyText(nil)
	if out, _ := r.push("a\xffb\xe2\x82"); out != "a\uFFFDb" || r.rest() != "\uFFFD" {
		t.Errorf("invalid bytes: %q, rest %q", out, r.rest())
	}
}

// TestParsedJSON: the Go side reads hydra_chat_parser_add's answer (the
// message as common_chat_msg::to_json_oaicompat writes it, the diffs as
// chatcommon.cpp's diff_json) and writes hydra_chat_parser_new's spec in
// the names chatcommon.cpp reads.
func TestParsedJSON(t *testing.T) {
	answer := `{"msg":{"role":"assistant","content":"hi","reasoning_content":"hm","tool_calls":[{"type":"function",` +
		`"function":{"name":"f","arguments":"{\"a\":1}"},"id":"c1"}]},"diffs":[{"reasoning_content":"","content":"hi",` +
		`"index":-1,"id":"","name":"","arguments":""},{"reasoning_content":"","content":"","index":0,"id":"c1","name":"f","arguments":"{\"a\":1}"}]}`
	var p parsed
	if err := json.Unmarshal([]byte(answer), &p); err != nil {
		t.Fatal(err)
	}
	wantDeltas := []iface.ChatDelta{{Content: "hi", ToolCall: -1}, {ToolCall: 0, ToolID: "c1", ToolName: "f", ToolArgs: `{"a":1}`}}
	if got := p.deltas(); !reflect.DeepEqual(got, wantDeltas) {
		t.Errorf("deltas %+v", got)
	}
	wantReply := &iface.ChatReply{Content: "hi", Reasoning: "hm", ToolCalls: []iface.ToolCall{{ID: "c1", Name: "f", Arguments: `{"a":1}`}}}
	if got := p.reply(); !reflect.DeepEqual(got, wantReply) {
		t.Errorf("reply %+v", got)
	}
	b, _ := json.Marshal(parserSpec{Format: 2, GenerationPrompt: "<|im_start|>assistant\n", Parser: "{}"})
	if string(b) != `{"format":2,"generation_prompt":"\u003c|im_start|\u003eassistant\n","parser":"{}"}` {
		t.Errorf("parser spec %s", b)
	}
}
