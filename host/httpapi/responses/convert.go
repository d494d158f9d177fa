// Package responses is OpenAI's Responses API (POST /v1/responses,
// /v1/responses/input_tokens) as llama-server serves it: Convert makes a
// Responses body the engine's chat request it runs as, and Sink writes the
// run's events as a Response or its event stream.
package responses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// The body is converted as llama-server's
// server_chat_convert_responses_to_chatcmpl converts it; unlike
// llama-server, a field, input item or tool this engine does not honour is
// refused, naming it, instead of dropped.

// Request is a /v1/responses body; every field is read
// (responsesFields), those of the chat completion body llama-server passes
// on included (responsesPassed).
type Request struct {
	Model             string              `json:"model"`
	Input             json.RawMessage     `json:"input"`
	Instructions      *string             `json:"instructions"`
	Tools             []json.RawMessage   `json:"tools"`
	ToolChoice        json.RawMessage     `json:"tool_choice"`
	ParallelToolCalls *bool               `json:"parallel_tool_calls"`
	MaxOutputTokens   *int64              `json:"max_output_tokens"`
	Stream            bool                `json:"stream"`
	Reasoning         *responsesReasoning `json:"reasoning"`
	Text              *responsesText      `json:"text"`
	// Store, Include, Truncation, Background, StreamOptions and
	// PreviousResponseID are taken where they ask nothing this engine
	// lacks: it keeps no responses and adds nothing to the output.
	Store              *bool    `json:"store"`
	Include            []string `json:"include"`
	Truncation         *string  `json:"truncation"`
	Background         *bool    `json:"background"`
	PreviousResponseID *string  `json:"previous_response_id"`
	StreamOptions      *struct {
		IncludeObfuscation *bool `json:"include_obfuscation"`
	} `json:"stream_options"`
	// Metadata, User and SafetyIdentifier are the client's own tags,
	// logged; PromptCacheKey a caching hint (every slot keeps its prompt
	// and a request reuses the longest common prefix without one).
	Metadata         map[string]string `json:"metadata"`
	User             string            `json:"user"`
	SafetyIdentifier string            `json:"safety_identifier"`
	PromptCacheKey   string            `json:"prompt_cache_key"`
}

type responsesReasoning struct {
	Effort          *string         `json:"effort"`
	Summary         json.RawMessage `json:"summary"`
	GenerateSummary json.RawMessage `json:"generate_summary"`
}

type responsesText struct {
	Format    json.RawMessage `json:"format"`
	Verbosity *string         `json:"verbosity"`
}

// responsesPassed are the chat completion fields a Responses body may carry
// as llama-server passes them on: sampling, stops, the template's variables,
// the reasoning budget, the slot.
var responsesPassed = []string{"temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n",
	"presence_penalty", "frequency_penalty", "stop", "logit_bias", "chat_template_kwargs", "reasoning_budget_tokens",
	"thinking_budget_tokens", "reasoning_budget_message", "id_slot", "n_keep"}

var responsesFields = append([]string{"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls",
	"max_output_tokens", "stream", "reasoning", "text", "store", "include", "truncation", "background",
	"previous_response_id", "stream_options", "metadata", "user", "safety_identifier", "prompt_cache_key"}, responsesPassed...)

// responsesNested are the fields of the body's objects.
var responsesNested = map[string][]string{
	"reasoning":      {"effort", "summary", "generate_summary"},
	"text":           {"format", "verbosity"},
	"stream_options": {"include_obfuscation"},
}

// reasoningEfforts are OpenAI's reasoning.effort values: the chat's
// reasoning_effort ("none" turns the template's thinking off, any other is
// the template's reasoning_effort).
var reasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh"}

// inputFields are the fields each input item type may carry; an item
// without a type is a message.
var inputFields = map[string][]string{
	"message":              {"type", "role", "content", "id", "status"},
	"function_call":        {"type", "call_id", "name", "arguments", "id", "status"},
	"function_call_output": {"type", "call_id", "output", "id", "status"},
	"reasoning":            {"type", "summary", "content", "encrypted_content", "id", "status"},
}

// inputItem is an input item of any type; which fields a type may carry is
// checked by inputFields.
type inputItem struct {
	Type             string          `json:"type"`
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	CallID           *string         `json:"call_id"`
	Name             *string         `json:"name"`
	Arguments        *string         `json:"arguments"`
	Output           json.RawMessage `json:"output"`
	Summary          json.RawMessage `json:"summary"`
	EncryptedContent *string         `json:"encrypted_content"`
}

// contentPart is a message's or a tool output's content part.
type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// partFields are the fields each content part type may carry.
var partFields = map[string][]string{
	"input_text":     {"type", "text"},
	"output_text":    {"type", "text", "annotations", "logprobs"},
	"reasoning_text": {"type", "text"},
}

// Convert makes a /v1/responses body the engine's chat request it runs as.
// It is a pure function of the body: a body it refuses gets a *run.Error
// naming the field at fault.
func Convert(body []byte) (request.Chat, Request, error) {
	var rb Request
	var chat request.Chat
	var raw map[string]json.RawMessage
	if err := run.DecodeJSON(body, &raw); err != nil {
		return chat, rb, err
	}
	if err := run.CheckFields(body, "", responsesFields); err != nil {
		return chat, rb, err
	}
	for _, name := range slices.Sorted(maps.Keys(responsesNested)) {
		if v := bytes.TrimSpace(raw[name]); len(v) > 0 && string(v) != "null" {
			if err := run.CheckFields(v, name, responsesNested[name]); err != nil {
				return chat, rb, err
			}
		}
	}
	if err := run.DecodeJSON(body, &rb); err != nil {
		return chat, rb, err
	}
	if err := checkResponsesAsks(rb); err != nil {
		return chat, rb, err
	}
	chat.Stream, chat.Model = rb.Stream, rb.Model
	var msgs []turn
	if rb.Instructions != nil {
		msgs = append(msgs, turn{role: "system", content: *rb.Instructions})
	}
	msgs, err := convertInput(rb.Input, msgs)
	if err != nil {
		return chat, rb, err
	}
	for _, t := range msgs {
		chat.Messages = append(chat.Messages, t.message())
	}
	if err := convertResponsesTools(rb, &chat.Body); err != nil {
		return chat, rb, err
	}
	if v := rb.MaxOutputTokens; v != nil {
		if *v < 1 {
			return chat, rb, run.BadRequest("max_output_tokens must be at least 1, got %d", *v)
		}
		chat.MaxTokens = v
	}
	for _, k := range responsesPassed {
		if v, ok := raw[k]; ok {
			if chat.Passed == nil {
				chat.Passed = map[string]json.RawMessage{}
			}
			chat.Passed[k] = v
		}
	}
	if err := convertTextFormat(rb, &chat.Body); err != nil {
		return chat, rb, err
	}
	if err := convertReasoning(rb, &chat.Body); err != nil {
		return chat, rb, err
	}
	return chat, rb, nil
}

// turn is a chat message as the input makes it, its content text; an
// assistant's items merge into the turn before them.
type turn struct {
	role, content, reasoning, callID string
	calls                            []host.ChatToolCall
}

// message is the turn as the chat's message.
func (t turn) message() host.ChatMessage {
	m := request.TextMessage(t.role, t.content)
	m.ReasoningContent, m.ToolCallID, m.ToolCalls = t.reasoning, t.callID, t.calls
	return m
}

// checkResponsesAsks refuses what the body asks that this engine has not:
// a stored response or one to continue from, extra output, the input cut
// to fit, a run in the background, obfuscated streams.
func checkResponsesAsks(rb Request) error {
	refuse := func(param, format string, args ...any) error {
		e := run.BadRequest(format, args...)
		e.Param = param
		return e
	}
	switch {
	case rb.PreviousResponseID != nil && *rb.PreviousResponseID != "":
		return refuse("previous_response_id", "previous_response_id is not supported: this engine keeps no responses; send the conversation as input")
	case rb.Store != nil && *rb.Store:
		return refuse("store", "store true is not supported: this engine keeps no responses (send false or leave it out)")
	case len(rb.Include) > 0:
		return refuse("include", "include %q is not supported: this engine adds nothing to the output", rb.Include[0])
	case rb.Truncation != nil && *rb.Truncation != "disabled":
		return refuse("truncation", "truncation %q is not supported: the input is never cut to fit (send \"disabled\" or leave it out)", *rb.Truncation)
	case rb.Background != nil && *rb.Background:
		return refuse("background", "background true is not supported: a response runs while its request waits")
	case rb.StreamOptions != nil && rb.StreamOptions.IncludeObfuscation != nil && *rb.StreamOptions.IncludeObfuscation:
		return refuse("stream_options.include_obfuscation", "stream_options.include_obfuscation true is not supported: this engine pads no stream events")
	}
	return nil
}

// convertInput appends input as chat messages: a string is the user's
// message; input items become messages in their order, an assistant's
// message, reasoning and function calls merged into one assistant message
// as llama-server merges them.
func convertInput(raw json.RawMessage, msgs []turn) ([]turn, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, run.BadRequest("input is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return append(msgs, turn{role: "user", content: s}), nil
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return nil, run.BadRequest("input must be a string or an array of input items")
	}
	if len(items) == 0 {
		return nil, run.BadRequest("input must not be empty")
	}
	for i, ri := range items {
		path := fmt.Sprintf("input[%d]", i)
		it, err := decodeItem(ri, path)
		if err != nil {
			return nil, err
		}
		var prev *turn // the assistant message an assistant item merges into
		if n := len(msgs); n > 0 && msgs[n-1].role == "assistant" {
			prev = &msgs[n-1]
		}
		var m *turn
		switch it.Type {
		case "message":
			m, err = inputMessage(it, path, prev)
		case "function_call":
			m, err = functionCall(it, path, prev)
		case "function_call_output":
			m, err = functionCallOutput(it, path)
		case "reasoning":
			m, err = reasoningItem(it, path, prev)
		}
		if err != nil {
			return nil, err
		}
		if m != nil {
			msgs = append(msgs, *m)
		}
	}
	return msgs, nil
}

// decodeItem reads and checks an input item at path.
func decodeItem(raw json.RawMessage, path string) (inputItem, error) {
	var it inputItem
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &it) != nil {
		return it, run.BadRequest("%s must be an input item object", path)
	}
	if it.Type == "" {
		it.Type = "message"
	}
	fields, ok := inputFields[it.Type]
	if !ok {
		return it, run.BadRequest("%s.type %q is not supported (message, function_call, function_call_output and reasoning are)", path, it.Type)
	}
	return it, run.CheckFields(raw, path, fields)
}

// inputMessage is a message item as a chat message, or nil where an
// assistant's merges into prev.
func inputMessage(it inputItem, path string, prev *turn) (*turn, error) {
	var kinds []string
	switch it.Role {
	case "user", "system", "developer":
		kinds = []string{"input_text"}
	case "assistant":
		kinds = []string{"output_text", "input_text"}
	default:
		return nil, run.BadRequest("%s.role must be \"user\", \"system\", \"developer\" or \"assistant\", got %q", path, it.Role)
	}
	text, err := partsText(it.Content, path+".content", kinds)
	if err != nil {
		return nil, err
	}
	if it.Role == "assistant" && prev != nil {
		prev.content += text
		return nil, nil
	}
	return &turn{role: it.Role, content: text}, nil
}

// partsText is a content's text: a string, or content parts of the kinds
// given, joined.
func partsText(raw json.RawMessage, path string, kinds []string) (string, error) {
	raw = bytes.TrimSpace(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil && string(raw) != "null" {
		return s, nil
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil || string(raw) == "null" {
		return "", run.BadRequest("%s must be a string or an array of content parts", path)
	}
	var sb strings.Builder
	for j, rp := range parts {
		ppath := fmt.Sprintf("%s[%d]", path, j)
		var p contentPart
		if t := bytes.TrimSpace(rp); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &p) != nil {
			return "", run.BadRequest("%s must be a content part object", ppath)
		}
		if !slices.Contains(kinds, p.Type) {
			why := ""
			switch p.Type {
			case "input_image", "input_file", "input_audio":
				why = ": this engine's models read text only"
			case "refusal":
				why = ": the chat templates have no place for a refusal"
			}
			return "", run.BadRequest("%s.type %q is not supported%s (%s are)", ppath, p.Type, why, strings.Join(kinds, ", "))
		}
		if err := run.CheckFields(rp, ppath, partFields[p.Type]); err != nil {
			return "", err
		}
		if p.Text == nil {
			return "", run.BadRequest("%s.text is required", ppath)
		}
		sb.WriteString(*p.Text)
	}
	return sb.String(), nil
}

// functionCall is a function_call item as an assistant's tool call, merged
// into prev where there is one.
func functionCall(it inputItem, path string, prev *turn) (*turn, error) {
	if it.CallID == nil || *it.CallID == "" || it.Name == nil || *it.Name == "" || it.Arguments == nil {
		return nil, run.BadRequest("%s: a function_call item needs call_id, name and arguments (strings)", path)
	}
	call := request.ToolCall(*it.CallID, *it.Name, *it.Arguments)
	if prev != nil {
		prev.calls = append(prev.calls, call)
		return nil, nil
	}
	return &turn{role: "assistant", calls: []host.ChatToolCall{call}}, nil
}

// functionCallOutput is a function_call_output item as a tool message: its
// output a string or input_text parts.
func functionCallOutput(it inputItem, path string) (*turn, error) {
	if it.CallID == nil || *it.CallID == "" {
		return nil, run.BadRequest("%s.call_id is required", path)
	}
	if o := bytes.TrimSpace(it.Output); len(o) == 0 || string(o) == "null" {
		return nil, run.BadRequest("%s.output is required", path)
	}
	out, err := partsText(it.Output, path+".output", []string{"input_text"})
	if err != nil {
		return nil, err
	}
	return &turn{role: "tool", callID: *it.CallID, content: out}, nil
}

// reasoningItem is a reasoning item as an assistant's reasoning_content,
// set on prev where there is one. Its content's reasoning_text is the
// reasoning (llama-server requires it); an encrypted_content is another
// server's, which this engine cannot read.
func reasoningItem(it inputItem, path string, prev *turn) (*turn, error) {
	var summary []json.RawMessage
	if json.Unmarshal(it.Summary, &summary) != nil || summary == nil {
		return nil, run.BadRequest("%s.summary must be an array", path)
	}
	if it.EncryptedContent != nil && *it.EncryptedContent != "" {
		return nil, run.BadRequest("%s.encrypted_content is not supported: this engine cannot read another server's encrypted reasoning", path)
	}
	var parts []json.RawMessage
	if json.Unmarshal(it.Content, &parts) != nil || len(parts) == 0 {
		return nil, run.BadRequest("%s.content must be a non-empty array of reasoning_text parts", path)
	}
	text, err := partsText(it.Content, path+".content", []string{"reasoning_text"})
	if err != nil {
		return nil, err
	}
	if prev != nil {
		prev.reasoning = text
		return nil, nil
	}
	return &turn{role: "assistant", reasoning: text}, nil
}

// responsesToolFields are a function tool's fields in the Responses shape.
var responsesToolFields = []string{"type", "name", "description", "parameters", "strict"}

// convertResponsesTools sets the chat's tools (the function's fields under
// function, strict true where not given, as llama-server passes them),
// tool_choice and parallel_tool_calls.
func convertResponsesTools(rb Request, chat *request.Body) error {
	for i, raw := range rb.Tools {
		path := fmt.Sprintf("tools[%d]", i)
		var t struct {
			Type string `json:"type"`
		}
		if b := bytes.TrimSpace(raw); len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &t) != nil {
			return run.BadRequest("%s must be a tool object", path)
		}
		if t.Type != "function" {
			return run.BadRequest("%s.type %q is not supported: only function tools are", path, t.Type)
		}
		if err := run.CheckFields(raw, path, responsesToolFields); err != nil {
			return err
		}
		var fn map[string]json.RawMessage
		_ = json.Unmarshal(raw, &fn)
		delete(fn, "type")
		if _, ok := fn["strict"]; !ok {
			fn["strict"] = json.RawMessage("true")
		}
		chat.Tools = append(chat.Tools, request.JSON(map[string]any{"type": "function", "function": fn}))
	}
	chat.ParallelToolCalls = rb.ParallelToolCalls
	tc := bytes.TrimSpace(rb.ToolChoice)
	if len(tc) == 0 || string(tc) == "null" || tc[0] == '"' { // auto, none, required: the chat's own
		if len(tc) > 0 && string(tc) != "null" {
			chat.ToolChoice = request.JSON(json.RawMessage(tc))
		}
		return nil
	}
	var f struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(tc, &f) != nil {
		return run.BadRequest(`tool_choice must be "auto", "none", "required" or {"type":"function","name":…}`)
	}
	if f.Type != "function" {
		return run.BadRequest("tool_choice.type %q is not supported: only function tools are", f.Type)
	}
	if err := run.CheckFields(tc, "tool_choice", []string{"type", "name"}); err != nil {
		return err
	}
	chat.ToolChoice = request.FunctionChoice(f.Name)
	return nil
}

// convertTextFormat sets the chat's response_format from text.format;
// text.verbosity is taken at "medium", the model's own.
func convertTextFormat(rb Request, chat *request.Body) error {
	if rb.Text == nil {
		return nil
	}
	if v := rb.Text.Verbosity; v != nil && *v != "medium" {
		return run.BadRequest("text.verbosity %q is not supported: the model writes as it writes (send \"medium\" or leave it out)", *v)
	}
	raw := bytes.TrimSpace(rb.Text.Format)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var f struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Schema      json.RawMessage `json:"schema"`
		Strict      *bool           `json:"strict"`
		Description string          `json:"description"`
	}
	if raw[0] != '{' || json.Unmarshal(raw, &f) != nil {
		return run.BadRequest("text.format must be an object with a type")
	}
	switch f.Type {
	case "text":
		return run.CheckFields(raw, "text.format", []string{"type"})
	case "json_object":
		chat.ResponseFormat = request.JSON(map[string]any{"type": "json_object"})
		return run.CheckFields(raw, "text.format", []string{"type"})
	case "json_schema":
		if err := run.CheckFields(raw, "text.format", []string{"type", "name", "schema", "strict", "description"}); err != nil {
			return err
		}
		if !isObjectJSON(f.Schema) {
			return run.BadRequest("text.format.schema must be a JSON schema object")
		}
		js := map[string]any{"name": f.Name, "schema": f.Schema}
		if f.Strict != nil {
			js["strict"] = *f.Strict
		}
		chat.ResponseFormat = request.JSON(map[string]any{"type": "json_schema", "json_schema": js})
		return nil
	}
	return run.BadRequest(`text.format.type %q is not "text", "json_object" or "json_schema"`, f.Type)
}

func isObjectJSON(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
}

// convertReasoning sets the chat's reasoning_effort from reasoning.effort,
// as llama-server does. A summary is refused: the reply carries the
// reasoning itself.
func convertReasoning(rb Request, chat *request.Body) error {
	r := rb.Reasoning
	if r == nil {
		return nil
	}
	for name, v := range map[string]json.RawMessage{"summary": r.Summary, "generate_summary": r.GenerateSummary} {
		if v := bytes.TrimSpace(v); len(v) > 0 && string(v) != "null" {
			return run.BadRequest("reasoning.%s is not supported: the output's reasoning item carries the reasoning itself, not a summary", name)
		}
	}
	if r.Effort == nil {
		return nil
	}
	if !slices.Contains(reasoningEfforts, *r.Effort) {
		return run.BadRequest("reasoning.effort must be one of %s, got %q", strings.Join(reasoningEfforts, ", "), *r.Effort)
	}
	chat.ReasoningEffort = r.Effort
	return nil
}
