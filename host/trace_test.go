package host

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport"
)

// mockServer serves the in-process mock backend over TCP with tp (nil:
// traces off) and returns a client of it.
func mockServer(t testing.TB, tp trace.TracerProvider, log hclog.Logger) *transport.Client {
	t.Helper()
	m := mock.New(nil)
	info, err := m.Load(context.Background(), iface.LoadRequest{NSlots: 2})
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(m, info, nil, Config{Logger: log, TracerProvider: tp})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(s.Close)
	c, err := transport.DialClient(context.Background(), "tcp://"+l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// do sends one request with a trace field and reads the whole reply.
func do(t testing.TB, c *transport.Client, op transport.Op, key, traceField string, payload []byte) transport.Status {
	t.Helper()
	resp, err := c.Do(context.Background(), transport.Request{Op: op, Key: key, Trace: traceField,
		Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	return resp.Status
}

func attrOf(sp sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range sp.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestRequestSpans: every request is a server span in the trace its trace
// field names, with its phases as children, and the lines it logs name it.
func TestRequestSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	logs := enginetest.NewLog(0)
	c := mockServer(t, tp, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}))
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if st := do(t, c, transport.OpPrefill, "0", "00-"+tid+"-"+sid+"-01", []byte(`{"messages":[{"role":"user","content":"hi"}]}`)); st != transport.StatusOK {
		t.Fatalf("PREFILL: %v", st)
	}
	if st := do(t, c, transport.OpStatePut, "1", "startup-configure", []byte("not a blob")); st != transport.StatusError {
		t.Fatalf("STATE_PUT of a bad blob: %v", st)
	}
	// A request's span ends after its reply is out.
	var spans []sdktrace.ReadOnlySpan
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if spans = rec.Ended(); len(spans) > 0 && spans[len(spans)-1].Name() == "hydra STATE_PUT" {
			break
		}
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		byName[sp.Name()] = sp
	}
	pre, put := byName["hydra PREFILL"], byName["hydra STATE_PUT"]
	if pre == nil || put == nil {
		t.Fatalf("spans %v", names(spans))
	}
	if pre.SpanContext().TraceID().String() != tid || pre.Parent().SpanID().String() != sid || pre.SpanKind() != trace.SpanKindServer {
		t.Errorf("PREFILL: trace %s parent %s kind %v", pre.SpanContext().TraceID(), pre.Parent().SpanID(), pre.SpanKind())
	}
	if attrOf(pre, tracing.KeyStatus).AsString() != "OK" || attrOf(pre, tracing.KeySlotKey).AsString() != "0" ||
		attrOf(pre, tracing.KeyPayloadOut).AsInt64() == 0 || attrOf(pre, tracing.KeyNetwork).AsString() != "tcp" {
		t.Errorf("PREFILL attributes %v", pre.Attributes())
	}
	for _, child := range []string{tracing.SpanPrefill, tracing.SpanTransferGet} {
		if sp := byName[child]; sp == nil || sp.Parent().SpanID() != pre.SpanContext().SpanID() {
			t.Errorf("%s is not a child of PREFILL (spans %v)", child, names(spans))
		}
	}
	if put.Parent().IsValid() || attrOf(put, tracing.KeyTraceField).AsString() != "startup-configure" ||
		attrOf(put, tracing.KeyStatus).AsString() != "ERROR" || put.Status().Description == "" {
		t.Errorf("STATE_PUT: parent %v, attributes %v, status %v", put.Parent(), put.Attributes(), put.Status())
	}
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "STATE_PUT failed") {
			line = l
		}
	}
	for _, want := range []string{"trace_id=" + put.SpanContext().TraceID().String(), "span_id=" + put.SpanContext().SpanID().String()} {
		if !strings.Contains(line, want) {
			t.Errorf("the STATE_PUT's log line %q lacks %s", line, want)
		}
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var n []string
	for _, sp := range spans {
		n = append(n, sp.Name())
	}
	return n
}

// BenchmarkRequest: one request over TCP to the in-process mock, with
// traces off and on (every span recorded, batched to an exporter that drops
// them), the caller's traceparent on each: STATE_META (the host alone) and
// PREFILL (its phases and its blob).
func BenchmarkRequest(b *testing.B) {
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, op := range []struct {
		op      transport.Op
		payload []byte
	}{
		{transport.OpStateMeta, nil},
		{transport.OpPrefill, []byte(`{"messages":[{"role":"user","content":"Hello, Hydra"}]}`)},
	} {
		for _, on := range []bool{false, true} {
			name := op.op.String() + "/off"
			var tp trace.TracerProvider
			if on {
				name = op.op.String() + "/on"
				sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
				tp = sdk
			}
			b.Run(name, func(b *testing.B) {
				c := mockServer(b, tp, hclog.NewNullLogger())
				b.ReportAllocs()
				for b.Loop() {
					if st := do(b, c, op.op, "0", parent, op.payload); st != transport.StatusOK {
						b.Fatal(st)
					}
				}
			})
		}
	}
}
