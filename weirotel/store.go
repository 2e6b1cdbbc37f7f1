package weirotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/weir-dev/weir"
)

// Store wraps s so that every call makes a span, a child of the caller's
// (a check's): "weir.store.take" for Take, and for Do "weir.store.reset"
// and "weir.store.release" for a reset and a release, "weir.store.take_all"
// for the rest. Spans carry the hits asked and the answer, never the key
// (an identity). A call under a span the sampler dropped makes none. A nil
// *Tracing returns s itself.
func (t *Tracing) Store(s weir.Store) weir.Store {
	if t == nil {
		return s
	}
	return &tracedStore{s: s, t: t}
}

type tracedStore struct {
	s weir.Store
	t *Tracing
}

// unsampled reports whether ctx's span is one the sampler dropped: its
// store calls then make no spans either.
func unsampled(ctx context.Context) bool {
	sc := trace.SpanContextFromContext(ctx)
	return sc.IsValid() && !sc.IsSampled()
}

func (ts *tracedStore) start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return ts.t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "store call failed")
	}
	span.End()
}

// Take implements weir.Store.
func (ts *tracedStore) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if unsampled(ctx) {
		return ts.s.Take(ctx, key, l, n)
	}
	ctx, span := ts.start(ctx, "weir.store.take", AttrHits.Int64(n))
	res, err := ts.s.Take(ctx, key, l, n)
	if err == nil {
		span.SetAttributes(AttrAllowed.Bool(res.Allowed))
	}
	end(span, err)
	return res, err
}

// Do implements weir.Store.
func (ts *tracedStore) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if unsampled(ctx) {
		return ts.s.Do(ctx, reqs, results)
	}
	var span trace.Span
	switch {
	case len(reqs) == 1 && reqs[0].Mode == weir.ModeReset:
		ctx, span = ts.start(ctx, "weir.store.reset")
	case len(reqs) == 1 && reqs[0].Mode == weir.ModeRelease:
		ctx, span = ts.start(ctx, "weir.store.release")
	default:
		ctx, span = ts.start(ctx, "weir.store.take_all", AttrRequests.Int(len(reqs)))
	}
	err := ts.s.Do(ctx, reqs, results)
	end(span, err)
	return err
}
