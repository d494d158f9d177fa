package cudallama

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

// templateOptions are the parsed template options; the zero value is the
// default.
type templateOptions struct {
	builtinTemplate  bool // jinja=false
	templateFile     string
	templateKwargs   map[string]any
	reasoning        string // "", "on", "off"
	cacheReuse       int
	chatParseSpecial bool
}

// templateParsers are the options of this file, merged into optionParsers.
var templateParsers = map[string]optionParser{
	OptJinja: func(o *options, key, v string) error {
		b, err := iface.ParseBoolOption(key, v)
		o.builtinTemplate = !b
		return err
	},
	OptChatTemplateFile: nonEmptyField(func(o *options) *string { return &o.templateFile }),
	OptChatTemplateKwargs: func(o *options, key, v string) error {
		kw, err := parseKwargs(v)
		if err != nil {
			return fmt.Errorf("%w: option %s: %v", iface.ErrBadRequest, key, err)
		}
		o.templateKwargs = kw
		return nil
	},
	OptReasoning: func(o *options, key, v string) error {
		switch strings.ToLower(v) {
		case "on", "off":
			o.reasoning = strings.ToLower(v)
		case "auto", "":
			o.reasoning = ""
		default:
			return fmt.Errorf("%w: option %s=%q: want on, off or auto", iface.ErrBadRequest, key, v)
		}
		return nil
	},
	OptChatParseSpecial: boolField(func(o *options) *bool { return &o.chatParseSpecial }),
	OptCacheReuse:       intField(func(o *options) *int { return &o.cacheReuse }, 0, maxNCtx),
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
