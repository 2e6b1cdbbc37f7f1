package weir

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weir-dev/weir/algorithm"
)

// Mode says what a Request does with its cost.
type Mode uint8

// The modes.
const (
	// ModeTake admits the cost if it fits and consumes it, as AllowN does.
	ModeTake Mode = iota
	// ModeDebit always consumes the cost, even past the limit: the key
	// goes into debt (see Limiter.Debit).
	ModeDebit
	// ModeRefund gives the cost back, never beyond an empty state (see
	// Limiter.Refund).
	ModeRefund
	// ModeAtMost admits as much of the cost as is available, at least
	// one, instead of all or nothing (see Limiter.AllowAtMost).
	ModeAtMost
	// ModeRelease gives back the concurrency lease named by Lease (see
	// Lease.Release). N is unused.
	ModeRelease
	// ModeReset clears the key's state under the limit, penalty box
	// included (see Limiter.Reset). N is unused.
	ModeReset
)

// String returns the mode's name: "take", "debit", "refund", "at_most",
// "release" or "reset".
func (m Mode) String() string {
	switch m {
	case ModeTake:
		return "take"
	case ModeDebit:
		return "debit"
	case ModeRefund:
		return "refund"
	case ModeAtMost:
		return "at_most"
	case ModeRelease:
		return "release"
	case ModeReset:
		return "reset"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// AlgorithmMode returns the algorithm.Mode a store decides r with.
func (r *Request) AlgorithmMode() algorithm.Mode {
	switch {
	case r.Mode == ModeDebit:
		return algorithm.Debit
	case r.Mode == ModeRefund && !r.Stamp.IsZero():
		return algorithm.Settle
	case r.Mode == ModeRefund:
		return algorithm.Credit
	case r.Mode == ModeAtMost:
		return algorithm.AtMost
	}
	return algorithm.Exact
}

// Check returns nil if r can be decided: its limit compiles and CheckWith
// accepts it. It is the one validation of a request; stores and wrappers
// that check before they decide call it (or CheckWith, once they hold the
// compiled limit).
func (r *Request) Check() error {
	p, err := r.Limit.Compile()
	if err != nil {
		return err
	}
	return r.CheckWith(&p)
}

// CheckWith is Check under p, r.Limit compiled: a take's cost must be
// within 0..the most p can admit at once (an at-most take's is capped to
// it first); a debit's or refund's must be a debt p allows (CheckDebt);
// a dated refund's Stamp must date it (checkStamp). A release or reset
// has no cost to check.
func (r *Request) CheckWith(p *algorithm.Params) error {
	switch r.Mode {
	case ModeTake:
		return CheckCost(r.Key, r.N, p.MaxCost())
	case ModeAtMost:
		return CheckCost(r.Key, min(r.N, p.MaxCost()), p.MaxCost())
	case ModeDebit, ModeRefund:
		if err := CheckDebt(r.Key, r.N, p, r.AlgorithmMode()); err != nil {
			return err
		}
		if r.Mode == ModeRefund && !r.Stamp.IsZero() {
			return checkStamp(r.Stamp, r.N)
		}
		return nil
	case ModeRelease, ModeReset:
		return nil
	}
	return fmt.Errorf("%w: unknown mode %s", ErrUnsupported, r.Mode)
}

// ErrSettled: the reservation was already settled.
var ErrSettled = errors.New("weir: reservation already settled")

// CheckDebt returns nil if a debit or refund (mode algorithm.Debit or
// algorithm.Credit) of n can apply to key under p: an error wrapping
// ErrUnsupported if p's algorithm has no debt (concurrency, a
// shaping leaky bucket), or ErrInvalidCost
// unless 0 <= n <= algorithm.MaxDebt. Stores call it.
func CheckDebt(key string, n int64, p *algorithm.Params, mode algorithm.Mode) error {
	name := "debit"
	if mode >= algorithm.Credit {
		name = "refund"
	}
	if !p.Debts() {
		why := p.Kind.String()
		if p.Shaping() {
			why = "a shaping " + why + " (max_delay)"
		}
		return fmt.Errorf("%w: %s is not defined for %s", ErrUnsupported, name, why)
	}
	if n < 0 || n > algorithm.MaxDebt {
		return fmt.Errorf("%w: %s of %d for key %q is outside 0..%d", ErrInvalidCost, name, n, key, int64(algorithm.MaxDebt))
	}
	return nil
}

// oneBuf holds the one-request batch of a Limiter call other than a take:
// pooled, as slices passed to Do through an interface would escape.
type oneBuf struct {
	req [1]Request
	res [1]Result
}

var oneBufs = sync.Pool{New: func() any { return new(oneBuf) }}

// one runs a single request through the store's Do.
func (lim *Limiter) one(ctx context.Context, r Request) (Result, error) {
	b := oneBufs.Get().(*oneBuf)
	b.req[0] = r
	err := lim.store.Do(ctx, b.req[:], b.res[:])
	res := b.res[0]
	*b = oneBuf{}
	oneBufs.Put(b)
	return res, err
}

// Debit consumes n events for key under l whether or not they fit: the key
// goes into debt, which it pays back at the limit's rate before anything
// fits again. Result.Allowed says whether n fitted, Granted is n, and
// Remaining, RetryAfter and ResetAfter describe the key afterwards:
// RetryAfter is when a cost of 1 fits again, debt included. A debit that
// did not fit starts the penalty box of a limit with Block. n == 0 peeks.
// docs/algorithms.md ("Debt") says what debt means per algorithm;
// concurrency and a shaping leaky bucket return ErrUnsupported.
func (lim *Limiter) Debit(ctx context.Context, key string, l Limit, n int64) (Result, error) {
	return lim.one(ctx, Request{Key: key, Limit: l, N: n, Mode: ModeDebit})
}

// Refund gives back up to n events consumed earlier for key under l, never
// beyond an empty state, and reports the key afterwards as Peek does. It
// does not lift a penalty box.
func (lim *Limiter) Refund(ctx context.Context, key string, l Limit, n int64) (Result, error) {
	return lim.one(ctx, Request{Key: key, Limit: l, N: n, Mode: ModeRefund})
}

// A Reservation is an admitted estimate whose real cost is settled later.
// Until Settle it stays charged at its estimate, so one that is never
// settled costs what was estimated.
type Reservation struct {
	Key      string
	Limit    Limit
	Estimate int64
	// Stamp dates the take by the store's clock (Result.At): Settle then
	// refunds no more than the limit cannot have recovered since. Zero
	// when the store gave no time.
	Stamp Stamp

	lim     *Limiter
	mu      sync.Mutex
	settled bool
}

// A Stamp dates the take of a reservation by the store's own clock, so
// that its settlement refunds only what the limit cannot have recovered
// since: a refund into a window, trailing period or refilled bucket that
// has moved on would otherwise give back capacity the limit already
// recovered (docs/algorithms.md, "Debt"). The zero Stamp is unknown.
type Stamp struct {
	At        int64 // µs since the Unix epoch by the store's clock; 0: unknown
	Estimate  int64 // the cost the take took
	Remaining int64 // Result.Remaining right after the take
}

// IsZero reports whether st dates nothing.
func (st Stamp) IsZero() bool { return st.At == 0 }

// checkStamp returns nil if st can date the settlement of a refund of n
// (at most its estimate), or an error wrapping ErrInvalidCost that names
// the bad value. Stores call it.
func checkStamp(st Stamp, n int64) error {
	switch {
	case n > st.Estimate:
		return fmt.Errorf("%w: a settlement's refund of %d exceeds its take's estimate %d", ErrInvalidCost, n, st.Estimate)
	case st.At < 0:
		return fmt.Errorf("%w: stamp time %d is negative", ErrInvalidCost, st.At)
	case st.Estimate < 0 || st.Estimate > algorithm.MaxDebt:
		return fmt.Errorf("%w: stamp estimate %d is outside 0..%d", ErrInvalidCost, st.Estimate, int64(algorithm.MaxDebt))
	case st.Remaining < 0 || st.Remaining > algorithm.MaxDebt:
		return fmt.Errorf("%w: stamp remaining %d is outside 0..%d", ErrInvalidCost, st.Remaining, int64(algorithm.MaxDebt))
	}
	return nil
}

// StampAdmitted sets results[i].At to at (µs by the store's clock) for
// each request i that is a take (ModeTake) of N > 0, with no lease,
// admitted in full, and
// to 0 for every other: the time an admitted take's settlement is dated
// by. Stores call it from Do.
func StampAdmitted(reqs []Request, results []Result, at int64) {
	for i := range reqs {
		r := &reqs[i]
		if r.Mode != ModeTake || r.Lease != "" || r.N <= 0 || !results[i].Allowed || results[i].Granted != r.N {
			results[i].At = 0
			continue
		}
		results[i].At = at
	}
}

// Reserve admits estimate events for key under l as AllowN does. When they
// are admitted it returns a Reservation to Settle with the real cost; when
// rejected the Reservation is nil and nothing is consumed. The limit's
// algorithm must support debt (see Debit). The reservation is stamped with
// the store's time of the take (Result.At).
func (lim *Limiter) Reserve(ctx context.Context, key string, l Limit, estimate int64) (*Reservation, Result, error) {
	p, err := l.Compile()
	if err != nil {
		return nil, Result{}, err
	}
	if err := CheckDebt(key, estimate, &p, algorithm.Debit); err != nil {
		return nil, Result{}, err
	}
	res, err := lim.one(ctx, Request{Key: key, Limit: l, N: estimate})
	if err != nil || !res.Allowed {
		return nil, res, err
	}
	return &Reservation{Key: key, Limit: l, Estimate: estimate, Stamp: res.Stamp(estimate), lim: lim}, res, nil
}

// Settle charges the reservation's real cost: it debits actual − estimate
// when more was used, refunds estimate − actual when less was, and
// reports the key afterwards. A stamped reservation's refund gives back
// only what the limit cannot have recovered since the take
// (SettleStamped). Settling twice returns ErrSettled; a failed Settle (the
// store's error) may be retried.
func (r *Reservation) Settle(ctx context.Context, actual int64) (Result, error) {
	if actual < 0 || actual > algorithm.MaxDebt {
		return Result{}, fmt.Errorf("%w: actual cost %d is outside 0..%d", ErrInvalidCost, actual, int64(algorithm.MaxDebt))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.settled {
		return Result{}, ErrSettled
	}
	st := r.Stamp
	st.Estimate = r.Estimate
	res, err := r.lim.SettleStamped(ctx, r.Key, r.Limit, st, actual)
	if err == nil {
		r.settled = true
	}
	return res, err
}

// Settle charges the difference between a cost estimated (and taken)
// earlier and the real one, for callers that keep their reservations
// themselves. It knows nothing of when the estimate was taken: its refund
// goes into the state as it is now (Refund), which gives back capacity the
// limit has already recovered if the take's window or trailing period has
// moved on, or its bucket refilled, since. Keep the reservation's Stamp
// and call SettleStamped where you can.
func (lim *Limiter) Settle(ctx context.Context, key string, l Limit, estimate, actual int64) (Result, error) {
	switch {
	case actual > estimate:
		return lim.Debit(ctx, key, l, actual-estimate)
	case actual < estimate:
		return lim.Refund(ctx, key, l, estimate-actual)
	}
	return lim.Peek(ctx, key, l)
}

// SettleStamped is Settle for a take dated by st (a Reservation's Stamp;
// st.Estimate is the estimate): a debit is the same; a refund of
// st.Estimate − actual gives back only what the limit cannot have
// recovered since st.At, so that the state is left no fuller than had the
// take cost actual, whatever happened in between (docs/algorithms.md,
// "Debt", gives the bound per algorithm). A zero st.At is Settle.
func (lim *Limiter) SettleStamped(ctx context.Context, key string, l Limit, st Stamp, actual int64) (Result, error) {
	if st.IsZero() || actual >= st.Estimate {
		return lim.Settle(ctx, key, l, st.Estimate, actual)
	}
	if err := checkStamp(st, st.Estimate-actual); err != nil {
		return Result{}, err
	}
	return lim.one(ctx, Request{Key: key, Limit: l, N: st.Estimate - actual, Mode: ModeRefund, Stamp: st})
}
