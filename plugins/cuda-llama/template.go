package cudallama

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/chattmpl"
)

// Options of the chat template, reasoning and cache reuse.
const (
	// OptJinja: true (the default) renders chat messages with the model's
	// Jinja template (tokenizer.chat_template) or chat_template_file, as
	// llama-server --jinja; false uses llama.cpp's built-in matcher of
	// known templates, for a template the Jinja engine cannot render.
	OptJinja = "jinja"
	// OptChatTemplateFile is a Jinja chat template used instead of the
	// model's.
	OptChatTemplateFile = "chat_template_file"
	// OptChatTemplateKwargs is a JSON object of template variables for
	// every request (a request's chat_template_kwargs win over them).
	OptChatTemplateKwargs = "chat_template_kwargs"
	// OptReasoning: on or off sets the template variable enable_thinking,
	// auto (the default) leaves it to the template.
	OptReasoning = "reasoning"
	// OptCacheReuse: a prompt's chunks of at least this many tokens that a
	// slot's sequence holds later than where the prompt differs are kept and
	// moved into place (KV shifting) instead of evaluated again, as
	// llama-server's --cache-reuse; 0 (the default) keeps the common prefix
	// only.
	OptCacheReuse = "cache_reuse"
)

// templateOptions are the parsed template options; the zero value is the
// default.
type templateOptions struct {
	builtinTemplate bool // jinja=false
	templateFile    string
	templateKwargs  map[string]any
	reasoning       string // "", "on", "off"
	cacheReuse      int
}

func init() {
	optionParsers[OptJinja] = func(o *options, key, v string) error {
		b, err := parseBool(key, v)
		o.builtinTemplate = !b
		return err
	}
	optionParsers[OptChatTemplateFile] = nonEmptyField(func(o *options) *string { return &o.templateFile })
	optionParsers[OptChatTemplateKwargs] = func(o *options, key, v string) error {
		kw, err := parseKwargs(v)
		if err != nil {
			return fmt.Errorf("%w: option %s: %v", iface.ErrBadRequest, key, err)
		}
		o.templateKwargs = kw
		return nil
	}
	optionParsers[OptReasoning] = func(o *options, key, v string) error {
		switch strings.ToLower(v) {
		case "on", "off":
			o.reasoning = strings.ToLower(v)
		case "auto", "":
			o.reasoning = ""
		default:
			return fmt.Errorf("%w: option %s=%q: want on, off or auto", iface.ErrBadRequest, key, v)
		}
		return nil
	}
	optionParsers[OptCacheReuse] = intField(func(o *options) *int { return &o.cacheReuse }, 0, maxNCtx)
}

// parseKwargs reads a JSON object of template variables.
func parseKwargs(v string) (map[string]any, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var kw map[string]any
	if err := json.Unmarshal([]byte(v), &kw); err != nil || kw == nil {
		return nil, fmt.Errorf("not a JSON object: %s", strconv.Quote(v))
	}
	return kw, nil
}

// defaultTemplate is ChatML, llama-server's choice for a model without a
// template.
const defaultTemplate = `{%- for m in messages -%}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant
{% endif -%}`

// thinkStart opens a reasoning block; a rendered prompt ending with it
// makes the reply start inside one.
const thinkStart = "<think>"

// chatTemplate renders a model's chat with its Jinja template.
type chatTemplate struct {
	t        *chattmpl.Template
	bos, eos string // the tokens' text, as the template names them
	stripBOS bool   // the tokenizer adds BOS itself: a rendered one is dropped
	kwargs   map[string]any
}

// newChatTemplate compiles the template: o's file, else the model's (src),
// else ChatML.
func newChatTemplate(src, bos, eos string, addsBOS bool, o templateOptions) (*chatTemplate, error) {
	what := "the model's chat template"
	if o.templateFile != "" {
		b, err := os.ReadFile(o.templateFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", iface.ErrBadRequest, OptChatTemplateFile, err)
		}
		src, what = string(b), o.templateFile
	}
	if src == "" {
		src, what = defaultTemplate, "the default ChatML template"
	}
	t, err := chattmpl.Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", iface.ErrBadRequest, what, err)
	}
	kw := maps.Clone(o.templateKwargs)
	if o.reasoning != "" {
		if kw == nil {
			kw = map[string]any{}
		}
		kw["enable_thinking"] = o.reasoning == "on"
	}
	return &chatTemplate{t: t, bos: bos, eos: eos, stripBOS: addsBOS && bos != "", kwargs: kw}, nil
}

// render is the prompt text of a chat, and whether it opens a reasoning
// block for the reply.
func (c *chatTemplate) render(msgs []iface.Message, tools []string, reqKwargs string) (string, bool, error) {
	kw, err := c.mergedKwargs(reqKwargs)
	if err != nil {
		return "", false, err
	}
	in := chattmpl.Input{Messages: templateMessages(msgs), AddGenerationPrompt: true,
		BOSToken: c.bos, EOSToken: c.eos, Kwargs: kw}
	for _, t := range tools {
		in.Tools = append(in.Tools, json.RawMessage(t))
	}
	text, err := c.t.Render(in)
	if err != nil {
		return "", false, fmt.Errorf("%w: %w", iface.ErrBadRequest, err)
	}
	if c.stripBOS {
		text = strings.TrimPrefix(text, c.bos)
	}
	return text, strings.HasSuffix(strings.TrimRight(text, " \t\r\n"), thinkStart), nil
}

// mergedKwargs are the engine's kwargs with the request's over them.
func (c *chatTemplate) mergedKwargs(reqKwargs string) (map[string]any, error) {
	req, err := parseKwargs(reqKwargs)
	if err != nil {
		return nil, fmt.Errorf("%w: chat_template_kwargs: %v", iface.ErrBadRequest, err)
	}
	if len(req) == 0 {
		return c.kwargs, nil
	}
	kw := maps.Clone(c.kwargs)
	if kw == nil {
		kw = map[string]any{}
	}
	maps.Copy(kw, req)
	return kw, nil
}

func templateMessages(msgs []iface.Message) []chattmpl.Message {
	out := make([]chattmpl.Message, len(msgs))
	for i, m := range msgs {
		out[i] = chattmpl.Message{Role: m.Role, Content: m.Content, ReasoningContent: m.ReasoningContent,
			ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			out[i].ToolCalls = append(out[i].ToolCalls, chattmpl.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
	}
	return out
}
