package openai

import (
	"net/http"

	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// The OpenAI chat and text completion replies: a whole body, or its
// server-sent events (a chunk a delta, the chunk with finish_reason and
// llama-server's timings, the usage chunk where asked for, [DONE]).

// usage is OpenAI's token count, with the prompt tokens kept from the
// slot's sequence as llama-server gives them (prompt_tokens_details).
type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *promptCached `json:"prompt_tokens_details,omitempty"`
}

type promptCached struct {
	CachedTokens int `json:"cached_tokens"`
}

// message and choice cover both response shapes; nil fields are omitted.
type message struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

// toolCall is OpenAI's: whole in a reply; in a streamed delta, index with
// the pieces that came (id, type and name with the first, as llama-server
// streams them).
type toolCall struct {
	Index    *int          `json:"index,omitempty"`
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Function *toolFunction `json:"function,omitempty"`
}

type toolFunction struct {
	Name      string  `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
}

// deltaToolCall is a streamed tool call piece, as
// server_chat_msg_diff_to_json_oaicompat writes it.
func deltaToolCall(d run.ToolPiece) toolCall {
	i := d.Index
	c := toolCall{Index: &i, ID: d.ID}
	if d.ID != "" {
		c.Type = "function"
	}
	if d.Name != "" || d.Args != "" {
		c.Function = &toolFunction{Name: d.Name}
		if d.Args != "" {
			args := d.Args
			c.Function.Arguments = &args
		}
	}
	return c
}

// replyToolCalls are a parsed reply's calls, whole.
func replyToolCalls(calls []iface.ToolCall) []toolCall {
	var out []toolCall
	for _, c := range calls {
		args := c.Arguments
		out = append(out, toolCall{ID: c.ID, Type: "function", Function: &toolFunction{Name: c.Name, Arguments: &args}})
	}
	return out
}

type choice struct {
	Index        int      `json:"index"`
	Message      *message `json:"message,omitempty"` // chat, whole reply
	Delta        *message `json:"delta,omitempty"`   // chat, streamed chunk
	Text         *string  `json:"text,omitempty"`    // text completion
	Logprobs     any      `json:"logprobs"`
	FinishReason *string  `json:"finish_reason"`
}

type completionBody struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []choice     `json:"choices"`
	Usage             *usage       `json:"usage,omitempty"`
	Timings           *run.Timings `json:"timings,omitempty"`
	IDSlot            *int         `json:"id_slot,omitempty"`
	// ModelSwitched: the request named another model, which the engine
	// loaded for it, emptying every slot.
	ModelSwitched bool `json:"model_switched,omitempty"`
}

// Sink writes a completion's events as OpenAI's reply.
type Sink struct {
	w            http.ResponseWriter
	chat         bool
	includeUsage bool
	probs        *tokenProbs // the log-probabilities not yet sent, when asked for

	body    completionBody // the fields every reply and chunk shares
	begun   bool           // the reply is a stream
	pending bool           // the stream starts with its first event (lazy)
	started bool           // SSE headers sent
}

// NewSink is the reply to w of the completion c.
func NewSink(w http.ResponseWriter, c request.Completion) *Sink {
	s := &Sink{w: w, chat: c.Chat, includeUsage: c.IncludeUsage}
	if c.Logprobs {
		s.probs = &tokenProbs{chat: c.Chat}
	}
	return s
}

// setHead fills the fields every reply and chunk shares.
func (s *Sink) setHead(h run.Head) {
	prefix, object := "cmpl-", "text_completion"
	switch {
	case s.chat && s.begun:
		prefix, object = "chatcmpl-", "chat.completion.chunk"
	case s.chat:
		prefix, object = "chatcmpl-", "chat.completion"
	}
	s.body = completionBody{ID: prefix + h.ID, Object: object, Created: h.Created, Model: h.Model,
		SystemFingerprint: h.Fingerprint, ModelSwitched: h.Switched}
}

func (s *Sink) Begin(h run.Head, lazy bool) error {
	s.begun = true
	s.setHead(h)
	if lazy {
		s.pending = true
		return nil
	}
	return s.start()
}

// start sends the SSE headers and, for chat, the role-only first chunk
// OpenAI clients expect.
func (s *Sink) start() error {
	s.pending, s.started = false, true
	run.StartSSE(s.w)
	if !s.chat {
		return http.NewResponseController(s.w).Flush()
	}
	empty := ""
	return s.event(s.chunkBody(&message{Role: "assistant", Content: &empty}, nil, nil))
}

func (s *Sink) Token(t iface.Token) { s.probs.add(t) }

func (s *Sink) Started() bool { return s.started }

func (s *Sink) Delta(d run.Delta) error {
	return d.Each(
		func(r string) error { return s.event(s.chunkBody(&message{ReasoningContent: &r}, nil, nil)) },
		func(c string) error { return s.chunk(c, nil) },
		func(p run.ToolPiece) error {
			return s.event(s.chunkBody(&message{ToolCalls: []toolCall{deltaToolCall(p)}}, nil, nil))
		})
}

func (s *Sink) End(e run.End) error {
	u := &usage{PromptTokens: e.NPrompt, CompletionTokens: e.Generated, TotalTokens: e.NPrompt + e.Generated,
		PromptTokensDetails: &promptCached{CachedTokens: e.Timings.CacheN}}
	slot := e.Slot
	if s.begun {
		return s.finishStream(e.Finish, u, e.Timings, slot)
	}
	s.setHead(e.Head)
	ch := choice{FinishReason: &e.Finish, Logprobs: s.probs.take()}
	if s.chat {
		ch.Message = &message{Role: "assistant", Content: &e.Text}
		if e.Reasoning != "" {
			ch.Message.ReasoningContent = &e.Reasoning
		}
		ch.Message.ToolCalls = replyToolCalls(e.ToolCalls)
	} else {
		ch.Text = &e.Text
	}
	s.body.Choices, s.body.Usage, s.body.Timings, s.body.IDSlot = []choice{ch}, u, e.Timings, &slot
	run.WriteJSON(s.w, http.StatusOK, s.body)
	return nil
}

// finishStream sends the chunk carrying finish_reason (with llama-server's
// timings), the usage chunk if asked for, and [DONE].
func (s *Sink) finishStream(reason string, u *usage, tm *run.Timings, slot int) error {
	var last completionBody
	if s.chat {
		last = s.chunkBody(nil, nil, &reason)
	} else {
		empty := ""
		last = s.chunkBody(nil, &empty, &reason)
	}
	last.Timings, last.IDSlot = tm, &slot
	if err := s.event(last); err != nil {
		return err
	}
	if s.includeUsage {
		ub := s.body
		ub.Choices, ub.Usage = []choice{}, u
		if err := s.event(ub); err != nil {
			return err
		}
	}
	if _, err := s.w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return err
	}
	return http.NewResponseController(s.w).Flush()
}

// Fail writes e as the reply when nothing was sent yet, else as a final
// {"error":…} event, which OpenAI clients raise as an APIError.
func (s *Sink) Fail(e *run.Error) {
	if !s.started {
		run.WriteError(s.w, e)
		return
	}
	_ = s.event(map[string]*run.Error{"error": e})
}

// chunkBody is one streamed chunk with a delta (chat) or text.
func (s *Sink) chunkBody(delta *message, text *string, reason *string) completionBody {
	b := s.body
	ch := choice{Delta: delta, Text: text, FinishReason: reason, Logprobs: s.probs.take()}
	if s.chat && delta == nil {
		ch.Delta = &message{}
	}
	b.Choices = []choice{ch}
	return b
}

// chunk streams a piece of generated text.
func (s *Sink) chunk(text string, reason *string) error {
	if s.chat {
		return s.event(s.chunkBody(&message{Content: &text}, nil, reason))
	}
	return s.event(s.chunkBody(nil, &text, reason))
}

// event writes one SSE event, starting a lazy stream first.
func (s *Sink) event(v any) error {
	if s.pending {
		if err := s.start(); err != nil {
			return err
		}
	}
	return run.Event(s.w, "", v)
}
