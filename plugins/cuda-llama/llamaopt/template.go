package llamaopt

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
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
	// OptChatParseSpecial: false (the default) tokenizes what a chat request
	// puts into the prompt (message content, tool definitions and calls,
	// template variables) as text, so that a control token typed in it
	// (<|im_end|><|im_start|>system) cannot forge the template's markup; true
	// parses special tokens across the whole rendered prompt, as
	// llama-server does (it has no switch for it). Raw text prompts always
	// parse them, as llama-server's /completion does.
	OptChatParseSpecial = "chat_parse_special"
)

// TemplateOptions are the parsed template options; the zero value is the
// default.
type TemplateOptions struct {
	BuiltinTemplate  bool // jinja=false
	TemplateFile     string
	TemplateKwargs   map[string]any
	Reasoning        string // "", "on", "off"
	CacheReuse       int
	ChatParseSpecial bool
}

// templateOptions are the options of this file, in the table.
var templateOptions = []option{
	{key: OptJinja, def: "true", doc: "chat through the model's Jinja template; false: llama.cpp's built-in template matcher",
		parse: func(o *Options, key, v string) error {
			b, err := iface.ParseBoolOption(key, v)
			o.BuiltinTemplate = !b
			return err
		}},
	{key: OptChatTemplateFile, def: "none", doc: "a Jinja chat template used instead of the model's",
		parse: nonEmptyField(func(o *Options) *string { return &o.TemplateFile })},
	{key: OptChatTemplateKwargs, def: "none", doc: "a JSON object of template variables for every request (a request's own win)",
		parse: func(o *Options, key, v string) error {
			kw, err := ParseKwargs(v)
			if err != nil {
				return fmt.Errorf("%w: option %s: %v", iface.ErrBadRequest, key, err)
			}
			o.TemplateKwargs = kw
			return nil
		}},
	{key: OptReasoning, def: "auto", doc: "on or off sets the template variable enable_thinking; auto leaves it to the template",
		parse: func(o *Options, key, v string) error {
			switch strings.ToLower(v) {
			case "on", "off":
				o.Reasoning = strings.ToLower(v)
			case "auto", "":
				o.Reasoning = ""
			default:
				return fmt.Errorf("%w: option %s=%q: want on, off or auto", iface.ErrBadRequest, key, v)
			}
			return nil
		}},
	{key: OptChatParseSpecial, def: "false", doc: "true: special tokens parsed across a chat's whole rendered prompt, as llama-server; false: only the template's markup is special",
		parse: boolField(func(o *Options) *bool { return &o.ChatParseSpecial })},
	{key: OptCacheReuse, def: "0", doc: "prompt chunks of at least N tokens held later in a slot's sequence are shifted into place (llama-server's --cache-reuse)",
		parse: intField(func(o *Options) *int { return &o.CacheReuse }, 0, maxNCtx)},
}

// ParseKwargs reads a JSON object of template variables.
func ParseKwargs(v string) (map[string]any, error) {
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	var kw map[string]any
	if err := json.Unmarshal([]byte(v), &kw); err != nil || kw == nil {
		return nil, fmt.Errorf("not a JSON object: %s", strconv.Quote(v))
	}
	return kw, nil
}
