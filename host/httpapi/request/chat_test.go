package request

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// TestParseChat: a converter's chat parses as the chat completion body it
// stands for: too many messages refused first, in Decode's words; passed
// fields decoded in their keys' order and refused in DecodeJSON's words;
// the template variables compacted.
func TestParseChat(t *testing.T) {
	info := iface.BackendInfo{Name: "mock", NCtx: 4, NVocab: 50}
	def := iface.SamplerParams{Temperature: 0.5}
	chat := func(n int, passed map[string]string) Chat {
		var c Chat
		for range n {
			c.Messages = append(c.Messages, TextMessage("user", "x"))
		}
		for k, v := range passed {
			if c.Passed == nil {
				c.Passed = map[string]json.RawMessage{}
			}
			c.Passed[k] = json.RawMessage(v)
		}
		return c
	}
	// the chat completion body of n messages and the passed fields
	body := func(n int, passed map[string]string) []byte {
		m := map[string]any{"messages": chat(n, nil).Messages}
		for k, v := range passed {
			m[k] = json.RawMessage(v)
		}
		return JSON(m)
	}
	for _, c := range []struct {
		name   string
		n      int
		passed map[string]string
	}{
		{"too many messages, a passed field wrong", 9, map[string]string{"temperature": `"hot"`}},
		{"two passed fields wrong", 1, map[string]string{"temperature": `"hot"`, "seed": `"x"`}},
		{"an integer out of range", 1, map[string]string{"top_k": `99999999999999999999`, "repeat_last_n": `1.5`}},
		{"a template variable not an object", 1, map[string]string{"chat_template_kwargs": `[1]`}},
	} {
		_, got := ParseChat(chat(c.n, c.passed), def, -1, info)
		_, want := Parse(body(c.n, c.passed), true, def, -1, info)
		var g, w *run.Error
		if !errors.As(got, &g) || !errors.As(want, &w) || *g != *w {
			t.Errorf("%s: %#v, want %#v", c.name, got, want)
		}
	}
	c, err := ParseChat(chat(1, map[string]string{"temperature": `0.25`, "stop": `["a", "b"]`,
		"chat_template_kwargs": `{ "a" : "<b>" }`}), def, -1, info)
	if err != nil || c.Sampler.Temperature != 0.25 || len(c.Stops) != 2 || c.Prefill.TemplateKwargs != `{"a":"\u003cb\u003e"}` {
		t.Errorf("parsed %+v %v", c, err)
	}
	if _, err := ParseChat(chat(5, nil), def, -1, info); err == nil || err.Error() != "bad request: 5 messages cannot fit: a slot holds 4 (n_ctx), and each message takes one token at least" {
		t.Errorf("too many messages: %v", err)
	}
	m := TextMessage("tool", "a \"quoted\" <text>")
	if msgs, err := host.ToMessages([]host.ChatMessage{m}); err != nil || msgs[0].Content != "a \"quoted\" <text>" {
		t.Errorf("TextMessage: %+v %v", msgs, err)
	}
}
