package cudallama

import (
	"encoding/json"
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/prompt"
)

// contentGuard marks everything a request puts into a chat prompt (message
// fields, tool definitions, template variables) with a marker fresh for the
// prompt, so that the control tokens it spells stay text once the template
// has rendered it and the prompt is split at special tokens: a user cannot
// forge the template's markup (a system turn). The zero value marks nothing:
// chat_parse_special=true, llama-server's way.
type contentGuard struct {
	v *prompt.Vocab
	m prompt.Marker
}

// newContentGuard is the guard of one chat prompt; parseSpecial leaves the
// content's control tokens special, as llama-server does.
func newContentGuard(v *prompt.Vocab, parseSpecial bool) contentGuard {
	if parseSpecial || v == nil {
		return contentGuard{}
	}
	return contentGuard{v: v, m: prompt.NewMarker()}
}

// text is s marked.
func (g contentGuard) text(s string) string {
	if g.m == "" {
		return s
	}
	return g.v.Protect(s, g.m)
}

// messages is msgs with every text a template may write out marked: roles,
// content, reasoning, names, call ids, and tool calls' arguments (as JSON
// where they are JSON, since templates parse them).
func (g contentGuard) messages(msgs []iface.Message) []iface.Message {
	if g.m == "" {
		return msgs
	}
	out := make([]iface.Message, len(msgs))
	for i, m := range msgs {
		m.Role, m.Content, m.ReasoningContent = g.text(m.Role), g.text(m.Content), g.text(m.ReasoningContent)
		m.ToolCallID, m.Name = g.text(m.ToolCallID), g.text(m.Name)
		if len(m.ToolCalls) > 0 {
			calls := make([]iface.ToolCall, len(m.ToolCalls))
			for k, c := range m.ToolCalls {
				c.ID, c.Name, c.Arguments = g.text(c.ID), g.text(c.Name), g.arguments(c.Arguments)
				calls[k] = c
			}
			m.ToolCalls = calls
		}
		out[i] = m
	}
	return out
}

// arguments marks a tool call's arguments: as JSON where they are (the
// template parses them), else as text (the template writes them as they
// are).
func (g contentGuard) arguments(s string) string {
	if !json.Valid([]byte(s)) {
		return g.text(s)
	}
	b, err := g.v.ProtectJSON([]byte(s), g.m)
	if err != nil { // valid JSON nested beyond ProtectJSON's depth: the template cannot parse it either
		return g.text(s)
	}
	return string(b)
}

// tools marks the tool definitions, which are JSON the template parses.
func (g contentGuard) tools(tools []string) ([]json.RawMessage, error) {
	if len(tools) == 0 {
		return nil, nil
	}
	out := make([]json.RawMessage, len(tools))
	for i, t := range tools {
		out[i] = json.RawMessage(t)
		if g.m == "" {
			continue
		}
		b, err := g.v.ProtectJSON([]byte(t), g.m)
		if err != nil {
			return nil, fmt.Errorf("%w: tool %d: %v", iface.ErrBadRequest, i, err)
		}
		out[i] = b
	}
	return out, nil
}

// kwargs marks a request's template variables (the operator's are not the
// request's and stay as they are).
func (g contentGuard) kwargs(kw map[string]any) map[string]any {
	if g.m == "" || kw == nil {
		return kw
	}
	return g.v.ProtectValue(kw, g.m).(map[string]any)
}
