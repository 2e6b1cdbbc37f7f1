// Package weirotel traces weir's rate-limit decisions with OpenTelemetry:
// a span per check (an HTTP request through the middleware, or a call to
// weir serve's /v1/check, /v1/auth and gRPC ShouldRateLimit) with the rule,
// tier, allowed and fallback as attributes, and a child span per store
// call. Trace context comes from the incoming request (W3C traceparent).
//
// The core packages (weir, algorithm, httplimit) depend on no tracing
// library; this package plugs OpenTelemetry into them:
//
//	tr, err := weirotel.FromEnv(ctx, os.LookupEnv) // nil unless OTEL_* asks for traces
//	store := tr.Store(redis)                       // a span per store call
//	lim := weir.NewLimiter(store)
//	mw := httplimit.New(lim, limit, httplimit.WithTracer(tr.Middleware()))
//
// Every method works on a nil *Tracing, doing nothing, so that callers
// need not test whether tracing is on.
package weirotel

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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
	shutdown   func(context.Context) error
}

// New traces with tp, reading incoming trace context with prop (W3C
// trace context and baggage when nil). The caller owns tp.
func New(tp trace.TracerProvider, prop propagation.TextMapPropagator) *Tracing {
	if prop == nil {
		prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Tracing{tracer: tp.Tracer(ScopeName), propagator: prop}
}

// Enabled reports whether the standard OTEL_* environment variables ask
// for traces: an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER=otlp, and
// not OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none.
func Enabled(lookup func(string) (string, bool)) bool {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false
	case "":
	default:
		return true
	}
	return get("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// FromEnv builds tracing from the standard OTEL_* environment variables,
// or returns nil when they do not ask for it (Enabled). The exporter is
// OTLP over HTTP/protobuf, or gRPC with OTEL_EXPORTER_OTLP_PROTOCOL (or
// _TRACES_PROTOCOL) grpc; the exporter, the sampler (OTEL_TRACES_SAMPLER),
// the batch processor (OTEL_BSP_*) and the resource (OTEL_SERVICE_NAME,
// default "weir", and OTEL_RESOURCE_ATTRIBUTES) read their own variables
// from the process environment. Call Shutdown to flush at exit.
func FromEnv(ctx context.Context, lookup func(string) (string, bool)) (*Tracing, error) {
	if !Enabled(lookup) {
		return nil, nil
	}
	get := func(k string) string { v, _ := lookup(k); return strings.ToLower(strings.TrimSpace(v)) }
	if exp := get("OTEL_TRACES_EXPORTER"); exp != "" && exp != "otlp" {
		return nil, fmt.Errorf("weirotel: OTEL_TRACES_EXPORTER=%q: weir exports traces by otlp only (or none)", exp)
	}
	proto := get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp *otlptrace.Exporter
	var err error
	switch proto {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("weirotel: OTLP protocol %q: want http/protobuf or grpc", proto)
	}
	if err != nil {
		return nil, fmt.Errorf("weirotel: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "weir")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("weirotel: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t := New(tp, nil)
	t.shutdown = tp.Shutdown
	return t, nil
}

// Shutdown flushes the spans not yet exported and stops the provider
// FromEnv made; it does nothing for New's.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// Extract returns ctx with the trace context that carrier (a request's
// headers or metadata) holds.
func (t *Tracing) Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	if t == nil {
		return ctx
	}
	return t.propagator.Extract(ctx, carrier)
}
