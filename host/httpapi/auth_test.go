package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// keyedServer is a server over the mock whose HTTP side takes opts.
func keyedServer(t *testing.T, opts Options) http.Handler {
	t.Helper()
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 2})
	if err != nil {
		t.Fatal(err)
	}
	s := host.NewServer(b, info, nil, host.Config{})
	t.Cleanup(s.Close)
	return Handler(s, opts)
}

// send serves one request with the Authorization header given ("" none).
func send(h http.Handler, method, path, auth, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestAPIKeyRequired: with keys configured every path but /health answers
// 401 (OpenAI-style body, Bearer challenge) to a missing, wrong, truncated
// or extended key, and serves either configured key.
func TestAPIKeyRequired(t *testing.T) {
	h := keyedServer(t, Options{APIKeys: []string{"key-one", "key-two"}})
	paths := []struct{ method, path, body string }{
		{"GET", "/slots", ""},
		{"GET", "/slots/0/state/meta", ""},
		{"POST", "/slots/1?action=erase", ""},
		{"GET", "/metrics", ""},
		{"GET", "/version", ""},
		{"GET", "/v1/models", ""},
		{"POST", "/v1/completions", `{"prompt":"hi","max_tokens":2}`},
		{"POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`},
		{"GET", "/nowhere", ""},
		{"GET", "/health/", ""},
	}
	for _, p := range paths {
		for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer key-on", "Bearer key-one2", "Basic key-one", "key-one", "Bearer KEY-ONE"} {
			rec := send(h, p.method, p.path, auth, p.body)
			if rec.Code != http.StatusUnauthorized {
				t.Errorf("%s %s with %q: %d %s", p.method, p.path, auth, rec.Code, rec.Body)
				continue
			}
			var e struct {
				Error apiError `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Type != "authentication_error" || e.Error.Msg != "Invalid API Key" {
				t.Errorf("%s %s: 401 body %s", p.method, p.path, rec.Body)
			}
			if got := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
				t.Errorf("%s %s: WWW-Authenticate %q", p.method, p.path, got)
			}
		}
		for _, auth := range []string{"Bearer key-one", "bearer key-two", "Bearer  key-one "} {
			if rec := send(h, p.method, p.path, auth, p.body); rec.Code == http.StatusUnauthorized {
				t.Errorf("%s %s with %q: 401", p.method, p.path, auth)
			}
		}
	}
	if rec := send(h, "GET", "/health", "", ""); rec.Code != http.StatusOK {
		t.Errorf("/health without a key: %d %s", rec.Code, rec.Body)
	}
	if rec := send(h, "GET", "/health", "Bearer wrong", ""); rec.Code != http.StatusOK {
		t.Errorf("/health with a wrong key: %d %s", rec.Code, rec.Body)
	}
}

// TestAPIKeyPublicMetrics: /metrics alone opens with PublicMetrics.
func TestAPIKeyPublicMetrics(t *testing.T) {
	h := keyedServer(t, Options{APIKeys: []string{"k"}, PublicMetrics: true})
	if rec := send(h, "GET", "/metrics", "", ""); rec.Code != http.StatusOK {
		t.Errorf("public /metrics: %d", rec.Code)
	}
	if rec := send(h, "GET", "/slots", "", ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("/slots beside public metrics: %d", rec.Code)
	}
}

// TestNoAPIKeysOpen: without keys nothing asks for one.
func TestNoAPIKeysOpen(t *testing.T) {
	h := keyedServer(t, Options{})
	for _, path := range []string{"/slots", "/metrics", "/v1/models"} {
		if rec := send(h, "GET", path, "", ""); rec.Code != http.StatusOK {
			t.Errorf("%s without keys configured: %d", path, rec.Code)
		}
	}
}

// TestAPIKeyAnthropicHeader: Anthropic's clients send the key as X-Api-Key,
// which is taken where no Authorization header is, as llama-server takes it.
func TestAPIKeyAnthropicHeader(t *testing.T) {
	h := keyedServer(t, Options{APIKeys: []string{"key-one"}})
	body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	for _, c := range []struct {
		auth, xkey string
		code       int
	}{
		{"", "key-one", 200},
		{"", "key-two", 401},
		{"", "", 401},
		{"Bearer wrong", "key-one", 401}, // the Authorization header is the credential when sent
		{"Bearer key-one", "wrong", 200},
	} {
		req := httptest.NewRequest("POST", "/v1/messages", strings.NewReader(body))
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		if c.xkey != "" {
			req.Header.Set("X-Api-Key", c.xkey)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.code {
			t.Errorf("Authorization %q, X-Api-Key %q: %d %s, want %d", c.auth, c.xkey, rec.Code, rec.Body, c.code)
		}
		if c.code == 401 && !strings.Contains(rec.Body.String(), `{"error":{"message":"Invalid API Key","type":"authentication_error"},"type":"error"}`) {
			t.Errorf("401 on /v1/messages: %s, want Anthropic's error", rec.Body)
		}
	}
}
