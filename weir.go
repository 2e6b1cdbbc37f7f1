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
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/weir-dev/weir/algorithm"
)

// Store keeps limiter state and makes each decision atomically. memstore and
// redisstore implement it; storetest checks any implementation.
type Store interface {
	// Take decides a request of cost n against key's state under l and
	// consumes n if it is admitted. n == 0 peeks without consuming.
	Take(ctx context.Context, key string, l Limit, n int64) (Result, error)
	// Reset clears key's state under l, penalty box included.
	Reset(ctx context.Context, key string, l Limit) error
}

// A Request is one decision in a TakeAll batch.
type Request struct {
	Key   string
	Limit Limit
	N     int64
	// AtMost grants as much of N as is available, instead of all or nothing.
	AtMost bool
	// Lease names the concurrency lease an admitted request acquires, for a
	// later Release. Empty means an anonymous lease that only expires.
	Lease string
	// Mode: take (the default), debit or refund. A batch of more than one
	// request takes only.
	Mode Mode
	// Stamp, with ModeRefund: the refund settles the take it dates and
	// gives back only what the limit cannot have recovered since
	// (Limiter.SettleStamped). Zero: a plain refund.
	Stamp Stamp
}

// MultiStore is a Store that can also decide several requests atomically
// and release concurrency leases. memstore and redisstore implement it;
// AllowAtMost, Acquire and multi-limit policies need it.
type MultiStore interface {
	Store
	// TakeAll decides every request in one atomic step: either every
	// request is admitted and consumes, or none consumes. results must be
	// as long as reqs. A rejected request's penalty box still starts.
	TakeAll(ctx context.Context, reqs []Request, results []Result) error
	// Release gives back the concurrency lease id held on key.
	Release(ctx context.Context, key string, l Limit, lease string) error
}

// Errors that callers can test with errors.Is.
var (
	// ErrInvalidLimit: the Limit cannot be used. The error is a *LimitError.
	ErrInvalidLimit = errors.New("weir: invalid limit")
	// ErrInvalidCost: n is negative or larger than the limit can ever admit.
	ErrInvalidCost = errors.New("weir: invalid cost")
	// ErrStore: the store failed (network, timeout, Redis error). Stores wrap it.
	ErrStore = errors.New("weir: store failed")
	// ErrUnsupported: the Store lacks a capability the call needs.
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
	ms, ok := lim.store.(MultiStore)
	if !ok {
		return Result{}, fmt.Errorf("%w: AllowAtMost needs a MultiStore", ErrUnsupported)
	}
	var res [1]Result
	err := ms.TakeAll(ctx, []Request{{Key: key, Limit: l, N: n, AtMost: true}}, res[:])
	return res[0], err
}

// Reset clears key's state under l, including any penalty box.
func (lim *Limiter) Reset(ctx context.Context, key string, l Limit) error {
	return lim.store.Reset(ctx, key, l)
}

// A Lease holds concurrency slots until it is released or its TTL (the
// limit's Period) runs out, so a crashed holder cannot leak a slot.
type Lease struct {
	ID     string
	Key    string
	Limit  Limit
	Weight int64
	store  MultiStore
}

// Release gives the lease's slots back. Releasing twice, or after the TTL,
// is harmless.
func (l *Lease) Release(ctx context.Context) error {
	return l.store.Release(ctx, l.Key, l.Limit, l.ID)
}

// Acquire takes one slot of a concurrency limit. When admitted it returns a
// Lease to Release; when rejected the Lease is nil and Result says when a
// slot will free up at the latest.
func (lim *Limiter) Acquire(ctx context.Context, key string, l Limit) (*Lease, Result, error) {
	return lim.AcquireN(ctx, key, l, 1)
}

// AcquireN is Acquire for a lease of weight n.
func (lim *Limiter) AcquireN(ctx context.Context, key string, l Limit, n int64) (*Lease, Result, error) {
	ms, ok := lim.store.(MultiStore)
	if !ok {
		return nil, Result{}, fmt.Errorf("%w: Acquire needs a MultiStore", ErrUnsupported)
	}
	if k, _ := l.Algorithm.Kind(); !k.Supports(algorithm.FeatureLeases) {
		return nil, Result{}, &LimitError{Input: l.String(), Field: "algorithm", Reason: fmt.Sprintf("Acquire needs the concurrency algorithm, not %q", string(l.Algorithm))}
	}
	if n <= 0 {
		return nil, Result{}, fmt.Errorf("%w: a lease needs a positive weight, got %d", ErrInvalidCost, n)
	}
	id := NewLeaseID()
	var res [1]Result
	if err := ms.TakeAll(ctx, []Request{{Key: key, Limit: l, N: n, Lease: id}}, res[:]); err != nil {
		return nil, res[0], err
	}
	if !res[0].Allowed {
		return nil, res[0], nil
	}
	return &Lease{ID: id, Key: key, Limit: l, Weight: n, store: ms}, res[0], nil
}

// NewLeaseID returns a random lease identifier.
func NewLeaseID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// StoreAs returns the first store that is a T in the chain that starts at
// s and follows wrappers' Unwrap() Store methods (the deny cache and the
// tracing wrapper offer one), so that a wrapper need not re-implement
// every optional interface of the store it wraps.
func StoreAs[T any](s Store) (T, bool) {
	for range 8 { // wrappers are few; a cycle must not hang
		if t, ok := s.(T); ok {
			return t, true
		}
		u, ok := s.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		s = u.Unwrap()
	}
	var zero T
	return zero, false
}
