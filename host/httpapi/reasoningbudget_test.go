package httpapi

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/iface"
)

// reasoningServer is a server over the parsing mock (parsingBackend) that
// says it bounds reasoning, with opts.
func reasoningServer(t *testing.T, opts Options) (*iface.DecodeRequest, http.Handler) {
	t.Helper()
	m, info := loadMock(t, 1)
	got := &iface.DecodeRequest{}
	info.Capabilities = append(info.Capabilities, iface.CapOutput, iface.CapReasoningBudget)
	s := host.NewServer(&parsingBackend{Backend: m, got: got}, info, nil, host.Config{})
	t.Cleanup(s.Close)
	return got, Handler(s, opts)
}

// TestReasoningBudgetRequest: the budget a chat reply gets is the request's
// reasoning_budget_tokens, else its thinking_budget_tokens, else (also for
// -1) the engine's, with reasoning_budget_message over the engine's
// message, as llama-server reads them; Anthropic's thinking.budget_tokens
// is one too. A budget makes the reply a parsed one; a text completion, a
// budget the token limit reaches first, and none at all send none.
func TestReasoningBudgetRequest(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	eight := int32(8)
	for _, c := range []struct {
		opts       Options
		path, body string
		want       *iface.ReasoningBudget
	}{
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"reasoning_budget_tokens":5}`, &iface.ReasoningBudget{Tokens: 5}},
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"reasoning_budget_tokens":0}`, &iface.ReasoningBudget{Tokens: 0}},
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"thinking_budget_tokens":7,"reasoning_budget_message":"Now answer."}`,
			&iface.ReasoningBudget{Tokens: 7, Message: "Now answer."}},
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"reasoning_budget_tokens":3,"thinking_budget_tokens":9}`, &iface.ReasoningBudget{Tokens: 3}},
		{Options{ReasoningBudget: &eight, ReasoningBudgetMessage: "Stop."}, "/v1/chat/completions", `{` + msgs + `}`,
			&iface.ReasoningBudget{Tokens: 8, Message: "Stop."}},
		{Options{ReasoningBudget: &eight, ReasoningBudgetMessage: "Stop."}, "/v1/chat/completions", `{` + msgs + `,"reasoning_budget_tokens":-1}`,
			&iface.ReasoningBudget{Tokens: 8, Message: "Stop."}},
		{Options{ReasoningBudgetMessage: "Stop."}, "/v1/chat/completions", `{` + msgs + `,"reasoning_budget_tokens":2,"reasoning_budget_message":""}`,
			&iface.ReasoningBudget{Tokens: 2}},
		{Options{}, "/v1/messages", `{` + msgs + `,"max_tokens":500,"thinking":{"type":"enabled","budget_tokens":100}}`, &iface.ReasoningBudget{Tokens: 100}},
		{Options{}, "/v1/chat/completions", `{` + msgs + `}`, nil},
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"reasoning_budget_tokens":-1}`, nil},
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"max_tokens":3,"reasoning_budget_tokens":3}`, nil},
		{Options{ReasoningBudget: &eight}, "/v1/completions", `{"prompt":"hi","reasoning_budget_tokens":2}`, nil},
		{Options{}, "/v1/messages", `{` + msgs + `,"max_tokens":100,"thinking":{"type":"enabled","budget_tokens":100}}`, nil},
	} {
		got, h := reasoningServer(t, c.opts)
		if rec := post(h, c.path, c.body); rec.Code != 200 {
			t.Errorf("%s %s: %d %s", c.path, c.body, rec.Code, rec.Body)
			continue
		}
		o := got.Output
		if c.want == nil {
			if o != nil {
				t.Errorf("%s %s: output %+v, want none", c.path, c.body, *o)
			}
			continue
		}
		if o == nil || o.Chat == nil || len(o.Chat.Messages) != 1 || !reflect.DeepEqual(o.ReasoningBudget, c.want) {
			t.Errorf("%s %s: output %+v, want a parsed chat with budget %+v", c.path, c.body, o, *c.want)
		}
		if c.path == "/v1/messages" && (o == nil || o.Chat == nil || o.Chat.TemplateKwargs != `{"enable_thinking":true}`) {
			t.Errorf("%s %s: the chat's kwargs are not thinking's", c.path, c.body)
		}
	}
}

// TestReasoningBudgetRefused: a budget that is no integer, or below -1, is
// a 400 naming its field; a backend that cannot bound the reasoning (the
// mock) answers 501 saying so rather than let it run on, the engine's
// budget included, unless the token limit comes first.
func TestReasoningBudgetRefused(t *testing.T) {
	_, info := loadMock(t, 1)
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for body, param := range map[string]string{
		`"reasoning_budget_tokens":-2`:   "reasoning_budget_tokens",
		`"reasoning_budget_tokens":1.5`:  "reasoning_budget_tokens",
		`"reasoning_budget_tokens":"5"`:  "reasoning_budget_tokens",
		`"thinking_budget_tokens":-7`:    "thinking_budget_tokens",
		`"thinking_budget_tokens":1e12`:  "thinking_budget_tokens",
		`"reasoning_budget_message":5`:   "reasoning_budget_message",
		`"reasoning_effort":["high"]`:    "reasoning_effort",
		`"reasoning_budget_tokens":true`: "reasoning_budget_tokens",
	} {
		_, err := request.Parse([]byte(`{`+msgs+`,`+body+`}`), true, iface.SamplerParams{}, 16, info)
		e, ok := err.(*apiError)
		if !ok || e.Status != 400 || e.Param != param {
			t.Errorf("%s: %v, want a 400 naming %s", body, err, param)
		}
	}
	zero := int32(0)
	for _, c := range []struct {
		opts       Options
		path, body string
		code       int
	}{
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"reasoning_budget_tokens":0}`, 501},
		{Options{ReasoningBudget: &zero}, "/v1/chat/completions", `{` + msgs + `}`, 501},
		{Options{}, "/v1/messages", `{` + msgs + `,"max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024}}`, 501},
		{Options{}, "/v1/chat/completions", `{` + msgs + `,"max_tokens":2,"reasoning_budget_tokens":2}`, 200},
		{Options{ReasoningBudget: &zero}, "/v1/completions", `{"prompt":"hi","max_tokens":2}`, 200},
		{Options{}, "/v1/messages", `{` + msgs + `,"max_tokens":2,"thinking":{"type":"enabled","budget_tokens":1024}}`, 200},
	} {
		m, info := loadMock(t, 1)
		s := host.NewServer(m, info, nil, host.Config{})
		t.Cleanup(s.Close)
		rec := post(Handler(s, c.opts), c.path, c.body)
		if rec.Code != c.code || (c.code == 501 && !strings.Contains(rec.Body.String(), "cannot bound a reply's reasoning")) {
			t.Errorf("mock, %s %s: %d %s, want %d", c.path, c.body, rec.Code, rec.Body, c.code)
		}
	}
}
