package otlp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/hydra-engine/hydra-engine/host/tracing"
)

// otelVars are the variables a test clears first, so the environment the
// tests run in cannot turn traces on.
var otelVars = []string{envEndpoint, envTracesEndpoint, envProtocol, envTracesProtocol, envExporter,
	envSDKDisabled, envSampler, envPropagators, "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"}

func clearEnv(t *testing.T) {
	for _, k := range otelVars {
		t.Setenv(k, "")
	}
}

// receiver is an OTLP/HTTP endpoint that keeps every export request.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*collectortrace.ExportTraceServiceRequest
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var m collectortrace.ExportTraceServiceRequest
		if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &m) != nil {
			t.Errorf("export to %s: %d bytes not an ExportTraceServiceRequest", req.URL.Path, len(body))
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, &m)
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) requests() []*collectortrace.ExportTraceServiceRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs
}

// spanAndShutdown makes one span through tr, then shuts tr down.
func spanAndShutdown(t *testing.T, tr *Provider) {
	t.Helper()
	tp := tr.TracerProvider()
	if tp != nil {
		_, sp := tp.Tracer(tracing.Scope).Start(context.Background(), "probe")
		sp.End()
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestOffWithoutEndpoint: without an endpoint, or with the exporter or the
// SDK turned off, Setup starts nothing (no goroutine), has no provider (the
// host then makes no spans, and a phase's span helper finds no recorded
// parent), and nothing reaches a receiver.
func TestOffWithoutEndpoint(t *testing.T) {
	r := newReceiver(t)
	for _, env := range [][2]string{
		{},
		{envExporter, "none"},
		{envSDKDisabled, "true"},
	} {
		clearEnv(t)
		if env[0] != "" {
			t.Setenv(envEndpoint, r.URL)
			t.Setenv(env[0], env[1])
		}
		before := runtime.NumGoroutine()
		tr, err := Setup(context.Background(), "test", hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		if tr.TracerProvider() != nil {
			t.Errorf("%v: traces are on", env)
		}
		if n := runtime.NumGoroutine(); n > before {
			t.Errorf("%v: %d goroutines after Setup, %d before", env, n, before)
		}
		ctx, _ := tracing.JoinHydra(context.Background(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		if tracing.Recording(ctx) || tracing.LogFields(ctx) != nil {
			t.Errorf("%v: a caller's trace context alone is recorded", env)
		}
		spanAndShutdown(t, tr)
	}
	if n := len(r.requests()); n != 0 {
		t.Errorf("%d exports with traces off", n)
	}
}

// TestExportsToEndpoint: with OTEL_EXPORTER_OTLP_ENDPOINT the spans go to
// its /v1/traces as OTLP protobuf, flushed by Shutdown, under the service
// name the environment gives (hydra-engine without one).
func TestExportsToEndpoint(t *testing.T) {
	for _, name := range []string{"", "engine-7"} {
		clearEnv(t)
		r := newReceiver(t)
		t.Setenv(envEndpoint, r.URL)
		t.Setenv("OTEL_SERVICE_NAME", name)
		tr, err := Setup(context.Background(), "v9", hclog.NewNullLogger())
		if err != nil || tr.TracerProvider() == nil {
			t.Fatalf("Setup: %v, provider %v", err, tr.TracerProvider())
		}
		spanAndShutdown(t, tr)
		reqs := r.requests()
		if len(reqs) != 1 || len(reqs[0].ResourceSpans) != 1 {
			t.Fatalf("%d exports, want 1 with one resource", len(reqs))
		}
		rs := reqs[0].ResourceSpans[0]
		attrs := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			attrs[kv.Key] = kv.GetValue().GetStringValue()
		}
		want := name
		if want == "" {
			want = ServiceName
		}
		if attrs["service.name"] != want || attrs["service.version"] != "v9" {
			t.Errorf("resource %v: want service.name %s, service.version v9", attrs, want)
		}
		if ss := rs.ScopeSpans; len(ss) != 1 || ss[0].Scope.GetName() != tracing.Scope || len(ss[0].Spans) != 1 || ss[0].Spans[0].Name != "probe" {
			t.Errorf("scope spans %v", ss)
		}
	}
}

// TestSettingsRefused: settings the engine cannot honour stop it at start.
func TestSettingsRefused(t *testing.T) {
	for _, env := range [][2]string{
		{envExporter, "console"},
		{envProtocol, "grpc"},
		{envTracesProtocol, "grpc"},
		{envTracesEndpoint, "localhost:4318"},
		{envEndpoint, "ftp://collector:4318"},
	} {
		clearEnv(t)
		t.Setenv(envEndpoint, "http://127.0.0.1:4318")
		t.Setenv(env[0], env[1])
		if _, err := Setup(context.Background(), "test", hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), env[0]) {
			t.Errorf("%s=%s: %v, want an error naming it", env[0], env[1], err)
		}
	}
}

// TestErrorLogIsRateLimited: failed exports log a line, then at most one
// per errorLogInterval with the count of those not logged.
func TestErrorLogIsRateLimited(t *testing.T) {
	var out strings.Builder
	e := &errorLog{log: hclog.New(&hclog.LoggerOptions{Output: &out})}
	for range 3 {
		e.Handle(io.ErrUnexpectedEOF)
	}
	e.last = e.last.Add(-errorLogInterval)
	e.Handle(io.ErrUnexpectedEOF)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "errors_not_logged=2") {
		t.Errorf("log:\n%s", out.String())
	}
}
