package weirotel

import (
	"context"
	"net/http"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/weir-dev/weir/httplimit"
)

// A Check is the span of one check: the decisions of one request. Its
// methods are safe for concurrent use and do nothing on a nil *Check.
type Check struct {
	span trace.Span

	mu      sync.Mutex
	rules   int
	allowed bool
	set     bool // the span's rule attributes are set
}

type checkKey struct{}

// CheckFrom returns the Check that StartCheck put in ctx, or nil.
func CheckFrom(ctx context.Context) *Check {
	c, _ := ctx.Value(checkKey{}).(*Check)
	return c
}

// StartCheck starts a check's span, named name, as a child of the trace
// context in carrier (nil: of ctx's span), and returns the context the
// decisions should run under, which carries the Check (CheckFrom) and
// makes store calls its children. The Check is nil when the span is not
// sampled.
func (t *Tracing) StartCheck(ctx context.Context, name string, carrier propagation.TextMapCarrier, attrs ...attribute.KeyValue) (context.Context, *Check) {
	if t == nil {
		return ctx, nil
	}
	if carrier != nil {
		ctx = t.propagator.Extract(ctx, carrier)
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	if !span.IsRecording() {
		// Not sampled: the context still carries the span, for
		// propagation, but there is nothing to record.
		return ctx, nil
	}
	c := &Check{span: span, allowed: true}
	return context.WithValue(ctx, checkKey{}, c), c
}

// Decision records one rule's decision: the span's attributes name the
// first rule, or the first that rejected, and weir.allowed is false once
// any enforced rule rejected. fallback names the on_error fallback that
// decided while the store failed; err is the store's error, if any.
func (c *Check) Decision(rule, tier string, allowed, shadow bool, fallback string, err error) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rules++
	rejects := !allowed && !shadow
	if !c.set || (rejects && c.allowed) {
		c.set = true
		attrs := []attribute.KeyValue{AttrRule.String(rule)}
		if tier != "" {
			attrs = append(attrs, AttrTier.String(tier))
		}
		if shadow {
			attrs = append(attrs, AttrShadow.Bool(true))
		}
		c.span.SetAttributes(attrs...)
	}
	if rejects {
		c.allowed = false
	}
	if fallback != "" {
		c.span.SetAttributes(AttrFallback.String(fallback))
	}
	if err != nil {
		c.span.RecordError(err)
		c.span.SetStatus(codes.Error, "store failed")
	}
}

// Denied records a request that a deny list refused without any rule.
func (c *Check) Denied() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.allowed = false
	c.mu.Unlock()
}

// End sets weir.allowed and weir.rules and ends the span.
func (c *Check) End() {
	if c == nil {
		return
	}
	c.mu.Lock()
	c.span.SetAttributes(AttrAllowed.Bool(c.allowed), AttrRules.Int(c.rules))
	c.mu.Unlock()
	c.span.End()
}

// Middleware returns the httplimit.Tracer that traces httplimit.New and
// policy.Middleware: a span per request's check, named "weir.check", from
// the request's W3C trace context.
func (t *Tracing) Middleware() httplimit.Tracer { return middlewareTracer{t} }

type middlewareTracer struct{ t *Tracing }

func (m middlewareTracer) StartCheck(r *http.Request) (context.Context, func([]httplimit.Observation)) {
	ctx, c := m.t.StartCheck(r.Context(), "weir.check", propagation.HeaderCarrier(r.Header))
	return ctx, func(ds []httplimit.Observation) {
		for _, d := range ds {
			if d.DenyListed {
				c.Denied()
				continue
			}
			if d.AllowListed {
				continue
			}
			c.Decision(d.Rule, d.Tier, d.Allowed, d.Shadow, d.Fallback, d.Err)
		}
		c.End()
	}
}

// MetadataCarrier reads and writes trace context in gRPC metadata.
type MetadataCarrier metadata.MD

// Get returns the first value of key.
func (m MetadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set sets key to value.
func (m MetadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

// Keys lists the keys.
func (m MetadataCarrier) Keys() []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
