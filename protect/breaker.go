package protect

import "time"

// State is a circuit breaker's state: a protect rule's, and store/guard's
// (guard.BreakerState is this type).
type State int8

// The breaker states.
const (
	Closed   State = iota // calls pass and their outcomes are counted
	Open                  // calls are refused until OpenFor has passed
	HalfOpen              // Probes calls pass; their outcomes decide
)

// NumStates is how many states there are, for arrays indexed by State.
const NumStates = 3

// String returns "closed", "open" or "half_open".
func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	}
	return "closed"
}

const breakerBuckets = 10

// bucket is one tenth of a breaker's window.
type bucket struct {
	slot                int64 // the bucket's start, in bucket widths since the epoch
	total, slow, failed int
}

// breaker is a circuit breaker; its owner's mutex guards it.
type breaker struct {
	cfg      BreakerConfig
	width    time.Duration // of a bucket
	state    State
	openedAt time.Time
	// half-open
	probesOut, probesOK int
	buckets             [breakerBuckets]bucket
	transitions         [NumStates]uint64 // entries into each state
}

func newBreaker(cfg BreakerConfig) *breaker {
	cfg = cfg.withDefaults()
	return &breaker{cfg: cfg, width: max(cfg.Window/breakerBuckets, time.Nanosecond)}
}

// allow says whether a call may start at now: probe reports that it is a
// half-open probe, whose outcome decides; otherwise retry is how long
// until the breaker lets a call try again.
func (b *breaker) allow(now time.Time) (ok, probe bool, retry time.Duration) {
	if b.state == Open {
		end := b.openedAt.Add(b.cfg.OpenFor)
		if now.Before(end) {
			return false, false, end.Sub(now)
		}
		b.to(HalfOpen)
		b.probesOut, b.probesOK = 0, 0
	}
	if b.state == HalfOpen {
		if b.probesOut >= b.cfg.Probes {
			return false, false, time.Second
		}
		b.probesOut++
		return true, true, 0
	}
	return true, false, 0
}

// cancel gives back a probe that never ran.
func (b *breaker) cancel(probe bool) {
	if probe && b.state == HalfOpen && b.probesOut > 0 {
		b.probesOut--
	}
}

// record counts the outcome of a call that allow admitted at its start.
func (b *breaker) record(now time.Time, probe bool, rtt time.Duration, failed bool) {
	slow := b.cfg.SlowRatio > 0 && rtt > b.cfg.SlowCall
	switch {
	case b.state == HalfOpen && probe:
		if slow || failed {
			b.open(now)
			return
		}
		b.probesOK++
		if b.probesOK >= b.cfg.Probes {
			b.to(Closed)
			b.buckets = [breakerBuckets]bucket{}
		}
	case b.state == Closed && !probe:
		bk := b.bucketAt(now)
		bk.total++
		if slow {
			bk.slow++
		}
		if failed {
			bk.failed++
		}
		if b.tripped(now) {
			b.open(now)
		}
	}
	// Outcomes of calls admitted before the state changed are dropped.
}

func (b *breaker) bucketAt(now time.Time) *bucket {
	slot := now.UnixNano() / int64(b.width)
	bk := &b.buckets[slot%breakerBuckets]
	if bk.slot != slot {
		*bk = bucket{slot: slot}
	}
	return bk
}

// counts sums the buckets of the window ending at now.
func (b *breaker) counts(now time.Time) (total, slow, failed int) {
	cur := now.UnixNano() / int64(b.width)
	for i := range b.buckets {
		bk := &b.buckets[i]
		if bk.slot > cur-breakerBuckets && bk.slot <= cur {
			total += bk.total
			slow += bk.slow
			failed += bk.failed
		}
	}
	return total, slow, failed
}

// tripped applies the strategies to the window.
func (b *breaker) tripped(now time.Time) bool {
	total, slow, failed := b.counts(now)
	c := &b.cfg
	if total < c.MinRequests || total == 0 {
		return false
	}
	return c.SlowRatio > 0 && float64(slow) >= c.SlowRatio*float64(total) ||
		c.ErrorRatio > 0 && float64(failed) >= c.ErrorRatio*float64(total) ||
		c.Errors > 0 && failed >= c.Errors
}

func (b *breaker) open(now time.Time) {
	b.to(Open)
	b.openedAt = now
}

func (b *breaker) to(s State) {
	b.state = s
	b.transitions[s]++
}
