package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// tokenizingBackend answers Tokenize with options as a backend with a
// tokenizer would, keeping the request.
type tokenizingBackend struct {
	iface.Backend
	got *iface.PrefillRequest
}

func (b tokenizingBackend) Tokenize(ctx context.Context, req iface.PrefillRequest) (iface.Prompt, error) {
	if req.Tokenize == nil {
		return b.Backend.Tokenize(ctx, req)
	}
	*b.got = req
	switch {
	case len(req.Messages) > 0:
		return iface.Prompt{Text: "<rendered>", Tokens: []int32{1}}, nil
	case len(req.Tokens) > 0:
		return iface.Prompt{Text: "a\xe2\x82\xac", Tokens: req.Tokens}, nil
	}
	return iface.Prompt{Tokens: []int32{7, 8}, Pieces: []string{"hé", "\xe2\x82"}}, nil
}

// TestTokenizeEndpoints: /tokenize with llama-server's defaults and
// switches (a piece that is no whole UTF-8 as its bytes), /detokenize,
// /apply-template over the chat body (tools included), GET /props; the mock
// tokenizes bytes and answers 501 to the others.
func TestTokenizeEndpoints(t *testing.T) {
	m, info := loadMock(t, 1)
	info.ChatTemplate, info.BOSToken = "{{ messages }}", "<s>"
	got := &iface.PrefillRequest{}
	_, h := serve(t, tokenizingBackend{Backend: m, got: got}, info, nil)
	call := func(path, body string) (int, map[string]any) {
		rec := post(h, path, body)
		var out map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out
	}
	code, out := call("/tokenize", `{"content":"hé\u20ac"}`)
	if code != 200 || !reflect.DeepEqual(out["tokens"], []any{7.0, 8.0}) ||
		!reflect.DeepEqual(*got.Tokenize, iface.TokenizeOptions{ParseSpecial: true}) || got.Text != "hé€" {
		t.Errorf("tokenize defaults: %d %v, backend got %+v %+v", code, out, got, got.Tokenize)
	}
	code, out = call("/tokenize", `{"content":"x","add_special":true,"parse_special":false,"with_pieces":true}`)
	want := []any{map[string]any{"id": 7.0, "piece": "hé"}, map[string]any{"id": 8.0, "piece": []any{226.0, 130.0}}}
	if code != 200 || !reflect.DeepEqual(out["tokens"], want) || !reflect.DeepEqual(*got.Tokenize, iface.TokenizeOptions{AddSpecial: true, WithPieces: true}) {
		t.Errorf("tokenize with pieces: %d %v, backend got %+v", code, out, got.Tokenize)
	}
	if code, out = call("/tokenize", `{}`); code != 200 || !reflect.DeepEqual(out["tokens"], []any{}) {
		t.Errorf("no content: %d %v", code, out)
	}
	if code, out = call("/tokenize", `{"content":[1,"a"]}`); code != 400 || out["error"].(map[string]any)["param"] != "content" {
		t.Errorf("mixed content: %d %v", code, out)
	}
	if code, out = call("/detokenize", `{"tokens":[3,4]}`); code != 200 || out["content"] != "a€" || !reflect.DeepEqual(got.Tokens, []int32{3, 4}) {
		t.Errorf("detokenize: %d %v", code, out)
	}
	if code, out = call("/detokenize", `{"tokens":[-1]}`); code != 400 {
		t.Errorf("detokenize -1: %d %v", code, out)
	}
	code, out = call("/apply-template", `{"messages":[{"role":"user","content":"hi"}],"tools":`+toolsJSON+`,"chat_template_kwargs":{"x":1}}`)
	if code != 200 || out["prompt"] != "<rendered>" || len(got.Tools) != 2 || got.TemplateKwargs != `{"x":1}` {
		t.Errorf("apply-template: %d %v, backend got %+v", code, out, got)
	}
	if code, out = call("/apply-template", `{"messages":[]}`); code != 400 {
		t.Errorf("apply-template without messages: %d %v", code, out)
	}
	rec := httpGet(h, "/props")
	var props map[string]any
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &props) != nil || props["total_slots"] != 1.0 || props["model_alias"] != "mock" ||
		props["chat_template"] != "{{ messages }}" || props["bos_token"] != "<s>" || props["eos_token"] != "" ||
		props["default_generation_settings"].(map[string]any)["n_ctx"] == nil {
		t.Errorf("props: %d %s", rec.Code, rec.Body)
	}
	if rec := post(h, "/props", `{"x":1}`); rec.Code != 501 || !strings.Contains(rec.Body.String(), "Start it with `--props`") {
		t.Errorf("POST /props: %d %s, want llama-server's 501", rec.Code, rec.Body)
	}
	_, mh := newTestServer(t, 1)
	// The mock tokenizes text a token per byte (the prompts of infill and
	// rerank are built of its tokens) but has no text for its tokens or a
	// real template.
	if rec := post(mh, "/tokenize", `{"content":"hé","with_pieces":true}`); rec.Code != 200 ||
		rec.Body.String() != `{"tokens":[{"id":104,"piece":"h"},{"id":195,"piece":[195]},{"id":169,"piece":[169]}]}`+"\n" {
		t.Errorf("mock /tokenize: %d %s", rec.Code, rec.Body)
	}
	for _, path := range []string{"/detokenize", "/apply-template"} {
		body := map[string]string{"/detokenize": `{"tokens":[1]}`,
			"/apply-template": `{"messages":[{"role":"user","content":"x"}]}`}[path]
		if rec := post(mh, path, body); rec.Code != 501 || !strings.Contains(rec.Body.String(), "no tokenizer") {
			t.Errorf("mock %s: %d %s", path, rec.Code, rec.Body)
		}
	}
}

func httpGet(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec
}
