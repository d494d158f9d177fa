package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// FuzzCompletionBody: whatever a completion body holds, the engine answers
// it with a status other than a server fault (the mock's 501 for what needs
// a tokenizer or a parser aside: a mixed prompt, a grammar) and a JSON body,
// and /slots and /metrics answer 200 afterwards; a client's values never
// reach a reply that cannot be encoded.
func FuzzCompletionBody(f *testing.F) {
	for _, s := range []string{`{"prompt":"ab","max_tokens":2,"temperature":1e300}`,
		`{"prompt":"ab","max_tokens":2,"repeat_penalty":1.1,"repeat_last_n":2147483647}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"top_p":1e-46,"logit_bias":{"3":1e308}}`,
		`{"prompt":[1,2],"max_tokens":1,"presence_penalty":-1e6,"seed":-1,"n_probs":20,"logprobs":true}`,
		`{"prompt":"a","max_tokens":1,"logit_bias":[[1,false],[2,-1e400]]}`} {
		f.Add([]byte(s), false)
	}
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 2, Options: map[string]string{"n_ctx": "256"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		_, h := serve(t, b, info, nil)
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
		}
		rec := post(h, path, string(body))
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusNotImplemented {
			t.Fatalf("%s %q: %d %s", path, body, rec.Code, rec.Body)
		}
		if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%q: reply is not JSON: %s", body, rec.Body)
		}
		for _, p := range []string{"/slots", "/metrics"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", p, nil))
			if rec.Code != http.StatusOK || (p == "/slots" && !json.Valid(rec.Body.Bytes())) {
				t.Fatalf("GET %s after %q: %d %s", p, body, rec.Code, rec.Body)
			}
		}
	})
}

// FuzzMessagesBody: whatever a /v1/messages body holds, the reply is
// Anthropic's (a message, an event stream or a {"type":"error"} body) with
// a status other than a server fault (the mock's 501 for tools aside), and
// the slot is free again.
func FuzzMessagesBody(f *testing.F) {
	for _, s := range []string{messagesBodyText + `}`, messagesBodyText + `,"stream":true}`,
		`{"max_tokens":2,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"}]}],"tools":[{"name":"f"}],"tool_choice":{"type":"none"}}`,
		`{"max_tokens":2,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"disabled"},"stop_sequences":["x"]}`} {
		f.Add([]byte(s))
	}
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 1, Options: map[string]string{"n_ctx": "256"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, h := serve(t, b, info, nil)
		rec := post(h, "/v1/messages", string(body))
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusNotImplemented {
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body)
		}
		var reply struct {
			Type string `json:"type"`
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") &&
			(json.Unmarshal(rec.Body.Bytes(), &reply) != nil || (reply.Type != "message" && reply.Type != "error")) {
			t.Fatalf("%q: %d %s is not Anthropic's", body, rec.Code, rec.Body)
		}
		if rec := post(h, "/v1/chat/completions", `{"id_slot":0,"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`); rec.Code != 200 {
			t.Fatalf("after %q: %d %s", body, rec.Code, rec.Body)
		}
	})
}
