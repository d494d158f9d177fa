// Package anthropic is Anthropic's Messages API (POST /v1/messages,
// /v1/messages/count_tokens) as llama-server serves it: Convert makes a
// Messages body the engine's chat request it runs as, and Sink writes the
// run's events as Anthropic's message or event stream.
package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// The body is converted as llama-server's server_chat_convert_anthropic_to_oai
// converts it; unlike llama-server, a field or block this engine does not
// honour is refused, naming it, instead of dropped.

// Request is a /v1/messages body; every field is read (messagesFields).
type Request struct {
	Model              string          `json:"model"`
	Messages           []message       `json:"messages"`
	System             json.RawMessage `json:"system"`
	MaxTokens          *int64          `json:"max_tokens"`
	StopSequences      []string        `json:"stop_sequences"`
	Stream             bool            `json:"stream"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	TopK               *int64          `json:"top_k"`
	Tools              []tool          `json:"tools"`
	ToolChoice         *toolChoice     `json:"tool_choice"`
	Thinking           *thinking       `json:"thinking"`
	Metadata           *metadata       `json:"metadata"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
}

// messagesFields are the fields a /v1/messages body may carry; any other is
// refused. metadata.user_id is an opaque id for the client's own tracking:
// it is logged. count_tokens takes the same, as Anthropic's does.
var messagesFields = []string{"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature",
	"top_p", "top_k", "tools", "tool_choice", "thinking", "metadata", "chat_template_kwargs"}

type metadata struct {
	UserID string `json:"user_id"`
}

// nestedFields are the fields of the body's objects; a path ending in []
// is each element of an array.
var nestedFields = map[string][]string{
	"messages[]":  {"role", "content"},
	"tools[]":     {"type", "name", "description", "input_schema", "cache_control"},
	"tool_choice": {"type", "name", "disable_parallel_tool_use"},
	"thinking":    {"type", "budget_tokens"},
	"metadata":    {"user_id"},
}

// checkNested refuses unknown fields of the body's objects.
func checkNested(body []byte) error {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return run.BadRequest("request body is not a JSON object")
	}
	for key, known := range nestedFields {
		name, each := strings.CutSuffix(key, "[]")
		raw := bytes.TrimSpace(obj[name])
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		if !each {
			if err := run.CheckFields(raw, name, known); err != nil {
				return err
			}
			continue
		}
		var elems []json.RawMessage
		if json.Unmarshal(raw, &elems) != nil {
			return run.BadRequest("%s must be an array", name)
		}
		for i, e := range elems {
			if err := run.CheckFields(e, fmt.Sprintf("%s[%d]", name, i), known); err != nil {
				return err
			}
		}
	}
	return nil
}

type message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// block is a content block of any type; which fields a type may
// carry is checked by blockFields.
type block struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Thinking  *string         `json:"thinking"`
	Signature *string         `json:"signature"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   *bool           `json:"is_error"`
	// CacheControl marks a prompt-cache breakpoint; the engine keeps every
	// slot's prompt and reuses its longest common prefix without one.
	CacheControl json.RawMessage `json:"cache_control"`
}

// blockFields are the fields each block type may carry, besides type and
// cache_control. A tool_result's is_error is rendered like any result: the
// chat templates have no place for it, the result's text says what failed.
var blockFields = map[string][]string{
	"text":        {"text"},
	"thinking":    {"thinking", "signature"},
	"tool_use":    {"id", "name", "input"},
	"tool_result": {"tool_use_id", "content", "is_error"},
}

type tool struct {
	Type         string          `json:"type"`
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control"`
}

type toolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name"`
	DisableParallelToolUse *bool  `json:"disable_parallel_tool_use"`
}

type thinking struct {
	Type         string `json:"type"`
	BudgetTokens *int64 `json:"budget_tokens"`
}

// defaultMaxTokens is llama-server's max_tokens where a body has none
// (Anthropic requires it; llama-server is permissive).
const defaultMaxTokens = 4096

// Convert makes a /v1/messages body the engine's chat request it runs as;
// counting (count_tokens) skips what only bounds the reply. It is a pure
// function of the body: a body it refuses gets a *run.Error naming the
// field at fault.
func Convert(body []byte, counting bool) (request.Chat, Request, error) {
	var m Request
	var chat request.Chat
	if err := run.CheckFields(body, "", messagesFields); err != nil {
		return chat, m, err
	}
	if err := checkNested(body); err != nil {
		return chat, m, err
	}
	if err := run.DecodeJSON(body, &m); err != nil {
		return chat, m, err
	}
	chat.Stream, chat.Model = m.Stream, m.Model
	if sys, err := systemText(m.System); err != nil {
		return chat, m, err
	} else if sys != nil {
		chat.Messages = append(chat.Messages, request.TextMessage("system", *sys))
	}
	if len(m.Messages) == 0 {
		return chat, m, run.BadRequest("messages must be a non-empty array")
	}
	for i, msg := range m.Messages {
		out, err := convertMessage(i, msg)
		if err != nil {
			return chat, m, err
		}
		chat.Messages = append(chat.Messages, out...)
	}
	maxTokens := int64(defaultMaxTokens)
	if m.MaxTokens != nil {
		if *m.MaxTokens < 1 {
			return chat, m, run.BadRequest("max_tokens must be at least 1, got %d", *m.MaxTokens)
		}
		maxTokens = *m.MaxTokens
	}
	chat.MaxTokens = &maxTokens
	if len(m.StopSequences) > 4 {
		return chat, m, run.BadRequest("stop_sequences takes at most 4 strings here, got %d", len(m.StopSequences))
	}
	if len(m.StopSequences) > 0 {
		chat.Stop = request.JSON(m.StopSequences)
	}
	chat.Temperature, chat.TopP, chat.TopK = m.Temperature, m.TopP, m.TopK
	if err := convertTools(m, &chat.Body); err != nil {
		return chat, m, err
	}
	if err := convertThinking(m, counting, &chat.Body); err != nil {
		return chat, m, err
	}
	return chat, m, nil
}

// systemText is the system prompt: a string, or text blocks joined as
// llama-server joins them; nil without one.
func systemText(raw json.RawMessage) (*string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return &s, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return nil, run.BadRequest("system must be a string or an array of text blocks")
	}
	var sb strings.Builder
	for i, rb := range blocks {
		path := fmt.Sprintf("system[%d]", i)
		b, err := decodeBlock(rb, path)
		if err != nil {
			return nil, err
		}
		if b.Type != "text" {
			return nil, run.BadRequest("%s.type must be \"text\", got %q", path, b.Type)
		}
		sb.WriteString(*b.Text)
	}
	s = sb.String()
	return &s, nil
}

// decodeBlock reads and checks a content block at path.
func decodeBlock(raw json.RawMessage, path string) (block, error) {
	var b block
	if err := json.Unmarshal(raw, &b); err != nil {
		return b, run.BadRequest("%s must be a content block object: %s", path, run.JSONErrorText(err, reflect.TypeOf(&b)))
	}
	fields, ok := blockFields[b.Type]
	if !ok {
		return b, run.BadRequest("%s.type %q is not supported (text, thinking, tool_use and tool_result are)", path, b.Type)
	}
	if err := run.CheckFields(raw, path, append([]string{"type", "cache_control"}, fields...)); err != nil {
		return b, err
	}
	switch b.Type {
	case "text":
		if b.Text == nil {
			return b, run.BadRequest("%s.text is required", path)
		}
	case "thinking":
		if b.Thinking == nil {
			return b, run.BadRequest("%s.thinking is required", path)
		}
	case "tool_use":
		if b.ID == "" || b.Name == "" {
			return b, run.BadRequest("%s: a tool_use block needs an id and a name", path)
		}
		if in := bytes.TrimSpace(b.Input); len(in) == 0 || in[0] != '{' || !json.Valid(in) {
			return b, run.BadRequest("%s.input must be a JSON object", path)
		}
	case "tool_result":
		if b.ToolUseID == "" {
			return b, run.BadRequest("%s.tool_use_id is required", path)
		}
	}
	return b, nil
}

// convertMessage is message i as chat messages, in its blocks' order: an
// assistant's text, thinking and tool_use blocks make one message (content,
// reasoning_content, tool_calls); a user's tool_result blocks are tool
// messages, its text blocks user messages between them.
func convertMessage(i int, msg message) ([]host.ChatMessage, error) {
	path := fmt.Sprintf("messages[%d]", i)
	if msg.Role != "user" && msg.Role != "assistant" {
		return nil, run.BadRequest("%s.role must be \"user\" or \"assistant\", got %q", path, msg.Role)
	}
	c := bytes.TrimSpace(msg.Content)
	var s string
	if json.Unmarshal(c, &s) == nil {
		return []host.ChatMessage{request.TextMessage(msg.Role, s)}, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(c, &blocks) != nil {
		return nil, run.BadRequest("%s.content must be a string or an array of content blocks", path)
	}
	var out []host.ChatMessage
	var text, reasoning strings.Builder
	var calls []host.ChatToolCall
	pending := false
	flush := func() {
		if !pending {
			return
		}
		m := request.TextMessage(msg.Role, text.String())
		m.ReasoningContent, m.ToolCalls = reasoning.String(), calls
		out = append(out, m)
		text.Reset()
		reasoning.Reset()
		calls, pending = nil, false
	}
	for j, rb := range blocks {
		bpath := fmt.Sprintf("%s.content[%d]", path, j)
		b, err := decodeBlock(rb, bpath)
		if err != nil {
			return nil, err
		}
		switch {
		case b.Type == "text":
			text.WriteString(*b.Text)
		case b.Type == "thinking" && msg.Role == "assistant":
			reasoning.WriteString(*b.Thinking)
		case b.Type == "tool_use" && msg.Role == "assistant":
			calls = append(calls, request.ToolCall(b.ID, b.Name, string(bytes.TrimSpace(b.Input))))
		case b.Type == "tool_result" && msg.Role == "user":
			flush()
			res, err := toolResultText(b.Content, bpath)
			if err != nil {
				return nil, err
			}
			m := request.TextMessage("tool", res)
			m.ToolCallID = b.ToolUseID
			out = append(out, m)
			continue
		default:
			return nil, run.BadRequest("%s: a %s block cannot be in a %s message", bpath, b.Type, msg.Role)
		}
		pending = true
	}
	flush()
	return out, nil
}

// toolResultText is a tool_result's content: a string, or text blocks
// joined (llama-server collapses text-only results to a string too).
func toolResultText(raw json.RawMessage, path string) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return "", run.BadRequest("%s.content must be a string or an array of text blocks", path)
	}
	var sb strings.Builder
	for k, rb := range blocks {
		cpath := fmt.Sprintf("%s.content[%d]", path, k)
		b, err := decodeBlock(rb, cpath)
		if err != nil {
			return "", err
		}
		if b.Type != "text" {
			return "", run.BadRequest("%s.type must be \"text\" in a tool_result, got %q", cpath, b.Type)
		}
		sb.WriteString(*b.Text)
	}
	return sb.String(), nil
}

// convertTools sets the chat's tools, tool_choice and parallel_tool_calls
// (Anthropic allows parallel tool use unless disable_parallel_tool_use).
func convertTools(m Request, chat *request.Body) error {
	for i, t := range m.Tools {
		if t.Type != "" && t.Type != "custom" {
			return run.BadRequest("tools[%d].type %q is not supported: only client tools (custom) are", i, t.Type)
		}
		if t.Name == "" {
			return run.BadRequest("tools[%d].name is required", i)
		}
		params := json.RawMessage(`{"type":"object"}`)
		if s := bytes.TrimSpace(t.InputSchema); len(s) > 0 && string(s) != "null" {
			if s[0] != '{' {
				return run.BadRequest("tools[%d].input_schema must be a JSON object", i)
			}
			params = s
		}
		fn := map[string]any{"name": t.Name, "parameters": params}
		if t.Description != "" {
			fn["description"] = t.Description
		}
		chat.Tools = append(chat.Tools, request.JSON(map[string]any{"type": "function", "function": fn}))
	}
	tc := m.ToolChoice
	if tc == nil {
		if len(chat.Tools) > 0 {
			chat.ParallelToolCalls = ptr(true)
		}
		return nil
	}
	switch tc.Type {
	case "auto":
		chat.ToolChoice = request.JSON("auto")
	case "any":
		chat.ToolChoice = request.JSON("required")
	case "none":
		chat.ToolChoice = request.JSON("none")
	case "tool":
		if tc.Name == "" {
			return run.BadRequest("tool_choice.name is required with type \"tool\"")
		}
		chat.ToolChoice = request.FunctionChoice(tc.Name)
	default:
		return run.BadRequest("tool_choice.type must be auto, any, tool or none, got %q", tc.Type)
	}
	if tc.Type != "tool" && tc.Name != "" {
		return run.BadRequest("tool_choice.name is only taken with type \"tool\"")
	}
	if len(chat.Tools) > 0 {
		chat.ParallelToolCalls = ptr(tc.DisableParallelToolUse == nil || !*tc.DisableParallelToolUse)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// convertThinking sets the template's enable_thinking from thinking (over
// chat_template_kwargs' own) and, for type "enabled", the reply's reasoning
// budget, llama-server's thinking_budget_tokens. Counting (count_tokens)
// reads no budget: it bounds no reply there.
func convertThinking(m Request, counting bool, chat *request.Body) error {
	var kw map[string]any
	if k := bytes.TrimSpace(m.ChatTemplateKwargs); len(k) > 0 && string(k) != "null" {
		if json.Unmarshal(k, &kw) != nil || kw == nil {
			return run.BadRequest("chat_template_kwargs must be a JSON object")
		}
	}
	if t := m.Thinking; t != nil {
		if kw == nil {
			kw = map[string]any{}
		}
		switch t.Type {
		case "disabled":
			if t.BudgetTokens != nil {
				return run.BadRequest("thinking.budget_tokens is only taken with type \"enabled\"")
			}
			kw["enable_thinking"] = false
		case "enabled":
			switch {
			case t.BudgetTokens == nil:
				return run.BadRequest("thinking.budget_tokens is required with type \"enabled\"")
			case counting:
			case *t.BudgetTokens < 0 || *t.BudgetTokens > math.MaxInt32:
				return run.BadRequest("thinking.budget_tokens must be a count of tokens in [0, %d], got %d", math.MaxInt32, *t.BudgetTokens)
			default:
				chat.ThinkingBudgetTokens = t.BudgetTokens
			}
			kw["enable_thinking"] = true
		default:
			return run.BadRequest("thinking.type must be \"enabled\" or \"disabled\", got %q", t.Type)
		}
	}
	if kw != nil {
		chat.ChatTemplateKwargs = request.JSON(kw)
	}
	return nil
}
