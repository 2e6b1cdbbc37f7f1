package weir

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/algorithm"
)

// Algorithm names a rate-limiting algorithm. The zero value means GCRA.
type Algorithm string

// The seven algorithms. docs/algorithms.md explains when to pick which;
// package algorithm's table says what each takes and supports.
const (
	FixedWindow   Algorithm = algorithm.NameFixedWindow   // a counter per epoch-aligned window
	SlidingLog    Algorithm = algorithm.NameSlidingLog    // exact: one timestamp per admitted event
	SlidingWindow Algorithm = algorithm.NameSlidingWindow // two counters, the previous one weighted
	TokenBucket   Algorithm = algorithm.NameTokenBucket   // continuous refill up to Burst
	LeakyBucket   Algorithm = algorithm.NameLeakyBucket   // a bucket draining at Rate; policing or shaping
	GCRA          Algorithm = algorithm.NameGCRA          // the generic cell rate algorithm, one timestamp per key
	Concurrency   Algorithm = algorithm.NameConcurrency   // at most Rate leases held at once, each expiring after Period
)

// Algorithms lists every algorithm, in the order of algorithm.Kinds.
func Algorithms() []Algorithm {
	names := algorithm.Names()
	out := make([]Algorithm, len(names))
	for i, n := range names {
		out[i] = Algorithm(n)
	}
	return out
}

// Kind returns the algorithm package's identifier for a, treating "" as GCRA.
func (a Algorithm) Kind() (algorithm.Kind, bool) {
	if a == "" {
		return algorithm.GCRA, true
	}
	return algorithm.ParseKind(string(a))
}

// Limit describes how many events a key may have in a period, and how.
//
// For Concurrency, Rate is the number of leases that may be held at once and
// Period is how long an unreleased lease lives. For LeakyBucket, a positive
// MaxDelay switches from policing to shaping.
type Limit struct {
	Algorithm Algorithm
	Rate      int64         // events allowed per Period
	Period    time.Duration // any positive whole number of microseconds
	Burst     int64         // bucket capacity (token/leaky/gcra); 0 means Rate
	// Block is the penalty box: after a rejection the key stays rejected
	// this long; 0 = none. A limit without a box ignores any box another
	// limit left on the key (one whose Block a reload removed, say).
	Block time.Duration

	// MaxDelay makes a leaky bucket shape instead of police: an admitted
	// request may be delayed (Result.Delay) up to MaxDelay so that requests
	// leave at Rate. nginx's "burst=B" without nodelay is Burst B+1 and
	// MaxDelay B/Rate.
	MaxDelay time.Duration
	// DelayAfter is, for a shaping leaky bucket, how many requests of a burst
	// pass at once before delays begin; 0 means 1. nginx's "delay=D" is
	// DelayAfter D+1.
	DelayAfter int64

	// Buckets splits a SlidingWindow's period into this many sub-windows
	// (2 to 60), counted apart: the estimate then weighs only the oldest
	// one, so its worst excess over an exact sliding count shrinks about as
	// 1/Buckets, at the cost of one counter per bucket. 0 keeps the plain
	// two-counter window. The period must split into whole microseconds.
	Buckets int64

	// Escalate makes the penalty box grow for repeat offenders: the
	// boxes of the second, third... rejection that starts one within
	// ForgetAfter of the end of the last box, each longer than the one
	// before; the last repeats. Zeros end the list. Block is the first
	// box: block: [1m, 10m, 1h] in weir.yaml is Block 1m and Escalate
	// {10m, 1h}. Resetting the key forgets the history. (An array, not a
	// slice, so that a Limit stays comparable: stores key their caches by
	// it.)
	Escalate [algorithm.MaxBlockSteps - 1]time.Duration
	// ForgetAfter is how long after a box ends the history of an
	// escalating penalty lasts; it is needed with Escalate, and only then.
	ForgetAfter time.Duration

	// Calendar (algorithm.CalendarDay, CalendarWeek or CalendarMonth)
	// makes a FixedWindow count calendar days, weeks (from
	// Monday) or months: "10000/month" in ParseLimit's syntax. Period is
	// then the unit's nominal length (24h, 7 days, 31 days; 0 is read as
	// it), which the RateLimit-Policy header reports, while ResetAfter and
	// RetryAfter run exactly to the window's end: months have their real
	// lengths, and a day with a daylight-saving change lasts 23 or 25
	// hours.
	Calendar algorithm.CalendarUnit
	// Timezone is the IANA name of the calendar's time zone, such as
	// "Asia/Shanghai"; "" means UTC.
	Timezone string
	// ResetAt is the time of day, after local midnight, at which a
	// calendar window starts: 2*time.Hour for "02:00".
	ResetAt time.Duration

	// Warmup is a TokenBucket's or GCRA's cold start (Sentinel's): after
	// the key has been idle (its bucket full), the rate starts at a third
	// of the limit and rises to the full limit over Warmup, in 10 equal
	// steps, the bucket's capacity with it. docs/algorithms.md draws the
	// curve. At most a day, in whole steps of 10µs.
	Warmup time.Duration
}

// PerSecond returns a limit of rate events per second with algorithm a.
func PerSecond(a Algorithm, rate int64) Limit {
	return Limit{Algorithm: a, Rate: rate, Period: time.Second}
}

// PerMinute returns a limit of rate events per minute with algorithm a.
func PerMinute(a Algorithm, rate int64) Limit {
	return Limit{Algorithm: a, Rate: rate, Period: time.Minute}
}

// LimitError reports a limit that cannot be parsed or used.
type LimitError struct {
	Input  string // the limit as written, or as String renders it
	Reason string
	// Field names the setting at fault as a configuration key ("burst",
	// "block", "max_delay", "delay_after", "buckets", "rate", "period",
	// "algorithm"), or is "" when the limit's syntax is.
	Field string
	// Err is the cause: for a limit Compile rejects, the
	// *algorithm.FieldError, with the problem and the value.
	Err error
}

// Error implements error. An unknown algorithm is no fault of the limit's
// rate or period, so its message names the algorithm alone.
func (e *LimitError) Error() string {
	if e.Field == "algorithm" && strings.HasPrefix(e.Reason, unknownAlgorithmReason) {
		return "weir: " + e.Reason
	}
	return fmt.Sprintf("weir: invalid limit %q: %s", e.Input, e.Reason)
}

// unknownAlgorithmReason starts the Reason of a limit whose algorithm is
// none of weir's.
const unknownAlgorithmReason = "unknown algorithm "

// Unwrap lets errors.Is(err, ErrInvalidLimit) match, and errors.As find
// the cause.
func (e *LimitError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalidLimit}
	}
	return []error{ErrInvalidLimit, e.Err}
}

// Compile validates l and returns the constants its algorithm runs on.
// Stores call it; most users never need to.
func (l Limit) Compile() (algorithm.Params, error) {
	k, ok := l.Algorithm.Kind()
	if !ok {
		return algorithm.Params{}, &LimitError{Input: l.String(), Field: "algorithm",
			Reason: fmt.Sprintf(unknownAlgorithmReason+"%q (want one of %s)", string(l.Algorithm), strings.Join(algorithm.Names(), ", "))}
	}
	for _, d := range []struct {
		name  string
		field algorithm.Field
		v     time.Duration
	}{{"period", algorithm.FieldPeriod, l.Period}, {"block", algorithm.FieldBlock, l.Block}, {"max delay", algorithm.FieldMaxDelay, l.MaxDelay}} {
		if d.v%time.Microsecond != 0 {
			return algorithm.Params{}, &LimitError{Input: l.String(), Field: d.field.String(),
				Reason: fmt.Sprintf("%s %v is not a whole number of microseconds", d.name, d.v)}
		}
	}
	cfg, lerr := l.penaltyConfig()
	if lerr == nil {
		lerr = l.calendarConfig(&cfg)
	}
	if lerr != nil {
		return algorithm.Params{}, lerr
	}
	period := l.Period
	if period == 0 && l.Calendar != 0 {
		period = time.Duration(l.Calendar.Nominal()) * time.Microsecond
	}
	p, err := algorithm.Compile(algorithm.Config{
		Kind:        k,
		Escalate:    cfg.Escalate,
		ForgetAfter: cfg.ForgetAfter,
		Calendar:    cfg.Calendar,
		Location:    cfg.Location,
		ResetAt:     cfg.ResetAt,
		Warmup:      l.Warmup.Microseconds(),
		Rate:        l.Rate,
		Period:      period.Microseconds(),
		Burst:       l.Burst,
		Block:       l.Block.Microseconds(),
		MaxDelay:    l.MaxDelay.Microseconds(),
		DelayAfter:  l.DelayAfter,
		Buckets:     l.Buckets,
	})
	if err != nil {
		le := &LimitError{Input: l.String(), Reason: err.Error(), Err: err}
		var fe *algorithm.FieldError
		if errors.As(err, &fe) {
			le.Field = fe.Field.String()
		}
		return p, le
	}
	return p, nil
}

// penaltyConfig converts the escalating penalty's durations to µs.
func (l Limit) penaltyConfig() (algorithm.Config, *LimitError) {
	var c algorithm.Config
	for i, d := range l.Escalate {
		if d%time.Microsecond != 0 {
			return c, &LimitError{Input: l.String(), Field: algorithm.FieldBlock.String(),
				Reason: fmt.Sprintf("block %v is not a whole number of microseconds", d)}
		}
		c.Escalate[i] = d.Microseconds()
	}
	if l.ForgetAfter%time.Microsecond != 0 {
		return c, &LimitError{Input: l.String(), Field: algorithm.FieldForgetAfter.String(),
			Reason: fmt.Sprintf("forget_after %v is not a whole number of microseconds", l.ForgetAfter)}
	}
	c.ForgetAfter = l.ForgetAfter.Microseconds()
	return c, nil
}

// calendarConfig loads the calendar's time zone into c.
func (l Limit) calendarConfig(c *algorithm.Config) *LimitError {
	c.Calendar = l.Calendar
	if l.ResetAt%time.Microsecond != 0 {
		return &LimitError{Input: l.String(), Field: algorithm.FieldResetAt.String(),
			Reason: fmt.Sprintf("reset_at %v is not a whole number of microseconds", l.ResetAt)}
	}
	c.ResetAt = l.ResetAt.Microseconds()
	if l.Warmup%time.Microsecond != 0 {
		return &LimitError{Input: l.String(), Field: algorithm.FieldWarmup.String(),
			Reason: fmt.Sprintf("warmup %v is not a whole number of microseconds", l.Warmup)}
	}
	if l.Timezone == "" {
		return nil
	}
	loc, err := time.LoadLocation(l.Timezone)
	if err != nil || l.Timezone == "Local" {
		return &LimitError{Input: l.String(), Field: algorithm.FieldTimezone.String(),
			Reason: fmt.Sprintf("unknown time zone %q (want an IANA name such as UTC or Asia/Shanghai)", l.Timezone)}
	}
	c.Location = loc
	return nil
}

// Validate reports whether l can be used, with an error naming the bad value.
func (l Limit) Validate() error {
	_, err := l.Compile()
	return err
}

// String renders l in ParseLimit's syntax, such as "100/m burst 20" or
// "100/m buckets 6".
func (l Limit) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(l.Rate, 10))
	b.WriteByte('/')
	if l.Calendar != 0 {
		b.WriteString(l.Calendar.String())
	} else {
		b.WriteString(formatPeriod(l.Period))
	}
	if l.Burst != 0 {
		b.WriteString(" burst ")
		b.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	if l.Buckets != 0 {
		b.WriteString(" buckets ")
		b.WriteString(strconv.FormatInt(l.Buckets, 10))
	}
	return b.String()
}

func formatPeriod(d time.Duration) string {
	units := []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}}
	for _, u := range units {
		if d == u.d {
			return u.name
		}
		if d > 0 && d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}

// ParseLimit parses a limit written as "RATE/PERIOD [burst N] [buckets N]":
// "100/s", "100/m", "5/15m", "1000/h", "20/30s", "10/d", "1000/h burst 50",
// "100/m buckets 6" (a sliding window's sub-windows). A bare
// unit (s, m, h, d) means one of it; a period may also be any Go duration
// ("90m", "1h30m") or a number of days ("7d"). "week" and "month" are
// calendar windows ("10000/month", Limit.Calendar), which only the fixed
// window counts. The algorithm is left empty (GCRA) for the caller to set.
// Bad input gets an error quoting it.
func ParseLimit(s string) (Limit, error) {
	fail := func(reason string, args ...any) (Limit, error) {
		return Limit{}, &LimitError{Input: s, Reason: fmt.Sprintf(reason, args...)}
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return fail("empty; want RATE/PERIOD such as 100/m")
	}
	rateStr, periodStr, ok := strings.Cut(fields[0], "/")
	if !ok {
		return fail("missing '/'; want RATE/PERIOD such as 100/m")
	}
	rate, err := strconv.ParseInt(rateStr, 10, 64)
	if err != nil {
		return fail("rate %q is not a whole number", rateStr)
	}
	if rate <= 0 {
		return fail("rate must be positive, got %d", rate)
	}
	if rate >= algorithm.MaxExact {
		return fail("rate %d is too large (the maximum is 2^53−1)", rate)
	}
	var l Limit
	switch periodStr {
	case "week", "month":
		// Calendar windows: weeks from Monday, months of their real length.
		l.Calendar = algorithm.CalendarWeek
		if periodStr == "month" {
			l.Calendar = algorithm.CalendarMonth
		}
		l.Rate, l.Period = rate, time.Duration(l.Calendar.Nominal())*time.Microsecond
	default:
		period, err := parsePeriod(periodStr)
		if err != nil {
			return fail("%v", err)
		}
		l.Rate, l.Period = rate, period
	}
	rest := fields[1:]
	for len(rest) > 0 {
		if len(rest) < 2 || (rest[0] != "burst" && rest[0] != "buckets") {
			return fail("unexpected %q; only \"burst N\" and \"buckets N\" may follow the rate", strings.Join(rest, " "))
		}
		name, field := rest[0], &l.Burst
		if name == "buckets" {
			field = &l.Buckets
		}
		if *field != 0 {
			return fail("%s given twice", name)
		}
		b, err := strconv.ParseInt(rest[1], 10, 64)
		if err != nil || b <= 0 {
			return fail("%s %q is not a positive whole number", name, rest[1])
		}
		if b >= algorithm.MaxExact {
			return fail("%s %d is too large", name, b)
		}
		*field = b
		rest = rest[2:]
	}
	return l, nil
}

func parsePeriod(s string) (time.Duration, error) {
	switch s {
	case "s", "sec", "second":
		return time.Second, nil
	case "m", "min", "minute":
		return time.Minute, nil
	case "h", "hour":
		return time.Hour, nil
	case "d", "day":
		return 24 * time.Hour, nil
	case "":
		return 0, fmt.Errorf("missing period after '/'")
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("period %q: days must be a positive whole number", s)
		}
		if n > 365*100 {
			return 0, fmt.Errorf("period %q is longer than 100 years", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	if s[0] >= '0' && s[0] <= '9' && strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }) == -1 {
		return 0, fmt.Errorf("period %q has no unit (use s, m, h or d)", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("period %q is not a duration (use s, m, h, d, 30s, 15m, 7d)", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("period %q must be positive", s)
	}
	if d%time.Microsecond != 0 {
		return 0, fmt.Errorf("period %q is not a whole number of microseconds", s)
	}
	return d, nil
}
