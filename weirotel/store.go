package weirotel

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/weir-dev/weir"
)

// Store wraps s so that every call makes a span, a child of the caller's
// (a check's): "weir.store.take", "weir.store.reset" and, when s is a
// weir.MultiStore (as the wrapper then is), "weir.store.take_all" and
// "weir.store.release". Spans carry the hits asked and the answer, never
// the key (an identity). A call under a span the sampler dropped makes
// none. A nil *Tracing returns s itself.
func (t *Tracing) Store(s weir.Store) weir.Store {
	if t == nil {
		return s
	}
	ts := &tracedStore{s: s, t: t}
	if m, ok := s.(weir.MultiStore); ok {
		return &tracedMulti{tracedStore: ts, m: m}
	}
	return ts
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

// TakeStamped implements weir.StampStore as Take does, under the same
// span: the wrapped store's Stamp (when it is a weir.StampStore), or a zero
// one when it dates no takes.
func (ts *tracedStore) TakeStamped(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, weir.Stamp, error) {
	ss, ok := ts.s.(weir.StampStore)
	if !ok {
		res, err := ts.Take(ctx, key, l, n)
		return res, weir.Stamp{}, err
	}
	if unsampled(ctx) {
		return ss.TakeStamped(ctx, key, l, n)
	}
	ctx, span := ts.start(ctx, "weir.store.take", AttrHits.Int64(n))
	res, st, err := ss.TakeStamped(ctx, key, l, n)
	if err == nil {
		span.SetAttributes(AttrAllowed.Bool(res.Allowed))
	}
	end(span, err)
	return res, st, err
}

// Reset implements weir.Store.
func (ts *tracedStore) Reset(ctx context.Context, key string, l weir.Limit) error {
	if unsampled(ctx) {
		return ts.s.Reset(ctx, key, l)
	}
	ctx, span := ts.start(ctx, "weir.store.reset")
	err := ts.s.Reset(ctx, key, l)
	end(span, err)
	return err
}

// Timeout is the wrapped store's own deadline per call, if it has one, so
// that a guard in front sees it (0 otherwise).
func (ts *tracedStore) Timeout() time.Duration {
	if t, ok := ts.s.(interface{ Timeout() time.Duration }); ok {
		return t.Timeout()
	}
	return 0
}

// Unwrap returns the wrapped store.
func (ts *tracedStore) Unwrap() weir.Store { return ts.s }

type tracedMulti struct {
	*tracedStore
	m weir.MultiStore
}

// TakeAll implements weir.MultiStore.
func (tm *tracedMulti) TakeAll(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if unsampled(ctx) {
		return tm.m.TakeAll(ctx, reqs, results)
	}
	ctx, span := tm.start(ctx, "weir.store.take_all", AttrRequests.Int(len(reqs)))
	err := tm.m.TakeAll(ctx, reqs, results)
	end(span, err)
	return err
}

// TakeAllStamped implements weir.StampAllStore as TakeAll does, under the
// same span: the wrapped store's Stamps (when it is a
// weir.StampAllStore), or zero ones when it dates no batches.
func (tm *tracedMulti) TakeAllStamped(ctx context.Context, reqs []weir.Request, results []weir.Result, stamps []weir.Stamp) error {
	sa, ok := tm.m.(weir.StampAllStore)
	if !ok {
		if len(stamps) < len(reqs) {
			return fmt.Errorf("weirotel: %d stamps for %d requests", len(stamps), len(reqs))
		}
		clear(stamps[:len(reqs)])
		return tm.TakeAll(ctx, reqs, results)
	}
	if unsampled(ctx) {
		return sa.TakeAllStamped(ctx, reqs, results, stamps)
	}
	ctx, span := tm.start(ctx, "weir.store.take_all", AttrRequests.Int(len(reqs)))
	err := sa.TakeAllStamped(ctx, reqs, results, stamps)
	end(span, err)
	return err
}

// Release implements weir.MultiStore.
func (tm *tracedMulti) Release(ctx context.Context, key string, l weir.Limit, lease string) error {
	if unsampled(ctx) {
		return tm.m.Release(ctx, key, l, lease)
	}
	ctx, span := tm.start(ctx, "weir.store.release")
	err := tm.m.Release(ctx, key, l, lease)
	end(span, err)
	return err
}
