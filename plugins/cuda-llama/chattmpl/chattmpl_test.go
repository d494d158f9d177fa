package chattmpl

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// The templates in testdata are written for these tests in the style of each
// family; the expected strings are what Python's Jinja2, configured as
// Hugging Face's apply_chat_template configures it, renders from them.

// fixedNow is the clock strftime_now reads in these tests.
var fixedNow = time.Date(2026, time.March, 7, 9, 5, 3, 0, time.Local)

func load(t testing.TB, name string) *Template {
	t.Helper()
	src, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := Parse(string(src))
	if err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	tmpl.now = func() time.Time { return fixedNow }
	return tmpl
}

func render(t *testing.T, tmpl *Template, in Input) string {
	t.Helper()
	out, err := tmpl.Render(in)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return out
}

func check(t *testing.T, name, got, want string) {
	t.Helper()
	if got != want {
		t.Errorf("%s:\n got %q\nwant %q", name, got, want)
	}
}

// weatherTool has its keys out of alphabetical order, so a rendering that
// loses the order shows.
var weatherTool = json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}`)

const weatherToolJSON = `{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}`

// toolConversation asks, calls a tool, answers from its result, asks again.
func toolConversation() []Message {
	return []Message{
		{Role: "system", Content: "You are terse."},
		{Role: "user", Content: "What is the weather in Paris?"},
		{Role: "assistant", ReasoningContent: "The user wants the weather; call the tool.",
			ToolCalls: []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city": "Paris", "unit": "c"}`}}},
		{Role: "tool", ToolCallID: "call_1", Name: "get_weather", Content: `{"temp": 21}`},
		{Role: "assistant", Content: "<think>\nIt is mild.\n</think>\n\nIt is 21 °C in Paris."},
		{Role: "user", Content: "And in Rome?"},
	}
}

const chatmlToolsHead = "<|im_start|>system\nYou are terse.\n\n" +
	"Tools you may call are listed as JSON inside <tools></tools>:\n<tools>\n" + weatherToolJSON + "\n</tools>\n\n" +
	"To call one, reply with <tool_call></tool_call> around {\"name\": <name>, \"arguments\": <object>}.<|im_end|>\n" +
	"<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"

const chatmlToolCall = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call><|im_end|>\n" +
	"<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n"

func TestChatML(t *testing.T) {
	tmpl := load(t, "chatml-tools-think.jinja")
	in := Input{Messages: toolConversation(), Tools: []json.RawMessage{weatherTool}}
	// Thinking before the last user turn is dropped unless preserve_thinking.
	dropped := chatmlToolsHead + "<|im_start|>assistant\n" + chatmlToolCall +
		"<|im_start|>assistant\nIt is 21 °C in Paris.<|im_end|>\n" +
		"<|im_start|>user\nAnd in Rome?<|im_end|>\n"
	check(t, "no generation prompt", render(t, tmpl, in), dropped)

	in.AddGenerationPrompt = true
	check(t, "generation prompt", render(t, tmpl, in), dropped+"<|im_start|>assistant\n")

	in.Kwargs = map[string]any{"enable_thinking": false}
	check(t, "thinking off", render(t, tmpl, in), dropped+"<|im_start|>assistant\n<think>\n\n</think>\n\n")

	in.Kwargs = map[string]any{"enable_thinking": true, "preserve_thinking": true}
	kept := chatmlToolsHead +
		"<|im_start|>assistant\n<think>\nThe user wants the weather; call the tool.\n</think>\n\n" + chatmlToolCall +
		"<|im_start|>assistant\n<think>\nIt is mild.\n</think>\n\nIt is 21 °C in Paris.<|im_end|>\n" +
		"<|im_start|>user\nAnd in Rome?<|im_end|>\n<|im_start|>assistant\n"
	check(t, "preserve_thinking", render(t, tmpl, in), kept)
}

// Thinking after the last user turn belongs to the turn in progress, and is
// kept without preserve_thinking.
func TestChatMLThinkingAfterLastUser(t *testing.T) {
	tmpl := load(t, "chatml-tools-think.jinja")
	msgs := toolConversation()[:4]
	msgs[2].ToolCalls = append(msgs[2].ToolCalls, ToolCall{Name: "get_time", Arguments: `not json`})
	got := render(t, tmpl, Input{Messages: msgs, Tools: []json.RawMessage{weatherTool}, AddGenerationPrompt: true})
	want := chatmlToolsHead +
		"<|im_start|>assistant\n<think>\nThe user wants the weather; call the tool.\n</think>\n\n" +
		"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"get_time\", \"arguments\": not json}\n</tool_call><|im_end|>\n" +
		"<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n" +
		"<|im_start|>assistant\n"
	check(t, "thinking after last user", got, want)
}

func TestChatMLWithoutTools(t *testing.T) {
	tmpl := load(t, "chatml-tools-think.jinja")
	got := render(t, tmpl, Input{Messages: []Message{
		{Role: "system", Content: "Be kind."},
		{Role: "user", Content: "Hi"},
		{Role: "assistant", Content: "Hello!"},
		{Role: "user", Content: "Bye"},
	}, AddGenerationPrompt: true})
	want := "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
		"<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
	check(t, "no tools", got, want)
}

func llamaConversation() []Message {
	msgs := toolConversation()
	msgs[0].Content = "  You are terse.\n"
	msgs[4].Content = "It is 21 °C in Paris. "
	return msgs
}

const llamaHead = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nToday Date: 07 Mar 2026\n\n"

const llamaTurns = "<|start_header_id|>user<|end_header_id|>\n\nWhat is the weather in Paris?<|eot_id|>" +
	"<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"c\"}}<|eot_id|>" +
	"<|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 21}<|eot_id|>" +
	"<|start_header_id|>assistant<|end_header_id|>\n\nIt is 21 °C in Paris.<|eot_id|>" +
	"<|start_header_id|>user<|end_header_id|>\n\nAnd in Rome?<|eot_id|>"

func TestLlama3(t *testing.T) {
	tmpl := load(t, "llama3.jinja")
	in := Input{Messages: llamaConversation(), Tools: []json.RawMessage{weatherTool}, BOSToken: "<|begin_of_text|>"}
	tools := "When a function helps, reply only with JSON {\"name\": function name, \"parameters\": object of arguments}.\n" +
		weatherToolJSON + "\n\n"
	want := llamaHead + tools + "You are terse.<|eot_id|>" + llamaTurns
	check(t, "no generation prompt", render(t, tmpl, in), want)

	in.AddGenerationPrompt = true
	in.Kwargs = map[string]any{"date_string": "26 Jul 2024"}
	want = strings.Replace(want, "07 Mar 2026", "26 Jul 2024", 1) + "<|start_header_id|>assistant<|end_header_id|>\n\n"
	check(t, "generation prompt, date kwarg", render(t, tmpl, in), want)

	in = Input{Messages: []Message{{Role: "user", Content: "Hi"}}, BOSToken: "<|begin_of_text|>", AddGenerationPrompt: true}
	want = llamaHead + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
		"<|start_header_id|>assistant<|end_header_id|>\n\n"
	check(t, "no system, no tools", render(t, tmpl, in), want)
}

func TestGemma(t *testing.T) {
	tmpl := load(t, "gemma.jinja")
	in := Input{BOSToken: "<bos>", Messages: []Message{
		{Role: "system", Content: "Answer in French. "},
		{Role: "user", Content: "Hello"},
		{Role: "assistant", Content: " Bonjour "},
		{Role: "user", Content: "Thanks"},
	}}
	want := "<bos><start_of_turn>user\nAnswer in French.\n\nHello<end_of_turn>\n" +
		"<start_of_turn>model\nBonjour<end_of_turn>\n<start_of_turn>user\nThanks<end_of_turn>\n"
	check(t, "no generation prompt", render(t, tmpl, in), want)
	in.AddGenerationPrompt = true
	check(t, "generation prompt", render(t, tmpl, in), want+"<start_of_turn>model\n")

	in.Messages = in.Messages[1:2]
	check(t, "no system", render(t, tmpl, in), "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n")
}

func mistralConversation() []Message {
	return []Message{
		{Role: "system", Content: "Be precise."},
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "abc123xyz", Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
		{Role: "tool", ToolCallID: "abc123xyz", Content: "21 C"},
		{Role: "assistant", Content: "It is 21 °C. "},
		{Role: "user", Content: "Thanks"},
	}
}

func TestMistral(t *testing.T) {
	tmpl := load(t, "mistral.jinja")
	in := Input{Messages: mistralConversation(), BOSToken: "<s>", EOSToken: "</s>", Tools: []json.RawMessage{weatherTool}}
	want := "<s>[INST] Weather in Paris? [/INST]" +
		"[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123xyz\"}]</s>" +
		"[TOOL_RESULTS] {\"content\": \"21 C\", \"call_id\": \"abc123xyz\"}[/TOOL_RESULTS]" +
		" It is 21 °C.</s>" +
		"[AVAILABLE_TOOLS] [" + weatherToolJSON + "][/AVAILABLE_TOOLS]" +
		"[INST] Be precise.\n\nThanks [/INST]"
	check(t, "tools", render(t, tmpl, in), want)
	// The prompt ends with [/INST] whether or not a generation prompt is asked for.
	in.AddGenerationPrompt = true
	check(t, "generation prompt", render(t, tmpl, in), want)

	in = Input{Messages: []Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello"}, {Role: "user", Content: "Bye"}},
		BOSToken: "<s>", EOSToken: "</s>"}
	check(t, "no system, no tools", render(t, tmpl, in), "<s>[INST] Hi [/INST] Hello</s>[INST] Bye [/INST]")
}

func TestRaiseException(t *testing.T) {
	twoCalls := llamaConversation()
	twoCalls[2].ToolCalls = append(twoCalls[2].ToolCalls, ToolCall{Name: "get_time", Arguments: "{}"})
	cases := []struct {
		name     string
		template string
		msgs     []Message
		want     string
	}{
		{"gemma roles", "gemma.jinja", []Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}},
			"Conversation roles must alternate user/assistant/user/assistant/..."},
		{"gemma first turn", "gemma.jinja", []Message{{Role: "assistant", Content: "a"}},
			"Conversation roles must alternate user/assistant/user/assistant/..."},
		{"mistral roles", "mistral.jinja", []Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}},
			"After the optional system message, roles must alternate user and assistant."},
		{"mistral bad role", "mistral.jinja", []Message{{Role: "user", Content: "a"}, {Role: "critic", Content: "b"}},
			"Only user, assistant and tool roles are supported, after an optional system message."},
		{"llama two calls", "llama3.jinja", twoCalls, "This model supports one tool call per message."},
	}
	for _, c := range cases {
		_, err := load(t, c.template).Render(Input{Messages: c.msgs})
		var raised *RaisedError
		if !errors.As(err, &raised) || raised.Message != c.want {
			t.Errorf("%s: got %v, want the template's message %q", c.name, err, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ src, want string }{
		{"{% if messages %}\n{{ messages[0].content }}\n", "line 3"},      // never closed
		{"{{ bos_token }}\n\n{{ messages[0].content + }}\n", "line 3"},    // expression cut short
		{"{% for m in messages %}\n{% endif %}\n{% endfor %}", "line 2"},  // mismatched end tag
		{"{% if true %}\nok\n{% endif %}\n{{ 'unterminated", "line 4"},    // tag never closed
		{"{%- set ns = namespace(a=1) %}\n{%- frobnicate %}\n", "line 2"}, // unknown statement
	}
	for _, c := range cases {
		_, err := Parse(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error naming %s", c.src, err, c.want)
		}
	}
}

func TestRenderErrors(t *testing.T) {
	tmpl := load(t, "chatml-tools-think.jinja")
	msgs := []Message{{Role: "user", Content: "hi"}}
	if _, err := tmpl.Render(Input{Messages: msgs, Kwargs: map[string]any{"messages": []any{}}}); err == nil {
		t.Error("a kwarg replaced messages")
	}
	if _, err := tmpl.Render(Input{Messages: msgs, Kwargs: map[string]any{"when": time.Now()}}); err == nil {
		t.Error("a kwarg of an unsupported type was accepted")
	}
	if _, err := tmpl.Render(Input{Messages: msgs, Tools: []json.RawMessage{json.RawMessage(`{"type":`)}}); err == nil {
		t.Error("a tool that is not JSON was accepted")
	}
	bad, err := Parse(`{{ messages | no_such_filter }}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Render(Input{Messages: msgs}); err == nil || !strings.Contains(err.Error(), "no_such_filter") {
		t.Errorf("unknown filter: %v", err)
	}
}

// The OpenAI shape of messages: optional keys only when set, content ""
// beside tool calls (llama.cpp's common/chat), arguments parsed (empty ones as an empty object), kwargs
// of every JSON type.
func TestVariables(t *testing.T) {
	tmpl, err := Parse(`{{ messages | tojson }}|{{ flags | tojson }}|{{ n }}|{{ raw | tojson }}|{{ add_generation_prompt }}`)
	if err != nil {
		t.Fatal(err)
	}
	got := render(t, tmpl, Input{
		Messages: []Message{
			{Role: "user", Content: "q"},
			{Role: "assistant", ReasoningContent: "r", ToolCalls: []ToolCall{{Name: "f"}, {ID: "1", Type: "function", Name: "g", Arguments: `[1, 2.5, "x"]`}}},
			{Role: "tool", Name: "f", ToolCallID: "1", Content: "ok"},
		},
		Kwargs: map[string]any{
			"flags": map[string]any{"z": true, "a": nil, "list": []any{1.0, 2.5, "s", json.Number("7")}},
			"n":     int64(1024),
			"raw":   json.RawMessage(`{"b": 1, "a": [true]}`),
		},
	})
	want := `[{"role": "user", "content": "q"}, ` +
		`{"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [` +
		`{"type": "function", "function": {"name": "f", "arguments": {}}}, ` +
		`{"type": "function", "function": {"name": "g", "arguments": [1, 2.5, "x"]}, "id": "1"}]}, ` +
		`{"role": "tool", "content": "ok", "name": "f", "tool_call_id": "1"}]` +
		`|{"a": null, "list": [1, 2.5, "s", 7], "z": true}|1024|{"b": 1, "a": [true]}|False`
	check(t, "variables", got, want)
}

func TestDeterministic(t *testing.T) {
	tmpl := load(t, "chatml-tools-think.jinja")
	in := Input{Messages: toolConversation(), Tools: []json.RawMessage{weatherTool}, AddGenerationPrompt: true,
		Kwargs: map[string]any{"enable_thinking": true, "extra": map[string]any{"c": 1, "b": 2, "a": 3}}}
	first := render(t, tmpl, in)
	for range 20 {
		if got := render(t, tmpl, in); got != first {
			t.Fatalf("renderings differ:\n%q\n%q", first, got)
		}
	}
}

func TestStrftime(t *testing.T) {
	at := time.Date(2026, time.March, 7, 15, 4, 9, 0, time.UTC)
	cases := map[string]string{
		"%d %b %Y":               "07 Mar 2026",
		"%-d %B %Y":              "7 March 2026",
		"%A, %a %e %m/%y":        "Saturday, Sat  7 03/26",
		"%H:%M:%S %I%p day %j":   "15:04:09 03PM day 066",
		"Cutoff 2024 %% %q %":    "Cutoff 2024 % %q %",
		"%Y-%m-%d":               "2026-03-07",
		"%Z %z w%w":              "UTC +0000 w6",
		"Jan 2 15:04 Mon -07 %-": "Jan 2 15:04 Mon -07 %-",
	}
	for format, want := range cases {
		if got := strftime(at, format); got != want {
			t.Errorf("strftime(%q) = %q, want %q", format, got, want)
		}
	}
}

// FuzzRender renders random roles, contents and tool arguments through the
// ChatML template: it must never fail inside the engine, and every user
// message must appear verbatim.
func FuzzRender(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, "sys\x00hi\x00<think>a</think>b\x00{\"x\": 1}", `{"a": [1, {"b": null}]}`, true)
	f.Add([]byte{1, 1, 9}, "{{ x }}\x00{% if %}\x00", `not json`, false)
	f.Add([]byte{}, "", "", true)
	tmpl := load(f, "chatml-tools-think.jinja")
	roles := []string{"system", "user", "assistant", "tool"}
	f.Fuzz(func(t *testing.T, roleBytes []byte, contents, args string, gen bool) {
		parts := strings.Split(contents, "\x00")
		msgs := make([]Message, len(parts))
		for i, p := range parts {
			role := p
			if i < len(roleBytes) && int(roleBytes[i]) < 2*len(roles) {
				role = roles[int(roleBytes[i])%len(roles)]
			}
			msgs[i] = Message{Role: role, Content: p}
			if role == "assistant" && i%2 == 1 {
				msgs[i].ToolCalls = []ToolCall{{Name: p, Arguments: args}}
				msgs[i].ReasoningContent = args
			}
		}
		out, err := tmpl.Render(Input{Messages: msgs, AddGenerationPrompt: gen,
			Kwargs: map[string]any{"enable_thinking": gen, "preserve_thinking": !gen}})
		if errors.Is(err, errPanic) {
			t.Fatalf("engine failure: %v", err)
		}
		if err != nil {
			return
		}
		for _, m := range msgs {
			if m.Role == "user" && !strings.Contains(out, "<|im_start|>user\n"+m.Content+"<|im_end|>") {
				t.Fatalf("user message %q missing from %q", m.Content, out)
			}
		}
	})
}

// An assistant message that only calls tools has content "" as llama.cpp
// gives it, so a template calling a string method on it unguarded (Qwen3's
// `message.content.lstrip`) renders instead of failing on none.
func TestToolCallOnlyContentIsString(t *testing.T) {
	tmpl, err := Parse(`{% for m in messages %}[{{ m.content.lstrip('\n') }}]{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	got := render(t, tmpl, Input{Messages: []Message{
		{Role: "user", Content: "\nq"},
		{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: "{}"}}},
	}})
	if got != "[q][]" {
		t.Errorf("got %q, want %q", got, "[q][]")
	}
}
