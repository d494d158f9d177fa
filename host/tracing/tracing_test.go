package tracing

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// recorder is an SDK tracer provider whose ended spans a test reads.
func recorder(t *testing.T) (*tracetest.SpanRecorder, trace.Tracer) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp.Tracer(Scope)
}

func attr(attrs []attribute.KeyValue, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range attrs {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestJoinHydra: a traceparent is the parent; 32 hex digits are the trace
// of a span without a parent; anything else starts a trace of its own; any
// but a traceparent is kept as hydra.trace_id, valid UTF-8 and bounded.
func TestJoinHydra(t *testing.T) {
	const tid, sid = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	long := strings.Repeat("x", 1000)
	for _, tc := range []struct {
		field, traceID, parent string
		attr                   string // "" none
	}{
		{field: "00-" + tid + "-" + sid + "-01", traceID: tid, parent: sid},
		{field: strings.ToUpper(tid), traceID: tid, attr: strings.ToUpper(tid)},
		{field: "startup-configure", attr: "startup-configure"},
		{field: "00-" + tid + "-0000000000000000-01", attr: "00-" + tid + "-0000000000000000-01"},
		{field: "00000000000000000000000000000000", attr: "00000000000000000000000000000000"},
		{field: "bad\xffutf8", attr: "bad\uFFFDutf8"},
		{field: long, attr: long[:maxText] + "…(1000 bytes)"},
		{field: ""},
	} {
		rec, tr := recorder(t)
		ctx, attrs := JoinHydra(context.Background(), tc.field)
		_, sp := tr.Start(ctx, "r", trace.WithAttributes(attrs...))
		sp.End()
		got := rec.Ended()[0]
		if tc.traceID != "" && got.SpanContext().TraceID().String() != tc.traceID {
			t.Errorf("%q: trace %s, want %s", tc.field, got.SpanContext().TraceID(), tc.traceID)
		}
		if p := got.Parent().SpanID(); (tc.parent == "" && p.IsValid()) || (tc.parent != "" && p.String() != tc.parent) {
			t.Errorf("%q: parent %s, want %q", tc.field, p, tc.parent)
		}
		v, ok := attr(got.Attributes(), KeyTraceField)
		if ok != (tc.attr != "") || v.AsString() != tc.attr || !utf8.ValidString(v.AsString()) {
			t.Errorf("%q: hydra.trace_id %q (%v), want %q", tc.field, v.AsString(), ok, tc.attr)
		}
	}
}

// TestJoinHTTP: traceparent and tracestate join; a traceparent that names no
// trace is kept as an attribute.
func TestJoinHTTP(t *testing.T) {
	rec, tr := recorder(t)
	h := http.Header{}
	h.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.Set("tracestate", "hydra=1")
	ctx, attrs := JoinHTTP(context.Background(), h)
	_, sp := tr.Start(ctx, "r", trace.WithAttributes(attrs...))
	sp.End()
	h.Set("traceparent", "00-zz")
	ctx, attrs = JoinHTTP(context.Background(), h)
	_, sp = tr.Start(ctx, "r", trace.WithAttributes(attrs...))
	sp.End()
	joined, bad := rec.Ended()[0], rec.Ended()[1]
	if joined.Parent().SpanID().String() != "b7ad6b7169203331" || joined.SpanContext().TraceState().Get("hydra") != "1" || len(joined.Attributes()) != 0 {
		t.Errorf("joined: parent %s, state %v, attributes %v", joined.Parent().SpanID(), joined.SpanContext().TraceState(), joined.Attributes())
	}
	if v, ok := attr(bad.Attributes(), KeyTraceparent); !ok || bad.Parent().IsValid() || v.AsStringSlice()[0] != "00-zz" {
		t.Errorf("bad traceparent: parent %v, attributes %v", bad.Parent(), bad.Attributes())
	}
}

// TestPhaseSpans: phases are children of the request's span with their
// figures; without a recorded parent none is made.
func TestPhaseSpans(t *testing.T) {
	rec, tr := recorder(t)
	ctx, root := tr.Start(context.Background(), "req")
	t0 := time.Now()
	Transfer{Put: true, Slot: 2, Bytes: 2e9, Chunk: 1 << 20, Path: "shm-pipes", BackendWait: 500 * time.Millisecond}.Record(ctx, t0, t0.Add(time.Second), nil)
	Decode{Slot: 1, Generated: 5, StopReason: "eos", FirstToken: t0.Add(time.Millisecond)}.Record(ctx, t0, t0.Add(time.Second), errors.New("gone"))
	Prefill{Slot: 1, PromptTokens: 9}.Record(context.Background(), t0, t0, nil) // no parent: nothing
	root.End()
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	put, dec := spans[0], spans[1]
	for _, sp := range []sdktrace.ReadOnlySpan{put, dec} {
		if sp.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("%s: parent %s", sp.Name(), sp.Parent().SpanID())
		}
	}
	if v, _ := attr(put.Attributes(), KeyGBps); put.Name() != SpanTransferPut || v.AsFloat64() != 2 {
		t.Errorf("%s: %v", put.Name(), put.Attributes())
	}
	if v, _ := attr(put.Attributes(), KeyWaitShare); v.AsFloat64() != 0.5 {
		t.Errorf("backend wait share %v", v.AsFloat64())
	}
	if dec.Status().Description != "gone" || len(dec.Events()) != 1 || dec.Events()[0].Name != "first_token" {
		t.Errorf("decode: status %v, events %v", dec.Status(), dec.Events())
	}
}

// TestLogFields: a request's log lines name its trace and span.
func TestLogFields(t *testing.T) {
	_, tr := recorder(t)
	ctx, sp := tr.Start(context.Background(), "req")
	defer sp.End()
	var out bytes.Buffer
	Logger(ctx, hclog.New(&hclog.LoggerOptions{Output: &out})).Info("hello")
	for _, want := range []string{"trace_id=" + sp.SpanContext().TraceID().String(), "span_id=" + sp.SpanContext().SpanID().String()} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log %q lacks %q", out.String(), want)
		}
	}
	if l := hclog.NewNullLogger(); Logger(context.Background(), l) != l {
		t.Error("a line without a span got fields")
	}
}
