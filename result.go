package weir

import (
	"time"

	"github.com/weir-dev/weir/algorithm"
)

// Result is the outcome of one decision.
type Result struct {
	Allowed      bool
	Limit        int64         // the quota: Rate, or Burst for the bucket algorithms
	Remaining    int64         // events that could still be admitted now
	RetryAfter   time.Duration // when a retry can succeed; 0 if allowed
	ResetAfter   time.Duration // when the limit is fully replenished
	BlockedUntil time.Time     // set while a penalty box holds the key

	// Granted is how many events were admitted: n for an admitted AllowN, up
	// to n for AllowAtMost, 0 when rejected and when peeking.
	Granted int64
	// Delay is how long a shaping leaky bucket asks the caller to hold an
	// admitted request before passing it on.
	Delay time.Duration
	// At is when an admitted take of N > 0 was decided, in µs since the
	// Unix epoch by the store's clock (Redis: its TIME), as Store.Do sets
	// it; 0 when unknown (Take, a rejection, another mode, an answer from
	// a cache). It dates a settlement (Stamp).
	At int64
}

// Stamp returns the Stamp of r as the result of a take of estimate: zero
// unless r carries the take's time (At).
func (r *Result) Stamp(estimate int64) Stamp {
	if r.At == 0 {
		return Stamp{}
	}
	return Stamp{At: r.At, Estimate: estimate, Remaining: r.Remaining}
}

// ResultOf converts an algorithm step's Outcome into a Result. Stores call it.
func ResultOf(d algorithm.Outcome) Result {
	var r Result
	r.SetOutcome(&d)
	return r
}

// SetOutcome sets every field of r to the Result of d, as ResultOf does,
// in place: a store whose caller's Result is at hand (a named result, a
// slot of a batch's results) fills it without copying a Result through
// its frames.
func (r *Result) SetOutcome(d *algorithm.Outcome) {
	r.Allowed = d.Allowed
	r.Limit = d.Limit
	r.Remaining = d.Remaining
	r.RetryAfter = time.Duration(d.RetryAfter) * time.Microsecond
	r.ResetAfter = time.Duration(d.ResetAfter) * time.Microsecond
	r.Granted = d.Granted
	r.Delay = time.Duration(d.Delay) * time.Microsecond
	r.At = 0
	r.BlockedUntil = time.Time{}
	if d.BlockedUntil != 0 {
		r.BlockedUntil = time.UnixMicro(d.BlockedUntil)
	}
}
