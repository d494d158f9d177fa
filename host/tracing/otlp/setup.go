// Package otlp exports the engine's traces over OTLP/HTTP as the standard
// OTEL_* environment configures it; apart from host/tracing so that only the
// engine's binary links the SDK and the exporter.
package otlp

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// The variables Setup reads itself; the SDK and the exporter read the rest
// of OTEL_EXPORTER_OTLP_*, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*.
const (
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envExporter       = "OTEL_TRACES_EXPORTER"
	envSDKDisabled    = "OTEL_SDK_DISABLED"
	envSampler        = "OTEL_TRACES_SAMPLER"
	envPropagators    = "OTEL_PROPAGATORS"
)

// ServiceName is service.name unless OTEL_SERVICE_NAME (or service.name in
// OTEL_RESOURCE_ATTRIBUTES) says otherwise.
const ServiceName = "hydra-engine"

// Provider is the engine's tracer provider: the SDK's, exporting over
// OTLP/HTTP, or none when the environment names no endpoint.
type Provider struct {
	sdk *sdktrace.TracerProvider
}

// Setup builds the tracer provider the OTEL_* environment asks for. Traces
// are off (no exporter, no goroutine; Provider is nil) unless
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set,
// and with OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true. A setting
// the engine cannot honour (another exporter or protocol, a malformed
// endpoint or resource) is an error, not a silent default.
func Setup(ctx context.Context, version string, log hclog.Logger) (*Provider, error) {
	endpoint, err := exportEndpoint(os.LookupEnv)
	if err != nil || endpoint == "" {
		return &Provider{}, err
	}
	if v := os.Getenv(envPropagators); v != "" && v != "tracecontext" {
		log.Warn("traces: callers join by W3C traceparent/tracestate only; "+envPropagators+" is not read", envPropagators, v)
	}
	otel.SetErrorHandler(&errorLog{log: log})
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("traces: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(ServiceName), semconv.ServiceVersion(version)),
		resource.WithHost(), resource.WithProcessPID(), resource.WithTelemetrySDK(),
		resource.WithFromEnv()) // last: the environment's attributes win
	if err != nil {
		return nil, fmt.Errorf("traces: the resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	sampler := os.Getenv(envSampler)
	if sampler == "" {
		sampler = "parentbased_always_on"
	}
	log.Info("exporting traces over OTLP/HTTP", "endpoint", endpoint, "sampler", sampler)
	return &Provider{sdk: tp}, nil
}

// exportEndpoint is the endpoint traces go to, "" when they are off.
func exportEndpoint(lookup func(string) (string, bool)) (string, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get(envSDKDisabled), "true") {
		return "", nil
	}
	switch e := get(envExporter); e {
	case "", "otlp":
	case "none":
		return "", nil
	default:
		return "", fmt.Errorf("%s=%s: the engine exports traces over OTLP only (otlp or none)", envExporter, e)
	}
	name, endpoint := envTracesEndpoint, get(envTracesEndpoint)
	if endpoint == "" {
		name, endpoint = envEndpoint, get(envEndpoint)
	}
	if endpoint == "" {
		return "", nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%s=%q: not an http:// or https:// URL", name, endpoint)
	}
	for _, k := range []string{envTracesProtocol, envProtocol} {
		switch p := get(k); p {
		case "", "http/protobuf", "http/json":
			continue
		default:
			return "", fmt.Errorf("%s=%s: the engine exports OTLP over HTTP (http/protobuf or http/json)", k, p)
		}
	}
	return endpoint, nil
}

// TracerProvider is the tracer provider, nil when traces are off.
func (t *Provider) TracerProvider() trace.TracerProvider {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk
}

// Shutdown exports the spans not yet sent, until ctx ends, and stops the
// exporter.
func (t *Provider) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// errorLogInterval is the least time between two log lines of failed
// exports, so an unreachable collector costs a line a minute, not one a batch.
const errorLogInterval = time.Minute

// errorLog logs the SDK's errors (failed exports, a bad sampler argument).
type errorLog struct {
	log        hclog.Logger
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (e *errorLog) Handle(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if now := time.Now(); e.last.IsZero() || now.Sub(e.last) >= errorLogInterval {
		e.log.Warn("traces: OpenTelemetry SDK", "error", err, "errors_not_logged", e.suppressed,
			"next_line_after", errorLogInterval)
		e.last, e.suppressed = now, 0
		return
	}
	e.suppressed++
}
