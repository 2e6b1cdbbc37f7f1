// Package weirotel traces weir's rate-limit decisions with OpenTelemetry:
// a span per check (an HTTP request through the middleware, or a call to
// weir serve's /v1/check, /v1/auth and gRPC ShouldRateLimit) with the rule,
// tier, allowed and fallback as attributes, and a child span per store
// call. Trace context comes from the incoming request (W3C traceparent).
//
// The core packages (weir, algorithm, httplimit) depend on no tracing
// library; this package plugs OpenTelemetry into them. It depends on the
// OpenTelemetry API only, not on its SDK or an exporter: the program
// configures the SDK (or none) and hands New the tracer provider:
//
//	tr := weirotel.New(otel.GetTracerProvider(), nil) // the provider the program set
//	store := tr.Store(redis)                          // a span per store call
//	lim := weir.NewLimiter(store)
//	mw := httplimit.New(lim, limit, httplimit.WithTracer(tr.Middleware()))
//
// Every method works on a nil *Tracing, doing nothing, so that callers
// need not test whether tracing is on.
package weirotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of weir's spans.
const ScopeName = "github.com/weir-dev/weir"

// Attribute keys of weir's spans.
const (
	AttrRule     = attribute.Key("weir.rule")     // the rule that decided (the rejecting one, if any)
	AttrTier     = attribute.Key("weir.tier")     // its tier
	AttrAllowed  = attribute.Key("weir.allowed")  // whether the check let the request through
	AttrFallback = attribute.Key("weir.fallback") // the on_error fallback that decided, if the store failed
	AttrShadow   = attribute.Key("weir.shadow")   // a shadow rule's would-be decision
	AttrRules    = attribute.Key("weir.rules")    // how many rules decided
	AttrHits     = attribute.Key("weir.hits")     // the hits a store call asked for
	AttrRequests = attribute.Key("weir.requests") // decisions in one batched store call
)

// Tracing is a tracer provider and the propagator that reads trace
// context from incoming requests.
type Tracing struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

// New traces with tp, reading incoming trace context with prop (W3C
// trace context and baggage when nil). The caller owns tp: it configured
// it (sampler, exporter, resource) and shuts it down at exit.
func New(tp trace.TracerProvider, prop propagation.TextMapPropagator) *Tracing {
	if prop == nil {
		prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Tracing{tracer: tp.Tracer(ScopeName), propagator: prop}
}

// Extract returns ctx with the trace context that carrier (a request's
// headers or metadata) holds.
func (t *Tracing) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	if t == nil {
		return ctx
	}
	return t.propagator.Extract(ctx, carrier)
}
