package cudallama

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/stoptext"
)

// A decode's Output (iface.Output) in the terms of llama.cpp's common
// library (chatcommon.cpp): the request common_chat_templates_apply takes,
// what it answers, the grammar sampler's spec and the parses. This file
// needs no C; chatcommon.go calls the library.

// commonChatRequest is the body chatcommon.cpp hands to
// common_chat_templates_apply, in llama-server's field names.
type commonChatRequest struct {
	Messages          []commonMessage   `json:"messages"`
	Tools             []json.RawMessage `json:"tools,omitempty"`
	ToolChoice        string            `json:"tool_choice"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls,omitempty"`
	JSONSchema        json.RawMessage   `json:"json_schema,omitempty"`
	Grammar           string            `json:"grammar,omitempty"`
	Kwargs            map[string]any    `json:"chat_template_kwargs,omitempty"`
}

type commonMessage struct {
	Role             string           `json:"role"`
	Content          string           `json:"content"`
	ReasoningContent string           `json:"reasoning_content,omitempty"`
	ToolCalls        []commonToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string           `json:"tool_call_id,omitempty"`
	Name             string           `json:"name,omitempty"`
}

type commonToolCall struct {
	ID       string `json:"id,omitempty"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolName is an OpenAI tool definition's function name, "" if it has none.
func toolName(tool string) string {
	var t struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal([]byte(tool), &t) != nil {
		return ""
	}
	return t.Function.Name
}

// newCommonChatRequest is the apply request for chat p with tool choice
// choice (kwargs: the template variables, the engine's merged with the
// request's). A named tool choice keeps only that tool: the grammar then
// allows only it, while the prompt, rendered apart, still lists every tool.
func newCommonChatRequest(p iface.PrefillRequest, choice string, kwargs map[string]any, o *iface.Output) ([]byte, error) {
	req := commonChatRequest{ToolChoice: choice, ParallelToolCalls: p.ParallelToolCalls, Kwargs: kwargs}
	for _, m := range p.Messages {
		cm := commonMessage{Role: m.Role, Content: m.Content, ReasoningContent: m.ReasoningContent, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			tc := commonToolCall{ID: c.ID, Type: "function"}
			tc.Function.Name, tc.Function.Arguments = c.Name, c.Arguments
			cm.ToolCalls = append(cm.ToolCalls, tc)
		}
		req.Messages = append(req.Messages, cm)
	}
	for _, t := range p.Tools {
		if p.ToolChoiceName != "" && toolName(t) != p.ToolChoiceName {
			continue
		}
		req.Tools = append(req.Tools, json.RawMessage(t))
	}
	if p.ToolChoiceName != "" && len(req.Tools) == 0 {
		return nil, fmt.Errorf("%w: tool_choice names function %q, which tools does not define", iface.ErrBadRequest, p.ToolChoiceName)
	}
	if o != nil {
		if o.JSONSchema != "" {
			req.JSONSchema = json.RawMessage(o.JSONSchema)
		}
		req.Grammar = o.Grammar
	}
	return json.Marshal(req)
}

// toolChoice is the choice common_chat_templates_apply takes for p: a named
// function is a required call (of that tool alone).
func toolChoice(p iface.PrefillRequest) string {
	switch {
	case p.ToolChoiceName != "":
		return "required"
	case p.ToolChoice == "":
		return "auto"
	}
	return p.ToolChoice
}

// chatParams is what common_chat_templates_apply answered (chatcommon.cpp).
type chatParams struct {
	Prompt           string           `json:"prompt"`
	Format           int              `json:"format"`
	FormatName       string           `json:"format_name"`
	Grammar          string           `json:"grammar"`
	GrammarLazy      bool             `json:"grammar_lazy"`
	GenerationPrompt string           `json:"generation_prompt"`
	Parser           string           `json:"parser"`
	Triggers         []grammarTrigger `json:"grammar_triggers"`
	PreservedTokens  []string         `json:"preserved_tokens"`
	AdditionalStops  []string         `json:"additional_stops"`
	// The tags of the format's reasoning block ("" and none: it has none),
	// which bound a reasoning budget.
	ThinkingStart string   `json:"thinking_start_tag"`
	ThinkingEnds  []string `json:"thinking_end_tags"`
	// MessageDelimiters are where the template's messages start, by role
	// (checkpoints are taken at user messages' starts).
	MessageDelimiters []struct {
		Role      string `json:"role"`
		Delimiter string `json:"delimiter"`
	} `json:"message_delimiters"`
}

// grammarTrigger is common_grammar_trigger: a word, pattern or token that
// wakes a lazy grammar.
type grammarTrigger struct {
	Type  int    `json:"type"`
	Value string `json:"value"`
	Token int32  `json:"token"`
}

// grammarSpec is what hydra_grammar_new builds a grammar sampler from.
type grammarSpec struct {
	Grammar  string           `json:"grammar"`
	Lazy     bool             `json:"lazy"`
	Triggers []grammarTrigger `json:"triggers,omitempty"`
	// Prefill is prompt text the grammar starts after (the generation
	// prompt a tool-call or output-format grammar begins with).
	Prefill string `json:"prefill,omitempty"`
}

// chatGrammar is the grammar of a chat's reply, as llama-server builds its
// sampler from the apply result: the tool-call or output-format grammar,
// started after the generation prompt. A required call is never lazy here:
// llama.cpp leaves some templates' required calls waiting for a trigger
// the model may never write, and this engine promises a call.
func chatGrammar(p chatParams, required bool) *grammarSpec {
	if p.Grammar == "" {
		return nil
	}
	g := &grammarSpec{Grammar: p.Grammar, Lazy: p.GrammarLazy, Triggers: p.Triggers, Prefill: p.GenerationPrompt}
	if required && g.Lazy {
		// A lazy grammar's root is what follows its trigger, from the
		// trigger on: it starts at the reply's first token, not after the
		// generation prompt.
		g.Lazy, g.Triggers, g.Prefill = false, nil, ""
	}
	if g.Lazy {
		g.Prefill = ""
	}
	return g
}

// budgetSpec is what hydra_reasoning_budget_new builds llama.cpp's
// reasoning-budget sampler from.
type budgetSpec struct {
	Start   string   `json:"start"`
	Ends    []string `json:"ends"`
	Message string   `json:"message,omitempty"`
	Budget  int64    `json:"budget"` // < 0: unbounded
	// Prefill is the generation prompt, which may open the reasoning.
	Prefill string `json:"prefill,omitempty"`
}

// reasoningBudget is the reasoning-budget sampler of a chat reply in format
// p with grammar g, as common_sampler_init builds one from llama-server's
// chat parameters: only where the format has thinking tags, and then for a
// budget the request gives, or, unbounded, to keep a lazy grammar from
// waking inside the reasoning; nil: none.
func reasoningBudget(p chatParams, b *iface.ReasoningBudget, g *grammarSpec) *budgetSpec {
	if p.ThinkingStart == "" || !slices.ContainsFunc(p.ThinkingEnds, func(t string) bool { return t != "" }) {
		return nil
	}
	spec := &budgetSpec{Start: p.ThinkingStart, Ends: p.ThinkingEnds, Budget: -1, Prefill: p.GenerationPrompt}
	switch {
	case b != nil:
		spec.Budget, spec.Message = int64(b.Tokens), b.Message
	case g == nil || !g.Lazy:
		return nil
	}
	return spec
}

// parserSpec is what hydra_chat_parser_new reads.
type parserSpec struct {
	Format           int    `json:"format"`
	GenerationPrompt string `json:"generation_prompt"`
	Parser           string `json:"parser"`
}

// parsed is one parse (hydra_chat_parser_add): the message so far and what
// changed since the last parse, as common_chat_msg_diff.
type parsed struct {
	Msg struct {
		Content          string `json:"content"`
		ReasoningContent string `json:"reasoning_content"`
		ToolCalls        []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"msg"`
	Diffs []struct {
		Reasoning string `json:"reasoning_content"`
		Content   string `json:"content"`
		Index     int    `json:"index"`
		ID        string `json:"id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"diffs"`
}

func (p *parsed) deltas() []iface.ChatDelta {
	var out []iface.ChatDelta
	for _, d := range p.Diffs {
		out = append(out, iface.ChatDelta{Content: d.Content, Reasoning: d.Reasoning, ToolCall: d.Index,
			ToolID: d.ID, ToolName: d.Name, ToolArgs: d.Arguments})
	}
	return out
}

func (p *parsed) reply() *iface.ChatReply {
	r := &iface.ChatReply{Content: p.Msg.Content, Reasoning: p.Msg.ReasoningContent}
	for _, c := range p.Msg.ToolCalls {
		r.ToolCalls = append(r.ToolCalls, iface.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	return r
}

// replyText feeds a parser the reply's text: cut at the first stop string
// (the request's and the template's), and never inside a UTF-8 sequence, as
// common's JSON holds only whole characters.
type replyText struct {
	stops   stoptext.Stream
	stopped bool
}

func newReplyText(stops ...[]string) *replyText {
	r := &replyText{}
	for _, ss := range stops {
		for _, s := range ss {
			if s != "" {
				r.stops.Stops = append(r.stops.Stops, s)
			}
		}
	}
	return r
}

// push takes a token's piece and returns the text the parser may read now,
// and whether a stop string ended the reply.
func (r *replyText) push(piece string) (string, bool) {
	out, stopped := r.stops.Push(piece)
	r.stopped = r.stopped || stopped
	return strings.ToValidUTF8(out, string(utf8.RuneError)), stopped
}

// rest is what was held back, once the reply ended. Invalid UTF-8 (an
// unfinished character, a byte token) becomes U+FFFD here and in push: the
// JSON the parser answers in carries only whole characters.
func (r *replyText) rest() string {
	return strings.ToValidUTF8(r.stops.Flush(), string(utf8.RuneError))
}

// requiredGrammar makes the lazy tool-call grammar llama.cpp builds for
// tool_choice auto into a required call's: its root's first alternative (the
// template's tool-call rule), from the reply's first token. llama.cpp's own
// required grammar lets free content, reasoning included, come first, with
// no bound, and its lazy root accepts no call at all.
func requiredGrammar(lazy string) string {
	lines := strings.Split(lazy, "\n")
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, "root ::= ")
		if !ok {
			continue
		}
		first := strings.TrimSpace(strings.SplitN(rest, "|", 2)[0])
		if isRuleName(first) {
			lines[i] = "root ::= " + first
		}
	}
	return strings.Join(lines, "\n")
}

// isRuleName reports whether s is one GBNF rule name.
func isRuleName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// genericCallSchema is the JSON schema of a required call for a template
// that writes no tool calls of its own (llama.cpp then parses only content):
// {"name": one of the tools, "arguments": its parameters}, or an array of
// them where calls may be parallel, as llama.cpp's former generic format.
func genericCallSchema(tools []string, parallel bool) (string, error) {
	var alts []any
	for i, t := range tools {
		var def struct {
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal([]byte(t), &def); err != nil || def.Function.Name == "" {
			return "", fmt.Errorf("%w: tools[%d] is not a function definition with a name", iface.ErrBadRequest, i)
		}
		params := def.Function.Parameters
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object"}`)
		}
		alts = append(alts, map[string]any{"type": "object", "additionalProperties": false, "required": []string{"name", "arguments"},
			"properties": map[string]any{"name": map[string]any{"const": def.Function.Name}, "arguments": params}})
	}
	var schema any = map[string]any{"anyOf": alts}
	if parallel {
		schema = map[string]any{"type": "array", "minItems": 1, "items": schema}
	}
	b, err := json.Marshal(schema)
	return string(b), err
}

// genericCalls reads a reply of genericCallSchema into tool calls, ids
// made by newID.
func genericCalls(text string, newID func() string) ([]iface.ToolCall, error) {
	type call struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	var calls []call
	text = strings.TrimSpace(text)
	if strings.HasPrefix(text, "[") {
		if err := json.Unmarshal([]byte(text), &calls); err != nil {
			return nil, err
		}
	} else {
		var c call
		if err := json.Unmarshal([]byte(text), &c); err != nil {
			return nil, err
		}
		calls = []call{c}
	}
	out := make([]iface.ToolCall, len(calls))
	for i, c := range calls {
		out[i] = iface.ToolCall{ID: newID(), Name: c.Name, Arguments: string(c.Arguments)}
	}
	return out, nil
}

// newToolCallID is a call's id as llama-server makes them: 32 random
// letters and digits.
func newToolCallID() string {
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 32)
	for i := range b {
		b[i] = chars[rand.IntN(len(chars))]
	}
	return string(b)
}
