package cudallama

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// TestChatTemplate: ChatML without a template; a template file over the
// model's; a rendered BOS dropped when the tokenizer adds one; the engine's
// kwargs under the request's; "developer" rendered as "system" except for
// gpt-oss's harmony templates; a prompt ending in <think> reported; bad
// templates, files and kwargs refused as bad requests.
func TestChatTemplate(t *testing.T) {
	user := []iface.Message{{Role: "developer", Content: "be brief"}, {Role: "user", Content: "hi"}}

	c, err := newChatTemplate("", "<s>", "</s>", false, llamaopt.TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	text, think, err := c.render(user, nil, "", contentGuard{})
	want := "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
	if err != nil || text != want || think {
		t.Fatalf("ChatML: %q %v %v, want %q", text, think, err, want)
	}

	src := "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}" +
		"{% if flag %}+{{ flag }}{% endif %}{% if enable_thinking %}<think>\n{% endif %}"
	c, err = newChatTemplate(src, "<s>", "</s>", true, llamaopt.TemplateOptions{
		TemplateKwargs: map[string]any{"flag": "engine"}, Reasoning: "on"})
	if err != nil {
		t.Fatal(err)
	}
	text, think, err = c.render(user, nil, `{"flag":"request"}`, contentGuard{})
	if want := "[system]be brief[user]hi+request<think>\n"; err != nil || text != want || !think {
		t.Fatalf("kwargs: %q %v %v, want %q and a reasoning block", text, think, err, want)
	}
	if text, _, err = c.render(user, nil, "", contentGuard{}); err != nil || text != "[system]be brief[user]hi+engine<think>\n" {
		t.Fatalf("the engine's kwargs: %q %v", text, err)
	}
	if _, _, err = c.render(user, nil, `{"flag":`, contentGuard{}); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("bad kwargs: %v, want a bad request", err)
	}

	harmony := "{% for m in messages %}<|start|>{{ m.role }}<|channel|>{{ m.content }}{% endfor %}"
	c, err = newChatTemplate(harmony, "", "", false, llamaopt.TemplateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if text, _, err = c.render(user[:1], nil, "", contentGuard{}); err != nil || text != "<|start|>developer<|channel|>be brief" {
		t.Fatalf("harmony keeps developer: %q %v", text, err)
	}

	file := filepath.Join(t.TempDir(), "t.jinja")
	if err := os.WriteFile(file, []byte("{% for m in messages %}<{{ m.content }}>{% endfor %}"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = newChatTemplate(src, "", "", false, llamaopt.TemplateOptions{TemplateFile: file})
	if err != nil {
		t.Fatal(err)
	}
	if text, _, err = c.render(user, nil, "", contentGuard{}); err != nil || text != "<be brief><hi>" {
		t.Fatalf("template file: %q %v", text, err)
	}

	for name, o := range map[string]llamaopt.TemplateOptions{
		"missing file": {TemplateFile: filepath.Join(t.TempDir(), "none.jinja")},
	} {
		if _, err := newChatTemplate(src, "", "", false, o); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s: %v, want a bad request", name, err)
		}
	}
	if _, err := newChatTemplate("{% for %}", "", "", false, llamaopt.TemplateOptions{}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("a template that does not parse: %v, want a bad request", err)
	}
}

// TestCheckSpeculative: a request's p_min other than the load's draft_p_min
// is refused while drafting; otherwise the bounds pass.
func TestCheckSpeculative(t *testing.T) {
	p := &iface.SpeculativeParams{NMax: 4, NMin: -1, PMin: 0.5}
	if err := checkSpeculative(p, true, 0.75); !errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("p_min 0.5 against 0.75: %v, want a bad request", err)
	}
	for _, c := range []struct {
		p        *iface.SpeculativeParams
		drafting bool
	}{{nil, true}, {p, false}, {&iface.SpeculativeParams{PMin: -1}, true}, {&iface.SpeculativeParams{PMin: 0.75}, true}} {
		if err := checkSpeculative(c.p, c.drafting, 0.75); err != nil {
			t.Errorf("%+v drafting %v: %v", c.p, c.drafting, err)
		}
	}
}
