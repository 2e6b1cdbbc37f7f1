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
}

// ResultOf converts an algorithm decision into a Result. Stores call it.
func ResultOf(d algorithm.Decision) Result {
	r := Result{
		Allowed:    d.Allowed,
		Limit:      d.Limit,
		Remaining:  d.Remaining,
		RetryAfter: time.Duration(d.RetryAfter) * time.Microsecond,
		ResetAfter: time.Duration(d.ResetAfter) * time.Microsecond,
		Granted:    d.Granted,
		Delay:      time.Duration(d.Delay) * time.Microsecond,
	}
	if d.BlockedUntil != 0 {
		r.BlockedUntil = time.UnixMicro(d.BlockedUntil)
	}
	return r
}
