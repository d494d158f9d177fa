package chattmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/ardanlabs/jinja"
)

// messagesValue exposes the messages as llama-server does: OpenAI-shaped
// mappings whose optional keys are present only when set, in the key order
// llama.cpp builds them (role, content, reasoning_content, name,
// tool_call_id, tool_calls), since a template may print a whole message.
func messagesValue(msgs []Message) jinja.Value {
	items := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		items[i] = messageValue(m)
	}
	return jinja.NewList(items)
}

func messageValue(m Message) jinja.Value {
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	d.Set("content", contentValue(m))
	setIf(d, "reasoning_content", m.ReasoningContent)
	setIf(d, "name", m.Name)
	setIf(d, "tool_call_id", m.ToolCallID)
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			calls[i] = toolCallValue(c)
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	return v
}

// contentValue is the message's text; an assistant message that only calls
// tools gets "" as llama.cpp's common/chat gives it (not none), since
// templates such as Qwen3's call content's string methods unguarded.
func contentValue(m Message) jinja.Value {
	return jinja.NewString(m.Content)
}

func setIf(d *jinja.Dict, key, s string) {
	if s != "" {
		d.Set(key, jinja.NewString(s))
	}
}

// toolCallValue is {"type", "function": {"name", "arguments"}, "id"}, the
// arguments parsed from their JSON text; arguments that are not JSON reach
// the template as the text itself, and empty ones as an empty object.
func toolCallValue(c ToolCall) jinja.Value {
	typ := c.Type
	if typ == "" {
		typ = "function"
	}
	fn := jinja.NewDict()
	fn.AsDict().Set("name", jinja.NewString(c.Name))
	fn.AsDict().Set("arguments", argumentsValue(c.Arguments))
	v := jinja.NewDict()
	v.AsDict().Set("type", jinja.NewString(typ))
	v.AsDict().Set("function", fn)
	setIf(v.AsDict(), "id", c.ID)
	return v
}

func argumentsValue(args string) jinja.Value {
	if strings.TrimSpace(args) == "" {
		return jinja.NewDict()
	}
	v, err := jsonValue([]byte(args))
	if err != nil {
		return jinja.NewString(args)
	}
	return v
}

// toolsValue parses the tool definitions; a definition that is not JSON is
// the caller's error, not something to hand the template.
func toolsValue(tools []json.RawMessage) (jinja.Value, error) {
	items := make([]jinja.Value, len(tools))
	for i, raw := range tools {
		v, err := jsonValue(raw)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("chat template: tool %d: %w", i, err)
		}
		items[i] = v
	}
	return jinja.NewList(items), nil
}

// jsonValue decodes one JSON value keeping object keys in their order, as
// llama-server's ordered JSON does, because tojson prints them in that order.
// json.Valid comes first: it bounds the nesting depth the decoder recurses
// into, and rejects trailing data.
func jsonValue(data []byte) (jinja.Value, error) {
	if !json.Valid(data) {
		return jinja.Undefined(), invalidJSON(data)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return decodeValue(dec)
}

// invalidJSON says what is wrong with data, which json.Valid refused.
func invalidJSON(data []byte) error {
	var probe any
	if err := json.Unmarshal(data, &probe); err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return fmt.Errorf("invalid JSON")
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return decodeObject(dec)
		}
		return decodeArray(dec)
	case json.Number:
		return numberValue(t), nil
	default:
		return scalarValue(t), nil
	}
}

func decodeObject(dec *json.Decoder) (jinja.Value, error) {
	v := jinja.NewDict()
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return jinja.Undefined(), err
		}
		item, err := decodeValue(dec)
		if err != nil {
			return jinja.Undefined(), err
		}
		v.AsDict().Set(key.(string), item)
	}
	return v, closeDelim(dec)
}

func decodeArray(dec *json.Decoder) (jinja.Value, error) {
	var items []jinja.Value
	for dec.More() {
		item, err := decodeValue(dec)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, item)
	}
	return jinja.NewList(items), closeDelim(dec)
}

func closeDelim(dec *json.Decoder) error {
	if _, err := dec.Token(); err != nil && err != io.EOF {
		return err
	}
	return nil
}

// numberValue keeps integers integers (as Python's json does), so tojson
// writes 3 back as 3.
func numberValue(n json.Number) jinja.Value {
	if !strings.ContainsAny(string(n), ".eE") {
		if i, err := n.Int64(); err == nil {
			return jinja.NewInt(i)
		}
	}
	f, _ := n.Float64()
	return jinja.NewFloat(f)
}

func scalarValue(tok json.Token) jinja.Value {
	switch t := tok.(type) {
	case bool:
		return jinja.NewBool(t)
	case string:
		return jinja.NewString(t)
	}
	return jinja.None()
}

// goValue converts a kwarg. Map keys are sorted so that a map, whose Go
// order is random, renders the same every time; a float64 with an integral
// value becomes an integer, since encoding/json decodes every JSON number,
// 1024 included, as float64.
func goValue(v any) (jinja.Value, error) {
	switch t := v.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case int:
		return jinja.NewInt(int64(t)), nil
	case int64:
		return jinja.NewInt(t), nil
	case float64:
		return floatValue(t), nil
	case json.Number:
		return numberValue(t), nil
	case json.RawMessage:
		return jsonValue(t)
	case []any:
		return listValue(t)
	case map[string]any:
		return mapValue(t)
	}
	return jinja.Undefined(), fmt.Errorf("unsupported type %T", v)
}

func floatValue(f float64) jinja.Value {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return jinja.NewInt(int64(f))
	}
	return jinja.NewFloat(f)
}

func listValue(l []any) (jinja.Value, error) {
	items := make([]jinja.Value, len(l))
	for i, x := range l {
		v, err := goValue(x)
		if err != nil {
			return jinja.Undefined(), err
		}
		items[i] = v
	}
	return jinja.NewList(items), nil
}

func mapValue(m map[string]any) (jinja.Value, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	v := jinja.NewDict()
	for _, k := range keys {
		item, err := goValue(m[k])
		if err != nil {
			return jinja.Undefined(), err
		}
		v.AsDict().Set(k, item)
	}
	return v, nil
}
