// Package weir is a rate limiter whose state lives in a Store: in memory for
// one process, or in Redis so that many instances share one limit.
//
// A Limit says how many events a key may have per period and which
// algorithm counts them. A Limiter asks its Store to decide each request:
// the decision and the state change happen in one atomic step, so
// concurrent callers can never overshoot the limit. The Result says whether
// the request was allowed, how many remain, and exactly when a retry can
// succeed.
//
//	lim := weir.NewLimiter(memstore.New())
//	login := weir.Limit{Algorithm: weir.SlidingLog, Rate: 5, Period: 15 * time.Minute, Block: 15 * time.Minute}
//	res, err := lim.Allow(ctx, weir.Key("login", clientIP), login)
//	if err == nil && !res.Allowed {
//		// reject; res.RetryAfter says when to come back
//	}
//
// Every algorithm obeys the same rules: a rejected request consumes
// nothing; a cost of 0 peeks without consuming; RetryAfter is the earliest
// instant at which the same request would be admitted; ResetAfter is when
// the key's state is back to empty.
package weir

import (
	"context"
	"errors"
	"fmt"

	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/keys"
)

// Store keeps limiter state and makes each decision atomically. memstore and
// redisstore implement it; storetest checks any implementation. A wrapper
// (a cache, a circuit breaker, tracing) implements the same two methods
// and is composed explicitly around the store it wraps.
type Store interface {
	// Take decides a request of cost n against key's state under l and
	// consumes n if it is admitted. n == 0 peeks without consuming. It is
	// Do of one ModeTake request without the slices: the hot path.
	Take(ctx context.Context, key string, l Limit, n int64) (Result, error)
	// Do decides reqs in one atomic step and writes request i's outcome
	// to res[i] (res must be as long as reqs). A batch of several
	// requests takes (ModeTake, ModeAtMost) all or nothing: every request
	// is admitted and consumes, or none consumes; a rejected request's
	// penalty box still starts. A request of any other mode comes alone.
	// An admitted take of N > 0 carries the store's time in Result.At.
	Do(ctx context.Context, reqs []Request, res []Result) error
}

// A Request is one decision of a Store's Do.
type Request struct {
	Key   string
	Limit Limit
	N     int64
	// Mode: what the request does with N (the default takes it).
	Mode Mode
	// Lease names the concurrency lease an admitted take acquires, or the
	// lease a ModeRelease gives back. Empty, on a take, means an
	// anonymous lease that only expires.
	Lease string
	// Stamp, with ModeRefund: the refund settles the take it dates and
	// gives back only what the limit cannot have recovered since
	// (Limiter.SettleStamped). Zero: a plain refund.
	Stamp Stamp
}

// Errors that callers can test with errors.Is.
var (
	// ErrInvalidLimit: the Limit cannot be used. The error is a *LimitError.
	ErrInvalidLimit = errors.New("weir: invalid limit")
	// ErrInvalidCost: n is negative or larger than the limit can ever admit.
	ErrInvalidCost = errors.New("weir: invalid cost")
	// ErrStore: the store failed (network, timeout, Redis error). Stores wrap it.
	ErrStore = errors.New("weir: store failed")
	// ErrUnsupported: the request cannot be decided (a debit under a
	// limit without debt, a batch of requests that must come alone).
	ErrUnsupported = errors.New("weir: not supported by this store")
	// ErrNotSent: the decision was never sent to the store (it waited for
	// a free connection past its deadline, or the caller's own bound on
	// work per call refused it). It wraps ErrStore, so on_error applies,
	// but it says nothing about the store's health: circuit breakers and
	// store-error metrics must not count it.
	ErrNotSent = fmt.Errorf("%w: decision not sent", ErrStore)
)

// CheckCost returns an error wrapping ErrInvalidCost unless 0 <= n <= max.
func CheckCost(key string, n, max int64) error {
	if n < 0 || n > max {
		return fmt.Errorf("%w: cost %d for key %q is outside 0..%d, the most this limit can admit at once", ErrInvalidCost, n, key, max)
	}
	return nil
}

// Limiter decides requests against a Store. It is safe for concurrent use
// and holds no state of its own, so any number of Limiters in any number of
// processes may share one Redis store.
type Limiter struct {
	store Store
}

// NewLimiter returns a Limiter over store.
func NewLimiter(store Store) *Limiter { return &Limiter{store: store} }

// Store returns the limiter's store.
func (lim *Limiter) Store() Store { return lim.store }

// Allow reports whether one event for key may happen now under l, and
// consumes it if so.
func (lim *Limiter) Allow(ctx context.Context, key string, l Limit) (Result, error) {
	return lim.store.Take(ctx, key, l, 1)
}

// AllowN reports whether n events for key may happen now, all or nothing,
// and consumes them if so. n == 0 peeks.
func (lim *Limiter) AllowN(ctx context.Context, key string, l Limit, n int64) (Result, error) {
	return lim.store.Take(ctx, key, l, n)
}

// Peek reports what Allow would decide, without consuming anything.
func (lim *Limiter) Peek(ctx context.Context, key string, l Limit) (Result, error) {
	return lim.store.Take(ctx, key, l, 0)
}

// AllowAtMost admits as many of n events as the limit allows now, at least
// one, and reports the count in Result.Granted. It suits batching: a worker
// asks for 100 and processes what it is granted.
func (lim *Limiter) AllowAtMost(ctx context.Context, key string, l Limit, n int64) (Result, error) {
	return lim.one(ctx, Request{Key: key, Limit: l, N: n, Mode: ModeAtMost})
}

// Reset clears key's state under l, including any penalty box.
func (lim *Limiter) Reset(ctx context.Context, key string, l Limit) error {
	_, err := lim.one(ctx, Request{Key: key, Limit: l, Mode: ModeReset})
	return err
}

// A Lease holds concurrency slots until it is released or its TTL (the
// limit's Period) runs out, so a crashed holder cannot leak a slot.
type Lease struct {
	ID     string
	Key    string
	Limit  Limit
	Weight int64
	lim    *Limiter
}

// Release gives the lease's slots back. Releasing twice, or after the TTL,
// is harmless.
func (l *Lease) Release(ctx context.Context) error {
	_, err := l.lim.one(ctx, Request{Key: l.Key, Limit: l.Limit, Mode: ModeRelease, Lease: l.ID})
	return err
}

// Acquire takes one slot of a concurrency limit. When admitted it returns a
// Lease to Release; when rejected the Lease is nil and Result says when a
// slot will free up at the latest.
func (lim *Limiter) Acquire(ctx context.Context, key string, l Limit) (*Lease, Result, error) {
	return lim.AcquireN(ctx, key, l, 1)
}

// AcquireN is Acquire for a lease of weight n.
func (lim *Limiter) AcquireN(ctx context.Context, key string, l Limit, n int64) (*Lease, Result, error) {
	if k, _ := l.Algorithm.Kind(); !k.Supports(algorithm.FeatureLeases) {
		return nil, Result{}, &LimitError{Input: l.String(), Field: "algorithm", Reason: fmt.Sprintf("Acquire needs the concurrency algorithm, not %q", string(l.Algorithm))}
	}
	if n <= 0 {
		return nil, Result{}, fmt.Errorf("%w: a lease needs a positive weight, got %d", ErrInvalidCost, n)
	}
	id := keys.NewLeaseID()
	res, err := lim.one(ctx, Request{Key: key, Limit: l, N: n, Lease: id})
	if err != nil || !res.Allowed {
		return nil, res, err
	}
	return &Lease{ID: id, Key: key, Limit: l, Weight: n, lim: lim}, res, nil
}
