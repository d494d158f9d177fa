package host

import (
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// TestReasoningEffort: OpenAI's reasoning_effort reaches the template as
// llama-server passes it: a level as reasoning_effort over the request's
// kwargs, "none" as enable_thinking false without one, "" as nothing; a
// value that is no string is refused.
func TestReasoningEffort(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for body, want := range map[string]string{
		`{` + msgs + `,"reasoning_effort":"high","chat_template_kwargs":{"a":1,"reasoning_effort":"low"}}`: `{"a":1,"reasoning_effort":"high"}`,
		`{` + msgs + `,"reasoning_effort":"low"}`:                                                          `{"reasoning_effort":"low"}`,
		`{` + msgs + `,"reasoning_effort":"none","chat_template_kwargs":{"reasoning_effort":"low"}}`:       `{"enable_thinking":false}`,
		`{` + msgs + `,"reasoning_effort":"","chat_template_kwargs":{"a":1}}`:                              `{"a":1}`,
		`{` + msgs + `}`: ``,
	} {
		p, err := ParsePrefill([]byte(body), 0, iface.BackendInfo{})
		if err != nil || p.TemplateKwargs != want {
			t.Errorf("%s: kwargs %q (%v), want %q", body, p.TemplateKwargs, err, want)
		}
	}
	if _, err := ParsePrefill([]byte(`{`+msgs+`,"reasoning_effort":3}`), 0, iface.BackendInfo{}); err == nil {
		t.Error("reasoning_effort 3 accepted")
	}
}
