package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/tracing"
)

// TestHTTPSpans: a streamed completion still streams under its span (the
// span's writer keeps the connection's flushes), which joins the caller's
// traceparent and has its phases as children; a refused request and an
// unknown method have spans without a route.
func TestHTTPSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	b, info := loadMock(t, 1)
	s := host.NewServer(b, info, nil, host.Config{TracerProvider: tp})
	t.Cleanup(s.Close)
	hs := httptest.NewServer(Handler(s, Options{APIKeys: []string{"k"}}))
	t.Cleanup(hs.Close)

	send := func(method, key, body string) (int, string) {
		req, _ := http.NewRequest(method, hs.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	code, out := send("POST", "k", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
	if code != 200 || strings.Count(out, "data: ") < 4 || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Fatalf("stream: %d %q", code, out)
	}
	if code, _ := send("POST", "", `{}`); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	if code, _ := send("FOO", "k", ``); code < 400 {
		t.Fatalf("method FOO: %d", code)
	}
	// A request's span ends when its handler returns, after the reply.
	var spans []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && len(spans) < 6; time.Sleep(time.Millisecond) {
		spans = rec.Ended()
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		byName[sp.Name()] = sp
	}
	root := byName["POST /v1/chat/completions"]
	if root == nil || root.Parent().SpanID().String() != "b7ad6b7169203331" {
		t.Fatalf("spans %v", spanNames(spans))
	}
	for _, name := range []string{tracing.SpanQueue, tracing.SpanPrefill, tracing.SpanDecode} {
		if sp := byName[name]; sp == nil || sp.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the completion's span (spans %v)", name, spanNames(spans))
		}
	}
	for name, code := range map[string]int64{"POST": 401, "_OTHER": 405} {
		sp := byName[name]
		if sp == nil {
			t.Errorf("no span %q (spans %v)", name, spanNames(spans))
			continue
		}
		for _, kv := range sp.Attributes() {
			if kv.Key == "http.response.status_code" && kv.Value.AsInt64() != code {
				t.Errorf("%s: status %d, want %d", name, kv.Value.AsInt64(), code)
			}
			if kv.Key == "http.route" {
				t.Errorf("%s: a route %s", name, kv.Value.AsString())
			}
		}
	}
}

func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	var n []string
	for _, sp := range spans {
		n = append(n, sp.Name())
	}
	return n
}
