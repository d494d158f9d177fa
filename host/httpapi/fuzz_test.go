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

// FuzzResponsesBody: whatever a /v1/responses body holds, the reply is a
// Response, its event stream or an OpenAI error, with a status other than a
// server fault (the mock's 501 for tools aside), and the slot is free again.
func FuzzResponsesBody(f *testing.F) {
	for _, s := range []string{`{"input":"hi","instructions":"sys","max_output_tokens":2}`,
		`{"input":"hi","max_output_tokens":2,"stream":true,"reasoning":{"effort":"none"}}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"c","output":"x"}],"tools":[{"type":"function","name":"f"}],"tool_choice":"none","max_output_tokens":2}`,
		`{"input":[{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"t"}]},{"role":"assistant","content":"a"},{"role":"user","content":"b"}],"max_output_tokens":2}`} {
		f.Add([]byte(s))
	}
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 1, Options: map[string]string{"n_ctx": "256"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, h := serve(t, b, info, nil)
		rec := post(h, "/v1/responses", string(body))
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusNotImplemented {
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body)
		}
		var reply struct {
			Object string          `json:"object"`
			Error  json.RawMessage `json:"error"`
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") &&
			(json.Unmarshal(rec.Body.Bytes(), &reply) != nil || (reply.Object != "response") == (reply.Error == nil)) {
			t.Fatalf("%q: %d %s is not a Response or an error", body, rec.Code, rec.Body)
		}
		if rec := post(h, "/v1/chat/completions", `{"id_slot":0,"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`); rec.Code != 200 {
			t.Fatalf("after %q: %d %s", body, rec.Code, rec.Body)
		}
	})
}

// FuzzNativeBody: whatever a /completion body holds, the reply is
// llama-server's native reply (one, several, or their stream) or an error,
// with a status other than a server fault (the mock's 501 for a mixed
// prompt, which needs a tokenizer, aside), and the slots are free again.
func FuzzNativeBody(f *testing.F) {
	for _, s := range []string{`{"prompt":"ab","n_predict":2,"n_probs":2,"return_tokens":true}`,
		`{"prompt":["ab",[1,2]],"n_predict":2,"stream":true,"stop":["x","y","z","w","v"]}`,
		`{"prompt":{"prompt_string":"ab"},"n_predict":1,"n_cmpl":2,"mirostat":0,"response_fields":["content","timings/prompt_n"]}`,
		`{"prompt":"a","n_predict":3,"cache_prompt":false,"typical_p":1,"dry_sequence_breakers":["a"],"seed":-1}`} {
		f.Add([]byte(s))
	}
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 2, Options: map[string]string{"n_ctx": "256"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		s, h := serve(t, b, info, nil)
		rec := post(h, "/completion", string(body))
		if rec.Code >= 500 && rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusNotImplemented {
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body)
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%q: reply is not JSON: %s", body, rec.Body)
		}
		for i, v := range s.Slots() {
			if v.Processing {
				t.Fatalf("after %q: slot %d busy", body, i)
			}
		}
	})
}
