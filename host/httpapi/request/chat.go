package request

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Chat is the chat completion request a dialect's converter makes of its
// body: the engine's body, typed, and Passed, the engine's own fields the
// dialect passes on as its client sent them (llama-server's pass-through),
// which are decoded where a chat body's fields are.
type Chat struct {
	Body
	Passed map[string]json.RawMessage
}

// Decode is the body Decode would read from the chat completion body c
// stands for: its messages counted first, then its passed fields decoded in
// their keys' order, each compacted as encoding/json writes a value (the
// template variables reach the backend in that form).
func (c Chat) Decode(info iface.BackendInfo) (Body, error) {
	req := c.Body
	if err := checkMessageCount(len(req.Messages), info); err != nil {
		return req, badRequest("%v", err)
	}
	for _, k := range slices.Sorted(maps.Keys(c.Passed)) {
		v, err := json.Marshal(c.Passed[k])
		if err == nil {
			err = run.DecodeField(&req, k, v)
		}
		if err != nil {
			return req, err
		}
	}
	return req, nil
}

// checkMessageCount is host.CheckMessageCountJSON's check on n messages: a
// count past the slot's size is given as one past it, where that scan stops.
func checkMessageCount(n int, info iface.BackendInfo) error {
	return host.CheckMessageCount(min(n, info.SlotCtx()+1), info)
}

// ParseChat is Parse of the chat completion body a dialect's converter
// made.
func ParseChat(c Chat, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (Completion, error) {
	req, err := c.Decode(info)
	if err != nil {
		return Completion{}, err
	}
	return parse(req, true, sampler, nPredict, info)
}

// TextMessage is a chat message of text.
func TextMessage(role, text string) host.ChatMessage {
	return host.ChatMessage{Role: role, Content: JSON(text)}
}

// ToolCall is an assistant message's call of function name, its arguments
// JSON text.
func ToolCall(id, name, arguments string) host.ChatToolCall {
	c := host.ChatToolCall{ID: id, Type: "function"}
	c.Function.Name, c.Function.Arguments = name, JSON(arguments)
	return c
}

// FunctionChoice is the tool_choice that calls function name.
func FunctionChoice(name string) json.RawMessage {
	return JSON(map[string]any{"type": "function", "function": map[string]any{"name": name}})
}

// JSON is v as a value of the body's raw fields (a message's content, a
// tool, the stops, the template variables), written as encoding/json writes
// it; v is a value of JSON types, which always encodes.
func JSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}
