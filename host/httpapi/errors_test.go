package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// TestDecodeErrorsInClientWords: a body that does not decode is answered
// 400 in JSON terms (field, expected kind, offset), never with the Go types
// encoding/json names, the field at fault its param.
func TestDecodeErrorsInClientWords(t *testing.T) {
	_, h := newTestServer(t, 1)
	for _, c := range []struct{ path, body, want, param string }{
		{"/v1/chat/completions", `{"messages":"hi"}`, "field messages: expected an array, got a string", "messages"},
		{"/v1/chat/completions", `{"messages":["hi"]}`, "field messages: expected an array of objects, got an element that is a string", "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":5,"content":"x"}]}`, "field messages.role: expected a string, got a number", "messages.role"},
		{"/v1/completions", `{"prompt":"a","max_tokens":"5"}`, "field max_tokens: expected an integer, got a string", "max_tokens"},
		{"/v1/completions", `{"prompt":"a","max_tokens":1.5}`, "field max_tokens: expected an integer, got 1.5", "max_tokens"},
		{"/v1/completions", `{"prompt":"a","n":99999999999999999999}`, "field n: 99999999999999999999 is out of range", "n"},
		{"/v1/completions", `{"prompt":"a","temperature":"hot"}`, "field temperature: expected a number, got a string", "temperature"},
		{"/v1/completions", `{"prompt":"a","stream":"yes"}`, "field stream: expected a boolean, got a string", "stream"},
		{"/v1/completions", `{"prompt":"a","stream_options":[]}`, "field stream_options: expected an object, got an array", "stream_options"},
		{"/v1/completions", `{"prompt":"a","stream_options":{"include_usage":1}}`, "field stream_options.include_usage: expected a boolean, got a number", "stream_options.include_usage"},
		{"/v1/completions", `[1]`, "request body must be a JSON object, got an array", ""},
		{"/v1/completions", `"prompt"`, "request body must be a JSON object, got a string", ""},
		{"/v1/completions", `{"prompt":"a",}`, "request body is not valid JSON: invalid character '}' looking for beginning of object key string (at offset 15)", ""},
		{"/v1/completions", `{"prompt":"a"} x`, "request body is not valid JSON: invalid character 'x' after top-level value (at offset 16)", ""},
		{"/v1/completions", ``, "request body is not valid JSON: unexpected end of JSON input (at offset 0)", ""},
	} {
		rec := post(h, c.path, c.body)
		var e struct {
			Error apiError `json:"error"`
		}
		if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Type != "invalid_request_error" {
			t.Errorf("%s: %d %s", c.body, rec.Code, rec.Body)
			continue
		}
		if e.Error.Msg != c.want {
			t.Errorf("%s: %q, want %q", c.body, e.Error.Msg, c.want)
		}
		if want := any(c.param); c.param == "" && e.Error.Param != nil || c.param != "" && e.Error.Param != want {
			t.Errorf("%s: param %v, want %q", c.body, e.Error.Param, c.param)
		}
		for _, leak := range []string{"Go ", "host.", "httpapi.", "int64", "float64", "[]", "struct", "json:"} {
			if strings.Contains(e.Error.Msg, leak) {
				t.Errorf("%s: %q names Go's %q", c.body, e.Error.Msg, leak)
			}
		}
	}
}

// The text a gRPC error from a plugin that died carries: it names the
// plugin's socket.
const internalDetail = `Unavailable: connection error: desc = "transport: Error while dialing: dial unix /tmp/plugin3141592/backend.sock: connect: connection refused"`

// brokenBackend is the mock with some calls failing as a dead plugin's do;
// Decode streams two tokens first.
type brokenBackend struct {
	iface.Backend
	prefill, decode, clear, info bool
}

func (b brokenBackend) Prefill(ctx context.Context, req iface.PrefillRequest) (iface.PrefillResult, error) {
	if b.prefill {
		return iface.PrefillResult{}, errors.New(internalDetail)
	}
	return b.Backend.Prefill(ctx, req)
}

func (b brokenBackend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	if b.prefill && req.Prompt != nil { // the prompt's part of the call fails
		return iface.DecodeResult{}, errors.New(internalDetail)
	}
	if !b.decode {
		return b.Backend.Decode(ctx, req, emit)
	}
	for _, s := range []string{"He", "llo"} {
		if err := emit(iface.Token{Text: s}); err != nil {
			return iface.DecodeResult{}, err
		}
	}
	return iface.DecodeResult{}, errors.New(internalDetail)
}

func (b brokenBackend) ClearSlot(ctx context.Context, slot int) error {
	if b.clear {
		return errors.New(internalDetail)
	}
	return b.Backend.ClearSlot(ctx, slot)
}

func (b brokenBackend) Info(ctx context.Context) (iface.BackendInfo, error) {
	if b.info {
		return iface.BackendInfo{}, errors.New(internalDetail)
	}
	return b.Backend.Info(ctx)
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestInternalErrorsStayInTheLog: when the backend fails inside (here, a
// dead plugin's gRPC error naming its socket), the client, streaming or not,
// is told which step failed and the log gets the detail.
func TestInternalErrorsStayInTheLog(t *testing.T) {
	m := mock.New(nil)
	info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, method, path, body string
		broken                   brokenBackend
		code                     int
		want                     string // in what the client is told
		twoCalls                 bool   // the backend cannot take the prompt in Decode
	}{
		{"SSE error event", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}`,
			brokenBackend{decode: true}, 200, "generating the completion failed", false},
		{"text SSE error event", "POST", "/v1/completions", `{"prompt":"hi","stream":true,"max_tokens":8}`,
			brokenBackend{decode: true}, 200, "generating the completion failed", false},
		{"decode reply", "POST", "/v1/completions", `{"prompt":"hi","max_tokens":8}`,
			brokenBackend{decode: true}, 500, "generating the completion failed", false},
		{"prefill reply", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`,
			brokenBackend{prefill: true}, 500, "evaluating the prompt failed", false},
		{"prefill reply, two calls", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true}`,
			brokenBackend{prefill: true}, 500, "evaluating the prompt failed", true},
		{"erase", "POST", "/slots/0?action=erase", ``, brokenBackend{clear: true}, 500, "erasing the slot failed", false},
		{"health", "GET", "/health", ``, brokenBackend{info: true}, 503, "the backend is not answering", false},
	} {
		var logged lockedBuffer
		c.broken.Backend = m
		info := info
		info.PromptDecode = !c.twoCalls
		_, h := serve(t, c.broken, info, hclog.New(&hclog.LoggerOptions{Output: &logged, Level: hclog.Debug}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, strings.NewReader(c.body)))
		told := rec.Body.String()
		if rec.Code != c.code || !strings.Contains(told, c.want) {
			t.Errorf("%s: %d %s, want %d and %q", c.name, rec.Code, told, c.code, c.want)
		}
		for _, leak := range []string{"/tmp/plugin3141592", "dial", "Unavailable"} {
			if strings.Contains(told, leak) {
				t.Errorf("%s: the client is told %q", c.name, leak)
			}
		}
		if !strings.Contains(logged.String(), "/tmp/plugin3141592/backend.sock") {
			t.Errorf("%s: the log lacks the detail: %s", c.name, logged.String())
		}
		if c.code == 200 { // streamed: the tokens, then the error as the last event
			events := strings.Split(strings.TrimSpace(told), "\n\n")
			last := events[len(events)-1]
			var ev struct {
				Error *apiError `json:"error"`
			}
			if !strings.Contains(told, "llo") || json.Unmarshal([]byte(strings.TrimPrefix(last, "data: ")), &ev) != nil ||
				ev.Error == nil || ev.Error.Type != "server_error" {
				t.Errorf("%s: stream %q", c.name, told)
			}
		}
	}
}
