// Package tracing is the engine's OpenTelemetry traces: the tracer provider
// the OTEL_* environment configures (Setup), how a Hydra request's trace
// field and an HTTP request's traceparent join the caller's trace, the child
// spans of a request's phases, and the log fields that join a request's log
// lines to its span. Spans are made only under a recorded parent, so with
// traces off a phase costs one context lookup.
package tracing

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope of the engine's spans.
const Scope = "github.com/hydra-engine/hydra-engine"

// Attribute keys of the engine's spans, shared by the RPC and HTTP sides.
const (
	KeyTraceField   = attribute.Key("hydra.trace_id") // a Hydra trace field that is no traceparent
	KeySlotKey      = attribute.Key("hydra.slot_key")
	KeySlot         = attribute.Key("hydra.slot")
	KeyStatus       = attribute.Key("hydra.status")
	KeyStatusCode   = attribute.Key("hydra.status_code")
	KeyAborted      = attribute.Key("hydra.aborted")
	KeyPayloadIn    = attribute.Key("hydra.request.payload_bytes")
	KeyPayloadOut   = attribute.Key("hydra.response.payload_bytes")
	KeyNetwork      = attribute.Key("hydra.network") // the listener's scheme: tcp, tls, unix
	KeyModel        = attribute.Key("hydra.model")
	KeyPromptTokens = attribute.Key("hydra.tokens.prompt")
	KeyReused       = attribute.Key("hydra.tokens.reused")
	KeyGenerated    = attribute.Key("hydra.tokens.generated")
	KeyNPast        = attribute.Key("hydra.n_past")
	KeyStopReason   = attribute.Key("hydra.stop_reason")
	KeyDirection    = attribute.Key("hydra.transfer.direction")
	KeyBytes        = attribute.Key("hydra.transfer.bytes")
	KeySeconds      = attribute.Key("hydra.transfer.seconds")
	KeyGBps         = attribute.Key("hydra.transfer.gbps")
	KeyPath         = attribute.Key("hydra.transfer.path")
	KeyChunk        = attribute.Key("hydra.transfer.chunk_bytes")
	KeyBackendWait  = attribute.Key("hydra.transfer.backend_wait_seconds")
	KeyWaitShare    = attribute.Key("hydra.transfer.backend_wait_share")
	KeyAfterPayload = attribute.Key("hydra.transfer.after_payload_seconds")
	KeyQueueAhead   = attribute.Key("hydra.queue.ahead")
	KeyQueueWaited  = attribute.Key("hydra.queue.waited")
	KeyTraceparent  = attribute.Key("http.request.header.traceparent") // one no caller's trace could be read from
)

// Span names of the phases.
const (
	SpanQueue       = "queue"
	SpanPrefill     = "prefill"
	SpanDecode      = "decode"
	SpanTransferGet = "state_transfer get"
	SpanTransferPut = "state_transfer put"
)

// maxText is the most of a client's string (a trace field, a slot key, a
// header) an attribute keeps; the rest is cut and its length said.
const maxText = 256

// Text is s as an attribute value: valid UTF-8 (OTLP's protobuf refuses
// anything else, and with it the whole batch), at most maxText bytes.
func Text(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxText {
		return s
	}
	cut := maxText
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:cut], len(s))
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

var traceContext = propagation.TraceContext{}

// JoinHydra joins ctx to the trace a Hydra request's trace field names: a
// W3C traceparent becomes the remote parent; any other text is returned as
// the hydra.trace_id attribute and, when it is 32 hex digits, names the
// trace of a remote parent without a span, so the request's span is a root
// in that trace. A field that names nothing leaves ctx as it is.
func JoinHydra(ctx context.Context, field string) (context.Context, []attribute.KeyValue) {
	if field == "" {
		return ctx, nil
	}
	if j := traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": field}); trace.SpanContextFromContext(j).IsValid() {
		return j, nil
	}
	attrs := []attribute.KeyValue{KeyTraceField.String(Text(field))}
	if len(field) == 32 {
		if id, err := trace.TraceIDFromHex(strings.ToLower(field)); err == nil {
			ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: id, Remote: true}))
		}
	}
	return ctx, attrs
}

// JoinHTTP joins ctx to the trace of an HTTP request's traceparent and
// tracestate headers; a traceparent that names no trace is returned as an
// attribute.
func JoinHTTP(ctx context.Context, h http.Header) (context.Context, []attribute.KeyValue) {
	j := traceContext.Extract(ctx, propagation.HeaderCarrier(h))
	if tp := h.Values("traceparent"); len(tp) > 0 && !trace.SpanContextFromContext(j).IsValid() {
		v := make([]string, len(tp))
		for i, s := range tp {
			v[i] = Text(s)
		}
		return j, []attribute.KeyValue{KeyTraceparent.StringSlice(v)}
	}
	return j, nil
}

// Recording reports whether ctx's span is recorded: its phases get spans.
func Recording(ctx context.Context) bool { return trace.SpanFromContext(ctx).IsRecording() }

// LogFields are the hclog fields that join a log line to ctx's span,
// trace_id and span_id; none when the span is not recorded.
func LogFields(ctx context.Context) []any {
	sp := trace.SpanFromContext(ctx)
	if !sp.IsRecording() {
		return nil
	}
	sc := sp.SpanContext()
	return []any{"trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String()}
}

// Logger is log with ctx's LogFields.
func Logger(ctx context.Context, log hclog.Logger) hclog.Logger {
	if f := LogFields(ctx); f != nil {
		return log.With(f...)
	}
	return log
}

// End sets a span's status from err (nil: left unset) and ends it.
func End(sp trace.Span, err error, opts ...trace.SpanEndOption) {
	if err != nil {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End(opts...)
}

// record starts a child span of ctx's at start.
func record(ctx context.Context, name string, start time.Time, attrs ...attribute.KeyValue) trace.Span {
	tr := trace.SpanFromContext(ctx).TracerProvider().Tracer(Scope)
	_, sp := tr.Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	return sp
}

// Prefill is what a prefill did.
type Prefill struct {
	Slot         int
	PromptTokens int // tokens in the slot after it
	Reused       int // of those, kept from the slot's previous sequence
}

// Record makes the prefill's span, from start to end, under ctx's.
func (p Prefill) Record(ctx context.Context, start, end time.Time, err error) {
	if !Recording(ctx) {
		return
	}
	sp := record(ctx, SpanPrefill, start, KeySlot.Int(p.Slot), KeyPromptTokens.Int(p.PromptTokens), KeyReused.Int(p.Reused))
	End(sp, err, trace.WithTimestamp(end))
}

// Decode is what a decode did.
type Decode struct {
	Slot         int
	Generated    int
	PromptTokens int // the sequence's tokens before it
	Reused       int // of the prompt's, kept from the slot's previous sequence
	StopReason   string
	FirstToken   time.Time // zero: none came
}

// Record makes the decode's span, from start to end, under ctx's; the first
// token is an event.
func (d Decode) Record(ctx context.Context, start, end time.Time, err error) {
	if !Recording(ctx) {
		return
	}
	sp := record(ctx, SpanDecode, start, KeySlot.Int(d.Slot), KeyGenerated.Int(d.Generated),
		KeyPromptTokens.Int(d.PromptTokens), KeyReused.Int(d.Reused), KeyStopReason.String(d.StopReason))
	if !d.FirstToken.IsZero() {
		sp.AddEvent("first_token", trace.WithTimestamp(d.FirstToken))
	}
	End(sp, err, trace.WithTimestamp(end))
}

// Transfer is one state transfer: a STATE_GET's or a PREFILL's blob out
// (Put false), a STATE_PUT's in.
type Transfer struct {
	Put          bool
	Slot         int
	Bytes        int64
	Chunk        int
	Path         string // shm.TransferTrace's
	BackendWait  time.Duration
	AfterPayload time.Duration
}

// Record makes the transfer's span, from start to end, under ctx's.
func (x Transfer) Record(ctx context.Context, start, end time.Time, err error) {
	if !Recording(ctx) {
		return
	}
	name, dir := SpanTransferGet, "get"
	if x.Put {
		name, dir = SpanTransferPut, "put"
	}
	secs := end.Sub(start).Seconds()
	var gbps, share float64
	if secs > 0 {
		gbps, share = float64(x.Bytes)/secs/1e9, x.BackendWait.Seconds()/secs
	}
	attrs := []attribute.KeyValue{KeySlot.Int(x.Slot), KeyDirection.String(dir), KeyBytes.Int64(x.Bytes),
		KeySeconds.Float64(secs), KeyGBps.Float64(gbps), KeyPath.String(x.Path), KeyChunk.Int(x.Chunk),
		KeyBackendWait.Float64(x.BackendWait.Seconds()), KeyWaitShare.Float64(share)}
	if x.Put {
		attrs = append(attrs, KeyAfterPayload.Float64(x.AfterPayload.Seconds()))
	}
	End(record(ctx, name, start, attrs...), err, trace.WithTimestamp(end))
}

// Queue is a completion's wait for a slot.
type Queue struct {
	Slot   int  // the slot it got, -1 none
	Ahead  int  // completions waiting before it when it joined
	Waited bool // none was free at once
}

// Record makes the wait's span, from start to end, under ctx's.
func (q Queue) Record(ctx context.Context, start, end time.Time, err error) {
	if !Recording(ctx) {
		return
	}
	sp := record(ctx, SpanQueue, start, KeySlot.Int(q.Slot), KeyQueueAhead.Int(q.Ahead), KeyQueueWaited.Bool(q.Waited))
	End(sp, err, trace.WithTimestamp(end))
}

// SetModel names the model that serves ctx's span's request.
func SetModel(ctx context.Context, alias string) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(KeyModel.String(alias))
	}
}
