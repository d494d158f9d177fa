// Package otelcol runs the real engine binary against an OpenTelemetry
// Collector's own OTLP/HTTP receiver, started in the test: the spans of a
// prefill/decode disaggregation, as a coordinator drives it under one trace,
// arrive with their parents, names and attributes. It is a module of its
// own so that the collector's modules stay out of the product's go.mod and
// binaries.
package otelcol

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/transport"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "hydra-otel-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := enginetest.Build(dir, enginetest.BuildOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// collector starts the collector's OTLP receiver, HTTP only, on a free port
// and returns its endpoint and the sink its traces go to.
func collector(t *testing.T) (string, *consumertest.TracesSink) {
	t.Helper()
	port, err := enginetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	f := otlpreceiver.NewFactory()
	cfg := f.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
	httpCfg := cfg.Protocols.HTTP.GetOrInsertDefault()
	httpCfg.ServerConfig.NetAddr.Endpoint = fmt.Sprintf("127.0.0.1:%d", port)
	sink := new(consumertest.TracesSink)
	r, err := f.CreateTraces(context.Background(), receivertest.NewNopSettings(f.Type()), cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background(), componenttest.NewNopHost()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return fmt.Sprintf("http://127.0.0.1:%d", port), sink
}

// span is one received span, flattened.
type span struct {
	name, trace, id, parent string
	kind                    ptrace.SpanKind
	status                  ptrace.StatusCode
	attrs, resource         map[string]any
	events                  []string
}

func spansOf(sink *consumertest.TracesSink) []span {
	var out []span
	for _, td := range sink.AllTraces() {
		for i := 0; i < td.ResourceSpans().Len(); i++ {
			rs := td.ResourceSpans().At(i)
			for j := 0; j < rs.ScopeSpans().Len(); j++ {
				ss := rs.ScopeSpans().At(j).Spans()
				for k := 0; k < ss.Len(); k++ {
					s := ss.At(k)
					sp := span{name: s.Name(), trace: s.TraceID().String(), id: s.SpanID().String(), kind: s.Kind(),
						status: s.Status().Code(), attrs: s.Attributes().AsRaw(), resource: rs.Resource().Attributes().AsRaw()}
					if !s.ParentSpanID().IsEmpty() {
						sp.parent = s.ParentSpanID().String()
					}
					for e := 0; e < s.Events().Len(); e++ {
						sp.events = append(sp.events, s.Events().At(e).Name())
					}
					out = append(out, sp)
				}
			}
		}
	}
	return out
}

// The coordinator's trace and the spans of its own each request is sent
// from (W3C traceparent).
const (
	coordTrace = "5b8efff798038103d269b633813fc60c"
	spanPD     = "eee19b7ec3c1b173" // PREFILL
	spanGet    = "eee19b7ec3c1b174" // STATE_GET
	spanPut    = "eee19b7ec3c1b175" // STATE_PUT
	spanHTTP   = "eee19b7ec3c1b176" // the chat completion
	ownTraceID = "a3ce929d0e0e47364bf92f3577b34da6"
)

func traceparent(parent string) string { return "00-" + coordTrace + "-" + parent + "-01" }

// TestDisaggregatedRequestTrace: PREFILL on slot 0, its state out
// (STATE_GET) and into slot 1 (STATE_PUT), then a chat completion, each
// joined to the coordinator's trace; a CONFIGURE with the coordinator's
// plain trace string and an INFO with a 32-hex id of its own. The
// collector receives every span with the right parent, name and figures,
// and the engine's log lines carry the trace_id and span_id they belong to.
func TestDisaggregatedRequestTrace(t *testing.T) {
	endpoint, sink := collector(t)
	e, err := enginetest.Start(context.Background(), enginetest.Config{
		Bin: binDir, HTTP: true, Args: []string{"--log-level", "debug", "--shutdown-grace", "5s"},
		Env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_BSP_SCHEDULE_DELAY=50",
			"OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=test"},
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = e.Stop()
		}
		if t.Failed() {
			t.Logf("ENGINE LOG\n%s", e.Logs)
		}
	}()
	c, err := transport.DialClient(context.Background(), e.TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	prefill := []byte(`{"stream":false,"n_predict":0,"messages":[{"role":"user","content":"Split me across engines"}]}`)
	call(t, c, transport.OpConfigure, "0", "startup-configure", []byte(`{"state_chunk_size":65536}`))
	call(t, c, transport.OpInfo, "0", ownTraceID, nil)
	prefillReply := call(t, c, transport.OpPrefill, "0", traceparent(spanPD), prefill)
	blob := call(t, c, transport.OpStateGet, "0", traceparent(spanGet), nil)
	call(t, c, transport.OpStatePut, "1", traceparent(spanPut), blob)
	req, _ := http.NewRequest("POST", "http://"+e.HTTP+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"Decode me"}],"max_tokens":4}`))
	req.Header.Set("traceparent", traceparent(spanHTTP))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chat completion: %d %s", resp.StatusCode, body)
	}
	var chat struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &chat); err != nil {
		t.Fatal(err)
	}
	// SIGTERM flushes what the batch has not sent yet.
	stopped = true
	if err := e.Stop(); err != nil {
		t.Fatalf("engine exit: %v\n%s", err, e.Logs)
	}
	spans := spansOf(sink)
	t.Logf("span tree as the collector received it:\n%s", tree(spans))

	find := func(name, parent string) span {
		t.Helper()
		for _, s := range spans {
			if s.name == name && s.parent == parent {
				return s
			}
		}
		t.Fatalf("no span %q with parent %q", name, parent)
		return span{}
	}
	want := func(s span, k string, v any) {
		t.Helper()
		if got := s.attrs[k]; fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("%s: %s = %v, want %v", s.name, k, got, v)
		}
	}
	positive := func(s span, keys ...string) {
		t.Helper()
		for _, k := range keys {
			if v, ok := s.attrs[k].(float64); ok && v > 0 {
				continue
			}
			if v, ok := s.attrs[k].(int64); ok && v > 0 {
				continue
			}
			t.Errorf("%s: %s = %v, want > 0", s.name, k, s.attrs[k])
		}
	}

	// The RPC requests, each a server span under the coordinator's.
	pd := find("hydra PREFILL", spanPD)
	get := find("hydra STATE_GET", spanGet)
	put := find("hydra STATE_PUT", spanPut)
	for _, s := range []span{pd, get, put} {
		if s.trace != coordTrace || s.kind != ptrace.SpanKindServer {
			t.Errorf("%s: trace %s kind %v", s.name, s.trace, s.kind)
		}
		want(s, "hydra.status", "OK")
		want(s, "hydra.status_code", 0)
		want(s, "network.transport", "tcp")
		want(s, "hydra.network", "tcp")
		want(s, "rpc.system.name", "hydra")
		want(s, "network.peer.address", "127.0.0.1")
		if s.resource["service.name"] != "hydra-engine" || s.resource["deployment.environment.name"] != "test" {
			t.Errorf("%s: resource %v", s.name, s.resource)
		}
	}
	want(pd, "rpc.method", "PREFILL")
	want(pd, "hydra.slot_key", "0")
	want(pd, "hydra.model", "mock")
	want(pd, "hydra.request.payload_bytes", len(prefill))
	want(pd, "hydra.response.payload_bytes", len(prefillReply))
	want(get, "hydra.response.payload_bytes", len(blob))
	want(put, "hydra.slot_key", "1")
	want(put, "hydra.request.payload_bytes", len(blob))

	// Their phases: the prefill, and each state transfer with its path.
	pf := find("prefill", pd.id)
	want(pf, "hydra.slot", 0)
	positive(pf, "hydra.tokens.prompt")
	for _, tr := range []struct {
		s    span
		path string
	}{{find("state_transfer get", pd.id), "shm-ring"}, {find("state_transfer get", get.id), "shm-ring"}, {find("state_transfer put", put.id), "shm-pipes"}} {
		want(tr.s, "hydra.transfer.path", tr.path)
		want(tr.s, "hydra.transfer.chunk_bytes", 65536)
		positive(tr.s, "hydra.transfer.bytes", "hydra.transfer.seconds", "hydra.transfer.gbps")
		if _, ok := tr.s.attrs["hydra.transfer.backend_wait_share"]; !ok {
			t.Errorf("%s: no backend wait share", tr.s.name)
		}
	}
	want(find("state_transfer get", get.id), "hydra.transfer.bytes", len(blob))
	want(find("state_transfer put", put.id), "hydra.transfer.bytes", len(blob))
	if _, ok := find("state_transfer put", put.id).attrs["hydra.transfer.after_payload_seconds"]; !ok {
		t.Error("STATE_PUT's transfer: no after_payload_seconds")
	}

	// The chat completion: an HTTP server span under the coordinator's,
	// with its wait for a slot, its prompt and its decode.
	hs := find("POST /v1/chat/completions", spanHTTP)
	if hs.trace != coordTrace || hs.kind != ptrace.SpanKindServer {
		t.Errorf("HTTP span: trace %s kind %v", hs.trace, hs.kind)
	}
	want(hs, "http.route", "/v1/chat/completions")
	want(hs, "http.request.method", "POST")
	want(hs, "http.response.status_code", 200)
	want(hs, "hydra.model", "mock")
	find("queue", hs.id)
	positive(find("prefill", hs.id), "hydra.tokens.prompt")
	dec := find("decode", hs.id)
	want(dec, "hydra.tokens.generated", chat.Usage.CompletionTokens)
	want(dec, "hydra.stop_reason", "length")
	positive(dec, "hydra.tokens.prompt")
	if len(dec.events) != 1 || dec.events[0] != "first_token" {
		t.Errorf("decode events %v", dec.events)
	}

	// Trace strings that are no traceparent.
	cf := find("hydra CONFIGURE", "")
	want(cf, "hydra.trace_id", "startup-configure")
	if cf.trace == coordTrace {
		t.Error("CONFIGURE joined the coordinator's trace")
	}
	info := find("hydra INFO", "")
	if info.trace != ownTraceID {
		t.Errorf("INFO with the coordinator's id %s: trace %s", ownTraceID, info.trace)
	}
	want(info, "hydra.trace_id", ownTraceID)

	// The log lines of a request name its trace and span.
	var line string
	for _, l := range strings.Split(e.Logs.String(), "\n") {
		if strings.Contains(l, "state transfer") && strings.Contains(l, "direction=put") {
			line = l
		}
	}
	for _, f := range []string{"trace_id=" + coordTrace, "span_id=" + put.id, "path=shm-pipes"} {
		if !strings.Contains(line, f) {
			t.Errorf("the STATE_PUT's log line %q lacks %s", line, f)
		}
	}
}

// call sends one request with a trace field and returns the reply's payload.
func call(t *testing.T, c *transport.Client, op transport.Op, key, traceField string, payload []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Do(ctx, transport.Request{Op: op, Key: key, Trace: traceField, Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload))})
	if err != nil {
		t.Fatalf("%v: %v", op, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.Status != transport.StatusOK {
		t.Fatalf("%v: status %v, %v, meta %s", op, resp.Status, err, resp.Meta)
	}
	return b
}

// tree draws the spans as parents and children, with their key attributes.
func tree(spans []span) string {
	byParent := map[string][]span{}
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.id] = true
	}
	for _, s := range spans {
		p := s.parent
		if !ids[p] {
			p = "root:" + s.trace + ":" + s.parent
		}
		byParent[p] = append(byParent[p], s)
	}
	var b strings.Builder
	var draw func(s span, depth int)
	draw = func(s span, depth int) {
		keys := make([]string, 0, len(s.attrs))
		for k := range s.attrs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, fmt.Sprintf("%s=%v", k, s.attrs[k]))
		}
		fmt.Fprintf(&b, "%s%s [span %s]", strings.Repeat("    ", depth), s.name, s.id)
		if len(s.events) > 0 {
			fmt.Fprintf(&b, " events=%v", s.events)
		}
		fmt.Fprintf(&b, "\n%s    %s\n", strings.Repeat("    ", depth), strings.Join(kv, " "))
		for _, c := range byParent[s.id] {
			draw(c, depth+1)
		}
	}
	roots := make([]string, 0)
	for p := range byParent {
		if strings.HasPrefix(p, "root:") {
			roots = append(roots, p)
		}
	}
	sort.Strings(roots)
	for _, r := range roots {
		parts := strings.SplitN(r, ":", 3)
		fmt.Fprintf(&b, "trace %s, remote parent %q\n", parts[1], parts[2])
		for _, s := range byParent[r] {
			draw(s, 1)
		}
	}
	return b.String()
}
