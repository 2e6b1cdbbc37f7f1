package server

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/weir-dev/weir/weirotel"
)

// WithTracing traces every check with t (weirotel.New, given the program's
// tracer provider; weir serve builds it from the OTEL_* environment): a span per POST /v1/check,
// GET /v1/auth and gRPC call, from the request's W3C trace context, with
// the deciding rule, its tier, allowed and the fallback as attributes, and
// a child span per store call. nil (the default) traces nothing.
func WithTracing(t *weirotel.Tracing) Option { return func(o *options) { o.tracing = t } }

// traced wraps a decision endpoint in a check span named name.
func (s *Server) traced(name string, h http.HandlerFunc) http.HandlerFunc {
	t := s.o.tracing
	if t == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, c := t.StartCheck(r.Context(), name, propagation.HeaderCarrier(r.Header),
			attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path))
		defer c.End()
		h(w, r.WithContext(ctx))
	}
}

// traceGRPC is the gRPC server's interceptor: a check span per call, from
// the trace context in its metadata. Health checks are not traced.
func (s *Server) traceGRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod == "/grpc.health.v1.Health/Check" {
		return h(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ctx, c := s.o.tracing.StartCheck(ctx, "weir.grpc", weirotel.MetadataCarrier(md), attribute.String("rpc.method", info.FullMethod))
	defer c.End()
	return h(ctx, req)
}
