package httpapi

import (
	"net"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hydra-engine/hydra-engine/host/tracing"
)

// traceRequests makes a server span of every request h serves, joined to
// the caller's trace by its traceparent and tracestate headers, named by
// the route the mux matched (semantic conventions: "POST /v1/completions").
func traceRequests(h http.Handler, tracer trace.Tracer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, joined := tracing.JoinHTTP(r.Context(), r.Header)
		method := knownMethod(r.Method)
		attrs := append(joined, semconv.HTTPRequestMethodKey.String(method), semconv.URLPath(tracing.Text(r.URL.Path)))
		if method != r.Method {
			attrs = append(attrs, semconv.HTTPRequestMethodOriginal(tracing.Text(r.Method)))
		}
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			attrs = append(attrs, semconv.ClientAddress(host))
		}
		ctx, sp := tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer sp.End()
		sw := &statusWriter{ResponseWriter: w}
		r = r.WithContext(ctx)
		h.ServeHTTP(sw, r)
		// The mux set the pattern it matched on r (none: 404, or refused first).
		if _, route, ok := strings.Cut(r.Pattern, " "); ok {
			sp.SetName(method + " " + route)
			sp.SetAttributes(semconv.HTTPRoute(route))
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK
		}
		sp.SetAttributes(semconv.HTTPResponseStatusCode(code))
		if code >= 500 {
			sp.SetStatus(codes.Error, http.StatusText(code))
		}
	})
}

// knownMethod is the method, or "_OTHER" for one HTTP does not define, so
// that clients cannot make span names of their own.
func knownMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return m
	}
	return "_OTHER"
}

// statusWriter remembers the status a handler replied with; Unwrap keeps
// http.ResponseController's flushes and deadlines reaching the connection.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
