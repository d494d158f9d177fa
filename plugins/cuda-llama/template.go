package cudallama

import (
	"fmt"
	"maps"
	"os"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/chattmpl"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// defaultTemplate is ChatML as llama-server has it for a model without a
// template (common/chat.cpp's CHATML_TEMPLATE_SRC, byte for byte: a newline
// after each turn).
const defaultTemplate = "{%- for message in messages -%}\n" +
	"  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n" +
	"{%- endfor -%}\n" +
	"{%- if add_generation_prompt -%}\n" +
	"  {{- '<|im_start|>assistant\\n' -}}\n" +
	"{%- endif -%}"

// thinkStart opens a reasoning block; a rendered prompt ending with it
// makes the reply start inside one.
const thinkStart = "<think>"

// chatTemplate renders a model's chat with its Jinja template.
type chatTemplate struct {
	t        *chattmpl.Template
	bos, eos string // the tokens' text, as the template names them
	stripBOS bool   // the tokenizer adds BOS itself: a rendered one is dropped
	kwargs   map[string]any
	// developerAsSystem: OpenAI's "developer" role is rendered as "system",
	// as llama.cpp's common/chat renders it for every template but
	// gpt-oss's (whose harmony format has a developer role of its own).
	developerAsSystem bool
}

// newChatTemplate compiles the template: o's file, else the model's (src),
// else ChatML.
func newChatTemplate(src, bos, eos string, addsBOS bool, o llamaopt.TemplateOptions) (*chatTemplate, error) {
	what := "the model's chat template"
	if o.TemplateFile != "" {
		b, err := os.ReadFile(o.TemplateFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", iface.ErrBadRequest, llamaopt.OptChatTemplateFile, err)
		}
		src, what = string(b), o.TemplateFile
	}
	if src == "" {
		src, what = defaultTemplate, "the default ChatML template"
	}
	t, err := chattmpl.Parse(src)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", iface.ErrBadRequest, what, err)
	}
	kw := maps.Clone(o.TemplateKwargs)
	if o.Reasoning != "" {
		if kw == nil {
			kw = map[string]any{}
		}
		kw["enable_thinking"] = o.Reasoning == "on"
	}
	return &chatTemplate{t: t, bos: bos, eos: eos, stripBOS: addsBOS && bos != "", kwargs: kw,
		developerAsSystem: !strings.Contains(src, "<|channel|>")}, nil
}

// render is the prompt text of a chat, and whether it opens a reasoning
// block for the reply; g marks what the request puts into the prompt.
func (c *chatTemplate) render(msgs []iface.Message, tools []string, reqKwargs string, g contentGuard) (string, bool, error) {
	kw, err := c.mergedKwargs(reqKwargs, g)
	if err != nil {
		return "", false, err
	}
	in := chattmpl.Input{Messages: templateMessages(g.messages(msgs), c.developerAsSystem), AddGenerationPrompt: true,
		BOSToken: c.bos, EOSToken: c.eos, Kwargs: kw}
	if in.Tools, err = g.tools(tools); err != nil {
		return "", false, err
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

// mergedKwargs are the engine's kwargs with the request's, marked by g,
// over them.
func (c *chatTemplate) mergedKwargs(reqKwargs string, g contentGuard) (map[string]any, error) {
	req, err := llamaopt.ParseKwargs(reqKwargs)
	if err != nil {
		return nil, fmt.Errorf("%w: chat_template_kwargs: %v", iface.ErrBadRequest, err)
	}
	req = g.kwargs(req)
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

func templateMessages(msgs []iface.Message, developerAsSystem bool) []chattmpl.Message {
	out := make([]chattmpl.Message, len(msgs))
	for i, m := range msgs {
		out[i] = chattmpl.Message{Role: m.Role, Content: m.Content, ReasoningContent: m.ReasoningContent,
			ToolCallID: m.ToolCallID, Name: m.Name}
		if developerAsSystem && m.Role == "developer" {
			out[i].Role = "system"
		}
		for _, c := range m.ToolCalls {
			out[i].ToolCalls = append(out[i].ToolCalls, chattmpl.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
	}
	return out
}
