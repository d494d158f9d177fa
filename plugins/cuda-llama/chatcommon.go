//go:build llama && cgo

package cudallama

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// The Go side of chatcommon.cpp: llama.cpp's common library decides a chat
// reply's grammar and parses it, as llama-server does. The prompt itself is
// rendered by chatTemplate (the Go Jinja engine) so that PREFILL, Tokenize
// and a decode's prompt stay one rendering with the content guard the
// tokenizer relies on; common_chat_templates_apply renders the same template
// with the same inputs, and its format, grammar and parser come from that
// rendering (TestChatCommonPromptMatches holds the two renderings equal).

// chatCommon is a model's chat templates in llama.cpp's common library.
type chatCommon struct{ c *llama.Chat }

// newChatCommon loads the model's templates, or the chat_template_file's.
func newChatCommon(m *model, templateFile string) (*chatCommon, error) {
	tmpl := ""
	if templateFile != "" {
		b, err := os.ReadFile(templateFile)
		if err != nil {
			return nil, err
		}
		tmpl = string(b)
	}
	c, err := llama.NewChat(m.m, tmpl)
	if err != nil {
		return nil, err
	}
	return &chatCommon{c: c}, nil
}

// source is the template's source, as llama-server's /props has it.
func (c *chatCommon) source() string { return c.c.Source() }

// apply is common_chat_templates_apply for a request (newCommonChatRequest).
func (c *chatCommon) apply(req []byte) (chatParams, error) {
	out, err := c.c.Apply(req)
	if err != nil {
		return chatParams{}, fmt.Errorf("%w: %v", iface.ErrBadRequest, err)
	}
	var p chatParams
	err = json.Unmarshal(out, &p)
	return p, err
}

// jsonSchemaGrammar is a JSON schema's GBNF (json-schema-to-grammar).
func jsonSchemaGrammar(schema string) (string, error) {
	g, err := llama.JSONSchemaGrammar(schema)
	if err != nil {
		return "", fmt.Errorf("%w: json_schema: %v", iface.ErrBadRequest, err)
	}
	return g, nil
}

// checkGrammar parses a GBNF grammar, naming its fault.
func checkGrammar(g string) error {
	if err := llama.CheckGrammar(g); err != nil {
		return fmt.Errorf("%w: grammar: %v", iface.ErrBadRequest, err)
	}
	return nil
}

// chatParser is one reply's parser (llama.ChatParser).
type chatParser struct{ p *llama.ChatParser }

func newChatParser(spec parserSpec) (*chatParser, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	p, err := llama.NewChatParser(b)
	if err != nil {
		return nil, fmt.Errorf("the chat template's reply parser: %v", err)
	}
	return &chatParser{p: p}, nil
}

func (p *chatParser) free() { p.p.Free() }

// add appends text to the reply and parses it all (partial: more may come).
func (p *chatParser) add(text string, partial bool) (*parsed, error) {
	out, err := p.p.Add(text, partial)
	if err != nil {
		return nil, err
	}
	var r parsed
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// outputRun is a decode's Output in flight: the grammar its sampler
// takes, and the parser and stop strings its reply goes through.
type outputRun struct {
	grammar *grammarSpec
	budget  *budgetSpec      // the reasoning budget's sampler, nil: none
	parser  *chatParser      // nil: the reply is not parsed
	generic *strings.Builder // a generic call's text (genericRun), parsed at the end
	text    *replyText
	last    *parsed // the last parse, what stands if the final one fails
}

// errOutputStop ends a decode whose reply reached a stop string.
var errOutputStop = errors.New("stop string reached")

// newOutputRun checks and prepares o; nil without one. Every fault of the
// request is an ErrBadRequest naming the field.
func (e *engine) newOutputRun(o *iface.Output) (*outputRun, error) {
	if o == nil {
		return nil, nil
	}
	if o.JSONSchema != "" && o.Grammar != "" {
		return nil, fmt.Errorf("%w: json_schema and grammar: give one of them", iface.ErrBadRequest)
	}
	if b := o.ReasoningBudget; b != nil && o.Chat == nil {
		return nil, fmt.Errorf("%w: a reasoning budget bounds a chat reply's reasoning (output.chat)", iface.ErrBadRequest)
	} else if b != nil && b.Tokens < 0 {
		return nil, fmt.Errorf("%w: a reasoning budget of %d tokens: want 0 or more", iface.ErrBadRequest, b.Tokens)
	}
	if o.Chat == nil {
		if len(o.Stops) > 0 {
			return nil, fmt.Errorf("%w: output stops are for a parsed chat reply (output.chat)", iface.ErrBadRequest)
		}
		g, err := plainGrammar(o)
		return &outputRun{grammar: g}, err
	}
	if e.chatc == nil {
		return nil, fmt.Errorf("%w: tool calls and parsed chat replies need llama.cpp's chat templates, which this model's template does not load in (jinja=false, or the template failed at load: see the log)", iface.ErrNotImplemented)
	}
	tools := len(o.Chat.Tools) > 0 && o.Chat.ToolChoice != "none"
	if o.Grammar != "" && tools {
		return nil, fmt.Errorf("%w: grammar cannot be combined with tools (tool calls have their own grammar)", iface.ErrBadRequest)
	}
	kwargs, err := e.templateKwargs(o.Chat.TemplateKwargs)
	if err != nil {
		return nil, err
	}
	choice := toolChoice(*o.Chat)
	required := tools && choice == "required"
	if required { // the tool-call grammar of auto, which required takes from its root (requiredGrammar)
		choice = "auto"
	}
	p, err := e.applyChat(*o.Chat, choice, kwargs, o)
	if err != nil {
		return nil, err
	}
	r := &outputRun{text: newReplyText(o.Stops, p.AdditionalStops)}
	switch {
	case o.Grammar != "": // the client's grammar, as given: not started after the generation prompt
		if r.grammar, err = plainGrammar(o); err != nil {
			return nil, err
		}
	case required && p.Grammar != "" && p.GrammarLazy:
		r.grammar = &grammarSpec{Grammar: requiredGrammar(p.Grammar)}
	case required:
		if p, err = e.applyChat(*o.Chat, "required", kwargs, o); err != nil {
			return nil, err
		}
		if p.Grammar == "" { // the template writes no tool calls: a generic JSON call
			r, err = e.genericRun(o, r)
			if err == nil {
				r.budget = reasoningBudget(p, o.ReasoningBudget, r.grammar)
			}
			return r, err
		}
		r.grammar = chatGrammar(p, true)
	default:
		r.grammar = chatGrammar(p, false)
	}
	r.budget = reasoningBudget(p, o.ReasoningBudget, r.grammar)
	if r.parser, err = newChatParser(parserSpec{Format: p.Format, GenerationPrompt: p.GenerationPrompt, Parser: p.Parser}); err != nil {
		return nil, err
	}
	e.log.Debug("chat reply format", "format", p.FormatName, "grammar", r.grammar != nil, "lazy", r.grammar != nil && r.grammar.Lazy,
		"thinking", p.ThinkingStart, "reasoning_budget", r.budget != nil)
	return r, nil
}

// applyChat is common_chat_templates_apply for chat, with tool choice choice.
func (e *engine) applyChat(chat iface.PrefillRequest, choice string, kwargs map[string]any, o *iface.Output) (chatParams, error) {
	req, err := newCommonChatRequest(chat, choice, kwargs, o)
	if err != nil {
		return chatParams{}, err
	}
	return e.chatc.apply(req)
}

// genericRun is a required call for a template without tool calls of its
// own: the reply is genericCallSchema's JSON, read whole at the end.
func (e *engine) genericRun(o *iface.Output, r *outputRun) (*outputRun, error) {
	var tools []string
	for _, t := range o.Chat.Tools {
		if o.Chat.ToolChoiceName == "" || toolName(t) == o.Chat.ToolChoiceName {
			tools = append(tools, t)
		}
	}
	parallel := o.Chat.ParallelToolCalls != nil && *o.Chat.ParallelToolCalls
	schema, err := genericCallSchema(tools, parallel)
	if err != nil {
		return nil, err
	}
	g, err := jsonSchemaGrammar(schema)
	if err != nil {
		return nil, err
	}
	r.grammar, r.generic = &grammarSpec{Grammar: g}, &strings.Builder{}
	e.log.Debug("chat reply format: generic tool call (the template writes none)")
	return r, nil
}

// plainGrammar is the grammar of a reply read as text: the schema's or the
// client's own, checked.
func plainGrammar(o *iface.Output) (*grammarSpec, error) {
	switch {
	case o.JSONSchema != "":
		g, err := jsonSchemaGrammar(o.JSONSchema)
		if err != nil {
			return nil, err
		}
		return &grammarSpec{Grammar: g}, nil
	case o.Grammar != "":
		if err := checkGrammar(o.Grammar); err != nil {
			return nil, err
		}
		return &grammarSpec{Grammar: o.Grammar}, nil
	}
	return nil, nil
}

// templateKwargs are the engine's template variables with the request's
// over them, as the prompt was rendered with.
func (e *engine) templateKwargs(reqKwargs string) (map[string]any, error) {
	req, err := llamaopt.ParseKwargs(reqKwargs)
	if err != nil {
		return nil, fmt.Errorf("%w: chat_template_kwargs: %v", iface.ErrBadRequest, err)
	}
	kw := map[string]any{}
	if e.chat != nil {
		maps.Copy(kw, e.chat.kwargs)
	}
	maps.Copy(kw, req)
	return kw, nil
}

// attach gives the sampler the run's grammar and reasoning budget.
func (r *outputRun) attach(m *model, s *sampler) error {
	if r == nil {
		return nil
	}
	if r.grammar != nil {
		spec, err := json.Marshal(r.grammar)
		if err != nil {
			return err
		}
		g, err := llama.NewGrammar(m.vocab, spec)
		if err != nil {
			return fmt.Errorf("%w: grammar: %v", iface.ErrBadRequest, err)
		}
		s.c.SetGrammar(g)
	}
	if r.budget != nil {
		spec, err := json.Marshal(r.budget)
		if err != nil {
			return err
		}
		rb, err := llama.NewReasoningBudget(m.vocab, spec)
		if err != nil {
			return fmt.Errorf("the reasoning budget: %v", err)
		}
		s.c.SetReasoningBudget(rb, r.grammar != nil && r.grammar.Lazy)
	}
	return nil
}

// wrap passes each token on with what it added to the parsed reply, and
// ends the decode at a stop string.
func (r *outputRun) wrap(emit func(iface.Token) error) func(iface.Token) error {
	if r == nil || (r.parser == nil && r.generic == nil) {
		return emit
	}
	return func(t iface.Token) error {
		text, stopped := r.text.push(t.Text)
		if r.generic != nil {
			r.generic.WriteString(text)
		} else if text != "" {
			p, err := r.parser.add(text, true)
			if err != nil {
				return err
			}
			t.Deltas, r.last = p.deltas(), p
		}
		if err := emit(t); err != nil {
			return err
		}
		if stopped {
			return errOutputStop
		}
		return nil
	}
}

// finish ends the run: the final parse's deltas and reply go into the
// result, and a stop string's end is a stop, not an error.
func (r *outputRun) finish(e *engine, res iface.DecodeResult, err error) (iface.DecodeResult, error) {
	if r == nil {
		return res, err
	}
	if r.parser != nil {
		defer r.parser.free()
	}
	if errors.Is(err, errOutputStop) {
		res.StopReason, err = iface.StopString, nil
	}
	if err != nil || (r.parser == nil && r.generic == nil) {
		return res, err
	}
	rest := ""
	if !r.text.stopped {
		rest = r.text.rest()
	}
	if r.generic != nil {
		return r.finishGeneric(e, res, r.generic.String()+rest), nil
	}
	p, perr := r.parser.add(rest, false)
	switch {
	case perr == nil:
		res.Deltas = p.deltas()
	case r.last != nil: // what the partial parses found stands, as it was streamed
		e.log.Warn("the reply does not parse as its chat template's format", "error", perr)
		p = r.last
	default:
		e.log.Warn("the reply does not parse as its chat template's format", "error", perr)
		p = &parsed{}
	}
	res.Message = p.reply()
	return res, nil
}

// finishGeneric reads a generic call's reply: its calls, or the text as
// content where it is no call (the decode ended inside one).
func (r *outputRun) finishGeneric(e *engine, res iface.DecodeResult, text string) iface.DecodeResult {
	calls, err := genericCalls(text, newToolCallID)
	if err != nil {
		e.log.Warn("the reply is no complete tool call", "error", err)
		res.Message = &iface.ChatReply{Content: text}
		res.Deltas = []iface.ChatDelta{{Content: text, ToolCall: -1}}
		return res
	}
	res.Message = &iface.ChatReply{ToolCalls: calls}
	for i, c := range calls {
		res.Deltas = append(res.Deltas, iface.ChatDelta{ToolCall: i, ToolID: c.ID, ToolName: c.Name, ToolArgs: c.Arguments})
	}
	return res
}
