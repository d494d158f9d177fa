// Package chattmpl renders a model's Jinja2 chat template (the GGUF key
// tokenizer.chat_template, or an operator's --chat-template-file) into the
// prompt text, with the variables llama-server passes under --jinja:
// messages, tools, add_generation_prompt, bos_token, eos_token, the chat
// template kwargs, and the functions raise_exception and strftime_now.
//
// The engine is github.com/ardanlabs/jinja, because it rendered more of the
// chat-template idioms measured for issue 28 exactly as Python's Jinja2 does
// (HF's trim_blocks/lstrip_blocks, Python-style tojson, string methods,
// unicode slicing) than gonja, with no dependencies of its own.
//
// Known differences from Python's Jinja2 in that engine (v1.8.0, the newest
// that builds with Go 1.26): tojson(indent=N) sorts object keys and escapes
// <, > and &; floats with an integral value print without ".0"; {{ none }}
// prints nothing; a "}}" inside an expression ends it. Templates are trusted
// input (the model's or the operator's), like the model file itself.
package chattmpl

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Message is one chat message as the template sees it, in the OpenAI shape.
type Message struct {
	Role    string
	Content string // may be empty when ToolCalls is set
	// ReasoningContent is an earlier assistant turn's thinking, for templates
	// that can replay it (preserve_thinking).
	ReasoningContent string
	ToolCalls        []ToolCall
	ToolCallID       string // on a tool result: the call it answers
	Name             string // on a tool result: the tool's name
}

// ToolCall is one function call of an assistant message.
type ToolCall struct {
	ID   string
	Type string // "function" when empty
	Name string
	// Arguments is the call's arguments as JSON text; the template receives
	// them parsed, since templates write them with `arguments | tojson`.
	Arguments string
}

// Input is everything one rendering depends on.
type Input struct {
	Messages []Message
	// Tools are OpenAI tool definitions; the template receives them parsed,
	// keys in their original order, as the list `tools`.
	Tools               []json.RawMessage
	AddGenerationPrompt bool
	BOSToken, EOSToken  string
	// Kwargs become top-level variables (enable_thinking, preserve_thinking,
	// ...): the operator's chat-template-kwargs merged with the request's.
	// Values are what encoding/json decodes (nil, bool, float64,
	// json.Number, string, []any, map[string]any), Go ints, or
	// json.RawMessage.
	Kwargs map[string]any
}

// Template is a compiled chat template, safe for concurrent use.
type Template struct {
	tmpl *jinja.Template
	now  func() time.Time // strftime_now's clock
}

// RaisedError is the error of a template that called raise_exception; the
// message is the template's own.
type RaisedError struct {
	Message string
}

func (e *RaisedError) Error() string { return "chat template: " + e.Message }

// errPanic marks a failure inside the engine, reported as an error so that
// one bad template or input cannot take the plugin down.
var errPanic = errors.New("chat template: the template engine failed")

// reserved are the variables Render sets itself, which a kwarg may not
// replace: a request must not rewrite the conversation or the helpers.
var reserved = map[string]bool{
	"messages": true, "tools": true, "add_generation_prompt": true,
	"bos_token": true, "eos_token": true, "raise_exception": true,
	"strftime_now": true, "namespace": true, "range": true, "dict": true,
	"joiner": true, "cycler": true,
}

// Parse compiles a template once for many renderings. A syntax error names
// the line where the engine found it.
func Parse(src string) (*Template, error) {
	t, err := jinja.Compile(src)
	if err != nil {
		return nil, parseError(src, err)
	}
	return &Template{tmpl: t, now: time.Now}, nil
}

// parseError prefixes the engine's message and, for a block still open at
// the end of the template (the one error the engine reports without a line),
// names the last line, where the parser ran out of template.
func parseError(src string, err error) error {
	msg := err.Error()
	if !strings.Contains(msg, "line ") {
		lines := strings.Count(src, "\n") + 1
		return fmt.Errorf("chat template: %s (template ends at line %d)", msg, lines)
	}
	return fmt.Errorf("chat template: %w", err)
}

// Render produces the prompt text. The same input gives the same output,
// except through strftime_now, which reads the local clock.
func (t *Template) Render(in Input) (out string, err error) {
	vars, err := t.vars(in)
	if err != nil {
		return "", err
	}
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("%w: %v", errPanic, r)
		}
	}()
	out, err = t.tmpl.RenderValues(vars)
	if err != nil {
		var raised *RaisedError
		if errors.As(err, &raised) {
			return "", raised
		}
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

// vars builds the template's variables. Kwargs go in first so that nothing
// Render sets itself can be replaced by one.
func (t *Template) vars(in Input) (map[string]jinja.Value, error) {
	vars := make(map[string]jinja.Value, len(in.Kwargs)+8)
	for k, v := range in.Kwargs {
		if reserved[k] {
			return nil, fmt.Errorf("chat template: kwarg %q names a variable the template is given", k)
		}
		val, err := goValue(v)
		if err != nil {
			return nil, fmt.Errorf("chat template: kwarg %q: %w", k, err)
		}
		vars[k] = val
	}
	if len(in.Tools) > 0 {
		tools, err := toolsValue(in.Tools)
		if err != nil {
			return nil, err
		}
		vars["tools"] = tools
	}
	vars["messages"] = messagesValue(in.Messages)
	vars["add_generation_prompt"] = jinja.NewBool(in.AddGenerationPrompt)
	vars["bos_token"] = jinja.NewString(in.BOSToken)
	vars["eos_token"] = jinja.NewString(in.EOSToken)
	vars["raise_exception"] = jinja.NewCallable("raise_exception", raiseException)
	vars["strftime_now"] = jinja.NewCallable("strftime_now", t.strftimeNow)
	return vars, nil
}

// raiseException is the template's way to refuse a conversation; the error
// carries its message to the caller.
func raiseException(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), &RaisedError{Message: "raise_exception called without a message"}
	}
	return jinja.Undefined(), &RaisedError{Message: text(args[0])}
}

// strftimeNow formats the local time with a Python strftime format, as
// templates use it for today's date.
func (t *Template) strftimeNow(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("strftime_now needs a format")
	}
	return jinja.NewString(strftime(t.now(), text(args[0]))), nil
}

// text is a value as the template would print it.
func text(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return v.String()
}
