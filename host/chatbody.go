package host

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// ChatBody is what of an OpenAI chat body makes the prompt and constrains
// the reply: RPC PREFILL and DECODE and the HTTP chat completions read it
// alike, so one body renders one prompt (the same tokens) on every path.
type ChatBody struct {
	Model              string            `json:"model"`
	Messages           []ChatMessage     `json:"messages"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	ChatTemplateKwargs json.RawMessage   `json:"chat_template_kwargs"`
	// ReasoningEffort is OpenAI's, as llama-server reads it: "none" turns
	// the template's thinking off, another level is the template variable
	// reasoning_effort.
	ReasoningEffort *string `json:"reasoning_effort"`
	OutputFields
}

// OutputFields constrain a reply: OpenAI's response_format, llama-server's
// json_schema and grammar (chat and text completions alike).
type OutputFields struct {
	ResponseFormat json.RawMessage `json:"response_format"`
	JSONSchema     json.RawMessage `json:"json_schema"`
	Grammar        *string         `json:"grammar"`
}

// FieldError is a body's fault in the field Param (OpenAI's error param).
type FieldError struct {
	Param string
	Msg   string
}

func (e *FieldError) Error() string { return e.Msg }

func fieldErr(param, format string, args ...any) error {
	return &FieldError{Param: param, Msg: fmt.Sprintf(format, args...)}
}

// Prefill is the prompt of the body for a slot: its messages, tools, tool
// choice and template variables, checked.
func (b *ChatBody) Prefill(slot int, info iface.BackendInfo) (iface.PrefillRequest, error) {
	req := iface.PrefillRequest{Slot: slot, Model: b.Model, ParallelToolCalls: b.ParallelToolCalls}
	if len(b.Messages) == 0 {
		return req, fieldErr("messages", "messages must be a non-empty array")
	}
	if err := CheckMessageCount(len(b.Messages), info); err != nil {
		return req, fieldErr("messages", "%v", err)
	}
	msgs, err := ToMessages(b.Messages)
	if err != nil {
		return req, fieldErr("messages", "%v", err)
	}
	req.Messages = msgs
	names := map[string]bool{}
	for i, t := range b.Tools {
		name, err := toolName(t)
		if err != nil {
			return req, fieldErr(fmt.Sprintf("tools[%d]", i), "tools[%d]: %v", i, err)
		}
		names[name] = true
		req.Tools = append(req.Tools, string(t))
	}
	if req.ToolChoice, req.ToolChoiceName, err = parseToolChoice(b.ToolChoice, names); err != nil {
		return req, err
	}
	if kw := bytes.TrimSpace(b.ChatTemplateKwargs); len(kw) > 0 && string(kw) != "null" {
		if !isObject(kw) {
			return req, fieldErr("chat_template_kwargs", "chat_template_kwargs must be a JSON object")
		}
		req.TemplateKwargs = string(kw)
	}
	if b.ReasoningEffort != nil && *b.ReasoningEffort != "" {
		if req.TemplateKwargs, err = effortKwargs(req.TemplateKwargs, *b.ReasoningEffort); err != nil {
			return req, err
		}
	}
	return req, nil
}

// effortKwargs sets reasoning_effort over the template variables kw (a JSON
// object, "" for none) as llama-server does: "none" is enable_thinking
// false and no reasoning_effort, any other level is reasoning_effort.
func effortKwargs(kw, effort string) (string, error) {
	vars := map[string]json.RawMessage{}
	if kw != "" {
		if err := json.Unmarshal([]byte(kw), &vars); err != nil {
			return "", fieldErr("chat_template_kwargs", "chat_template_kwargs must be a JSON object")
		}
	}
	if effort == "none" {
		delete(vars, "reasoning_effort")
		vars["enable_thinking"] = json.RawMessage("false")
	} else {
		vars["reasoning_effort"], _ = json.Marshal(effort) // a string always marshals
	}
	out, err := json.Marshal(vars)
	return string(out), err
}

// CallsTools reports whether the reply to req may call its tools.
func CallsTools(req iface.PrefillRequest) bool {
	return len(req.Tools) > 0 && req.ToolChoice != "none"
}

// toolName checks an OpenAI tool definition and returns its function's name.
func toolName(raw json.RawMessage) (string, error) {
	var t struct {
		Type     string `json:"type"`
		Function *struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if !isObject(raw) || json.Unmarshal(raw, &t) != nil {
		return "", errors.New("a tool must be a JSON object")
	}
	switch {
	case t.Type != "function":
		return "", fmt.Errorf("type %q is not supported: tools are functions", t.Type)
	case t.Function == nil || t.Function.Name == "":
		return "", errors.New("function.name is required")
	case len(t.Function.Parameters) > 0 && string(t.Function.Parameters) != "null" && !isObject(t.Function.Parameters):
		return "", errors.New("function.parameters must be a JSON schema object")
	}
	return t.Function.Name, nil
}

// parseToolChoice reads tool_choice: "auto", "none", "required" or
// {"type":"function","function":{"name":…}} naming one of the tools.
func parseToolChoice(raw json.RawMessage, tools map[string]bool) (choice, name string, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none":
			return s, "", nil
		case "required":
			if len(tools) == 0 {
				return "", "", fieldErr("tool_choice", `tool_choice "required" needs tools`)
			}
			return s, "", nil
		}
		return "", "", fieldErr("tool_choice", `tool_choice %q is not "auto", "none", "required" or a function`, s)
	}
	var f struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &f) != nil || f.Type != "function" || f.Function.Name == "" {
		return "", "", fieldErr("tool_choice", `tool_choice must be "auto", "none", "required" or {"type":"function","function":{"name":…}}`)
	}
	if !tools[f.Function.Name] {
		return "", "", fieldErr("tool_choice", "tool_choice names function %q, which tools does not define", f.Function.Name)
	}
	return "required", f.Function.Name, nil
}

// Output is what the fields ask of the reply: a JSON schema (from
// response_format or json_schema) or a grammar; nil when they ask nothing.
func (f *OutputFields) Output() (*iface.Output, error) {
	var o iface.Output
	if rf := bytes.TrimSpace(f.ResponseFormat); len(rf) > 0 && string(rf) != "null" {
		var r struct {
			Type       string          `json:"type"`
			Schema     json.RawMessage `json:"schema"`
			JSONSchema *struct {
				Name   string          `json:"name"`
				Schema json.RawMessage `json:"schema"`
				Strict *bool           `json:"strict"`
			} `json:"json_schema"`
		}
		if json.Unmarshal(rf, &r) != nil {
			return nil, fieldErr("response_format", "response_format must be an object with a type")
		}
		switch r.Type {
		case "text":
		case "json_object": // llama-server: a schema given with it, else any object
			o.JSONSchema = `{"type":"object"}`
			if len(r.Schema) > 0 {
				if !isObject(r.Schema) {
					return nil, fieldErr("response_format.schema", "response_format.schema must be a JSON schema object")
				}
				o.JSONSchema = string(r.Schema)
			}
		case "json_schema":
			if r.JSONSchema == nil || !isObject(r.JSONSchema.Schema) {
				return nil, fieldErr("response_format.json_schema.schema", "response_format.json_schema.schema must be a JSON schema object")
			}
			o.JSONSchema = string(r.JSONSchema.Schema)
		default:
			return nil, fieldErr("response_format.type", `response_format.type %q is not "text", "json_object" or "json_schema"`, r.Type)
		}
	}
	if js := bytes.TrimSpace(f.JSONSchema); len(js) > 0 && string(js) != "null" {
		if !isObject(js) {
			return nil, fieldErr("json_schema", "json_schema must be a JSON schema object")
		}
		if o.JSONSchema != "" {
			return nil, fieldErr("json_schema", "json_schema and response_format both give a schema: give one")
		}
		o.JSONSchema = string(js)
	}
	if f.Grammar != nil && strings.TrimSpace(*f.Grammar) != "" {
		if o.JSONSchema != "" {
			return nil, fieldErr("grammar", "grammar and a JSON schema (response_format or json_schema) both constrain the reply: give one")
		}
		o.Grammar = *f.Grammar
	}
	if o.JSONSchema == "" && o.Grammar == "" {
		return nil, nil
	}
	return &o, nil
}

// isObject reports whether raw is a JSON object.
func isObject(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(raw, &m) == nil && m != nil
}
