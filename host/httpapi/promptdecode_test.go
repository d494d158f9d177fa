package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// callSpy is the mock backend noting the calls a completion makes.
type callSpy struct {
	iface.Backend
	mu      sync.Mutex
	calls   []string
	prompts []iface.PrefillRequest // each Prefill's, and each Decode's prompt
}

func (b *callSpy) notePrompt(p iface.PrefillRequest) {
	b.mu.Lock()
	b.prompts = append(b.prompts, p)
	b.mu.Unlock()
}

func (b *callSpy) note(c string) {
	b.mu.Lock()
	b.calls = append(b.calls, c)
	b.mu.Unlock()
}

func (b *callSpy) Prefill(ctx context.Context, req iface.PrefillRequest) (iface.PrefillResult, error) {
	b.note("prefill")
	b.notePrompt(req)
	return b.Backend.Prefill(ctx, req)
}

func (b *callSpy) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	if req.Prompt != nil {
		b.note("decode+prompt")
		b.notePrompt(*req.Prompt)
	} else {
		b.note("decode")
	}
	return b.Backend.Decode(ctx, req, emit)
}

// spyServer is a server over the one-slot mock behind a callSpy, the
// backend taking the prompt in Decode where promptDecode says.
func spyServer(t *testing.T, promptDecode bool) (*callSpy, http.Handler) {
	t.Helper()
	m := mock.New(nil)
	info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	info.PromptDecode = promptDecode
	spy := &callSpy{Backend: m}
	_, h := serve(t, spy, info, nil)
	return spy, h
}

// TestPromptInDecode: to a backend that takes the prompt in Decode, a
// completion is one call; to one that does not, a Prefill then a Decode.
// Both give the same replies, usage, timings' prompt count and prompt
// metrics, streamed or not; a request of no tokens stays a prefill.
func TestPromptInDecode(t *testing.T) {
	bodies := []string{
		`{"prompt":"Once upon a time","max_tokens":6}`,
		`{"prompt":"Once upon a time there was","max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`,
		`{"prompt":"Once upon a time there was","max_tokens":0}`,
	}
	run := func(t *testing.T, promptDecode bool) (replies []string, calls []string, metrics string) {
		spy, h := spyServer(t, promptDecode)
		for _, body := range bodies {
			path := "/v1/completions"
			if strings.Contains(body, "messages") {
				path = "/v1/chat/completions"
			}
			rec := post(h, path, body)
			if rec.Code != 200 {
				t.Fatalf("%s: %d %s", body, rec.Code, rec.Body)
			}
			replies = append(replies, normalizeReply(rec.Body.String()))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if strings.HasPrefix(l, "llamacpp:prompt_tokens_total") || strings.HasPrefix(l, metricReused) {
				metrics += l + "\n"
			}
		}
		return replies, spy.calls, metrics
	}
	oneCall, oneCalls, oneMetrics := run(t, true)
	twoCalls, twoCallsCalls, twoMetrics := run(t, false)
	if want := []string{"decode+prompt", "decode+prompt", "decode+prompt", "prefill"}; !slices.Equal(oneCalls, want) {
		t.Errorf("prompt in the decode: calls %v, want %v", oneCalls, want)
	}
	if want := []string{"prefill", "decode", "prefill", "decode", "prefill", "decode", "prefill"}; !slices.Equal(twoCallsCalls, want) {
		t.Errorf("two calls: calls %v, want %v", twoCallsCalls, want)
	}
	for i := range bodies {
		if oneCall[i] != twoCalls[i] {
			t.Errorf("%s:\none call  %s\ntwo calls %s", bodies[i], oneCall[i], twoCalls[i])
		}
	}
	if oneMetrics != twoMetrics || !strings.Contains(oneMetrics, "prompt_tokens_total") {
		t.Errorf("metrics differ:\none call\n%s\ntwo calls\n%s", oneMetrics, twoMetrics)
	}
}

// normalizeReply drops what differs between two runs of one request: ids,
// times and speeds.
func normalizeReply(s string) string {
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`"(id|created|system_fingerprint)":("[^"]*"|\d+)`),
		regexp.MustCompile(`"(prompt_ms|prompt_per_token_ms|prompt_per_second|predicted_ms|predicted_per_token_ms|predicted_per_second)":[0-9.e+-]+`),
	} {
		s = re.ReplaceAllString(s, `"$1":_`)
	}
	var v any
	if json.Unmarshal([]byte(s), &v) == nil { // a whole reply: compare it as JSON
		b, _ := json.Marshal(v)
		return string(b)
	}
	return s
}

// TestPromptFromChat: a chat completion's prompt reaches the backend as the
// tokens of its rendering, marked FromChat (the backend finds its messages'
// starts in them, for context checkpoints); a text completion's is not.
func TestPromptFromChat(t *testing.T) {
	for _, promptDecode := range []bool{false, true} {
		spy, h := spyServer(t, promptDecode)
		for _, c := range []struct {
			path, body string
			chat       bool
		}{
			{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, true},
			{"/v1/completions", `{"prompt":"Once upon a time","max_tokens":2}`, false},
		} {
			spy.prompts = nil
			if rec := post(h, c.path, c.body); rec.Code != 200 {
				t.Fatalf("%s: %d %s", c.path, rec.Code, rec.Body)
			}
			if len(spy.prompts) != 1 || len(spy.prompts[0].Tokens) == 0 || spy.prompts[0].FromChat != c.chat {
				t.Errorf("prompt in decode %v, %s: the backend got %+v, want tokens with FromChat %v", promptDecode, c.path, spy.prompts, c.chat)
			}
		}
	}
}
