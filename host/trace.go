package host

import (
	"crypto/tls"
	"net"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/transport"
)

// peerAttrs are the span attributes of a connection's peer, nil with
// traces off.
func (s *Server) peerAttrs(c net.Conn) []attribute.KeyValue {
	if s.tracer == nil {
		return nil
	}
	network := c.LocalAddr().Network()
	scheme := network
	if _, ok := c.(*tls.Conn); ok {
		scheme = "tls"
	}
	attrs := []attribute.KeyValue{tracing.KeyNetwork.String(scheme), semconv.NetworkTransportKey.String(network),
		semconv.RPCSystemNameKey.String("hydra")}
	if host, port, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil && network == "tcp" {
		attrs = append(attrs, semconv.NetworkPeerAddress(host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, semconv.NetworkPeerPort(p))
		}
	}
	return attrs
}

// startSpan starts req's span, joined to the trace its trace field names,
// and makes it req's context; without a tracer the context is the server's.
func (s *Server) startSpan(req *request, peer []attribute.KeyValue) trace.Span {
	req.ctx = s.ctx
	if s.tracer == nil {
		return nil
	}
	ctx, joined := tracing.JoinHydra(s.ctx, req.trace)
	op := req.hdr.Op.String()
	attrs := append(append(make([]attribute.KeyValue, 0, len(peer)+len(joined)+3), peer...), joined...)
	attrs = append(attrs, semconv.RPCMethod(op), tracing.KeySlotKey.String(tracing.Text(req.key)),
		tracing.KeyPayloadIn.Int64(int64(req.hdr.PayloadLen)))
	ctx, sp := s.tracer.Start(ctx, "hydra "+op, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	req.ctx = ctx
	return sp
}

// endSpan ends req's span with the reply's status; err is the request's
// failure, after which the connection closes (hydra.aborted).
func endSpan(sp trace.Span, rp *replier, err error) {
	if sp == nil {
		return
	}
	if rp.sent {
		sp.SetAttributes(tracing.KeyStatus.String(rp.status.String()), tracing.KeyStatusCode.Int(int(rp.status)),
			tracing.KeyPayloadOut.Int64(int64(rp.payloadLen)))
	}
	switch {
	case err != nil:
		sp.SetAttributes(tracing.KeyAborted.Bool(true))
		sp.SetStatus(codes.Error, err.Error())
	case rp.status == transport.StatusError:
		sp.SetStatus(codes.Error, "ERROR")
	}
	sp.End()
}
