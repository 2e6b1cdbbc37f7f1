// Package algorithm holds the state transitions of weir's seven rate-limiting
// algorithms as pure functions over integer microseconds.
//
// Every store runs the same math: memstore calls [Take] directly, and the
// Redis store's Lua scripts mirror it line for line. Both must agree to the
// microsecond, so nothing here uses floating point.
//
// # Exact arithmetic
//
// Time is an int64 count of microseconds since the Unix epoch. The bucket
// algorithms (token bucket, leaky bucket, GCRA) need the emission interval
// Period/Rate, which is rarely a whole number of microseconds (1s/3 is
// 333333.3µs) and below one microsecond at rates over a million per second.
// Rounding it would either drift or stop limiting. Instead [Compile] reduces
// the fraction: with g = gcd(Period, Rate), one request is worth A = Period/g
// units and the bucket drains B = Rate/g units per microsecond. Every quantity
// is then an exact integer. The sliding window weights its previous window in
// ticks of Tick microseconds, chosen so that Rate × Period/Tick stays exact.
//
// Lua numbers are IEEE doubles, exact up to 2^53, so Compile rejects limits
// whose state would need larger integers; the error says which value to change.
package algorithm

import (
	"errors"
	"fmt"
)

// MaxExact is the largest integer every store can represent exactly (2^53,
// the limit of a Lua number).
const MaxExact = 1 << 53

// MaxPeriod is the longest period, block or delay, in µs: ten years.
const MaxPeriod = 10 * 366 * 24 * 3600 * 1_000_000

// MaxLogSize caps the rate of a sliding log, whose memory is one entry per
// admitted request.
const MaxLogSize = 1_000_000

// Kind names an algorithm.
type Kind uint8

// The seven algorithms.
const (
	FixedWindow Kind = iota + 1
	SlidingLog
	SlidingWindow
	TokenBucket
	LeakyBucket
	GCRA
	Concurrency
)

var kindNames = [...]string{"", "fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra", "concurrency"}

// String returns the algorithm's configuration name, such as "token_bucket".
func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(k))
}

// ParseKind returns the Kind named s, such as "gcra".
func ParseKind(s string) (Kind, bool) {
	for i := 1; i < len(kindNames); i++ {
		if kindNames[i] == s {
			return Kind(i), true
		}
	}
	return 0, false
}

// Kinds lists every algorithm in a stable order.
func Kinds() []Kind {
	return []Kind{FixedWindow, SlidingLog, SlidingWindow, TokenBucket, LeakyBucket, GCRA, Concurrency}
}

// Config is a limit as the algorithms see it, with durations in microseconds.
type Config struct {
	Kind       Kind
	Rate       int64 // events per Period; for Concurrency, the number of slots
	Period     int64 // µs; for Concurrency, the lease TTL
	Burst      int64 // bucket capacity in events; 0 means Rate
	Block      int64 // µs of penalty box after a rejection; 0 = none
	MaxDelay   int64 // leaky bucket: µs of shaping delay allowed; 0 = policing
	DelayAfter int64 // leaky bucket shaping: events admitted at once before delays begin; 0 means 1
}

// Params is a compiled Config: validated, with the derived constants the
// transitions need. Build it with Compile.
type Params struct {
	Config
	// Cap is the reported limit: Rate for windows and concurrency, Burst for buckets.
	Cap int64
	// A and B: one event is A units; a bucket drains (or refills) B units per µs.
	A, B int64
	// Tick is the sliding window's time unit in µs.
	Tick int64
	// MaxWait bounds, in µs, how far past the last change of a key's state
	// its RetryAfter or ResetAfter can reach: one period for the windows,
	// the log and leases, two for the sliding window, a full refill for the
	// buckets.
	MaxWait int64
}

// BoxOutlasts reports whether p's penalty box outlasts anything the key's
// state could still need. Nothing is consumed while a box holds, so the
// state is frozen at the rejection that started it, and its every instant
// lies within MaxWait of that: the box's end decides RetryAfter and
// ResetAfter, and a blocked check need not look at the state at all (in
// Redis: one GET of the box key).
func (p *Params) BoxOutlasts() bool { return p.Block > 0 && p.Block >= p.MaxWait }

// Compile validates c and derives the constants its algorithm needs.
func Compile(c Config) (Params, error) {
	p := Params{Config: c}
	if _, ok := ParseKind(c.Kind.String()); !ok {
		return p, fmt.Errorf("unknown algorithm %d", c.Kind)
	}
	if c.Rate <= 0 {
		return p, fmt.Errorf("rate must be positive, got %d", c.Rate)
	}
	if c.Period <= 0 {
		return p, fmt.Errorf("period must be at least 1µs, got %dµs", c.Period)
	}
	if c.Burst < 0 {
		return p, fmt.Errorf("burst must not be negative, got %d", c.Burst)
	}
	if c.Block < 0 {
		return p, fmt.Errorf("block must not be negative, got %dµs", c.Block)
	}
	if c.MaxDelay < 0 || c.DelayAfter < 0 {
		return p, fmt.Errorf("max delay and delay-after must not be negative, got %dµs and %d", c.MaxDelay, c.DelayAfter)
	}
	if c.Rate >= MaxExact {
		return p, errors.New("rate must be below 2^53")
	}
	// Window arithmetic adds a few periods to the epoch time; ten years
	// keeps every sum exact in a Lua number.
	if c.Period > MaxPeriod || c.Block > MaxPeriod || c.MaxDelay > MaxPeriod {
		return p, fmt.Errorf("period, block and max delay must be at most 10 years, got %dµs, %dµs and %dµs", c.Period, c.Block, c.MaxDelay)
	}
	bucket := c.Kind == TokenBucket || c.Kind == LeakyBucket || c.Kind == GCRA
	if c.Burst != 0 && !bucket {
		return p, fmt.Errorf("burst applies to token_bucket, leaky_bucket and gcra, not %s", c.Kind)
	}
	if (c.MaxDelay != 0 || c.DelayAfter != 0) && c.Kind != LeakyBucket {
		return p, fmt.Errorf("max delay and delay-after apply to leaky_bucket, not %s", c.Kind)
	}
	p.Cap = c.Rate
	p.MaxWait = c.Period
	switch c.Kind {
	case SlidingLog:
		if c.Rate > MaxLogSize {
			return p, fmt.Errorf("sliding_log keeps one entry per event; rate %d is over its maximum %d (use sliding_window)", c.Rate, MaxLogSize)
		}
	case SlidingWindow:
		// The smallest power-of-ten tick that divides the period and keeps
		// Rate × Period/Tick exact.
		for t := int64(1); t <= 1_000_000; t *= 10 {
			if c.Period%t == 0 && c.Rate <= (MaxExact-1)/(c.Period/t) {
				p.Tick = t
				break
			}
		}
		if p.Tick == 0 {
			return p, fmt.Errorf("sliding_window: rate %d over a %dµs period is too large to weigh exactly (lower the rate or use a whole-second period)", c.Rate, c.Period)
		}
		p.MaxWait = 2 * c.Period // the current window's count weighs into the next
	case TokenBucket, LeakyBucket, GCRA:
		if p.Burst == 0 {
			p.Burst = c.Rate
		}
		p.Cap = p.Burst
		g := gcd(c.Period, c.Rate)
		p.A, p.B = c.Period/g, c.Rate/g
		if p.Burst > (MaxExact-1)/p.A {
			return p, fmt.Errorf("%s: burst %d × interval %d/%dµs is too large to track exactly (lower the burst, or pick a rate that divides the period)", c.Kind, p.Burst, p.A, p.B)
		}
		p.MaxWait = ceilDiv(p.Burst*p.A, p.B) // a full refill, or drain
		if c.Kind == LeakyBucket && c.MaxDelay > 0 {
			if p.DelayAfter == 0 {
				p.DelayAfter = 1
			}
			if p.DelayAfter > p.Burst {
				return p, fmt.Errorf("leaky_bucket: delay-after %d exceeds the burst %d", p.DelayAfter, p.Burst)
			}
			// A delay longer than draining a full bucket can never happen.
			if full := ceilDiv(p.Burst*p.A, p.B); p.MaxDelay > full {
				p.MaxDelay = full
			}
		} else if c.Kind == LeakyBucket && c.DelayAfter != 0 {
			return p, errors.New("leaky_bucket: delay-after needs a max delay (shaping)")
		}
	}
	return p, nil
}

// Shaping reports whether p is a leaky bucket that delays instead of rejecting.
func (p *Params) Shaping() bool { return p.Kind == LeakyBucket && p.MaxDelay > 0 }

// MaxCost returns the largest cost a single request can ever be granted.
func (p *Params) MaxCost() int64 {
	if p.Shaping() {
		// delay = (level + n·A − DelayAfter·A)/B must fit MaxDelay on an empty bucket.
		m := (p.MaxDelay*p.B)/p.A + p.DelayAfter
		if m < p.Cap {
			return m
		}
	}
	return p.Cap
}

// Mode says how much of a request a store may grant.
type Mode uint8

const (
	// Exact admits all n or nothing.
	Exact Mode = iota
	// AtMost admits as much of n as is available now, at least 1.
	AtMost
)

// Decision is the outcome of one Take, in microseconds.
type Decision struct {
	Allowed      bool
	Granted      int64 // events admitted: n, up to n with AtMost, 0 when rejected or peeking
	Limit        int64
	Remaining    int64
	RetryAfter   int64 // µs until the same request would be admitted; 0 if allowed
	ResetAfter   int64 // µs until the state is back to empty
	Delay        int64 // µs a shaping leaky bucket asks the caller to wait
	BlockedUntil int64 // µs epoch while a penalty box holds the key; 0 if none
	TTL          int64 // µs for which the stored state still matters; 0 means it can be dropped
	Changed      bool  // the state was modified and must be saved
}

// Lease is one concurrency slot holder.
type Lease struct {
	ID     string
	Expiry int64 // µs epoch
	Weight int64
}

// State is the per-key state of any algorithm. Which fields are used depends
// on the Kind; the zero State is an empty key.
type State struct {
	Window int64 // fixed/sliding window: index of the current window
	Count  int64 // fixed/sliding window: events in the current window
	Prev   int64 // sliding window: events in the previous window
	Level  int64 // token bucket: tokens; leaky bucket: level (both in units of 1/A event)
	TS     int64 // token/leaky bucket: µs of the last update; 0 = never
	TAT    int64 // gcra: theoretical arrival time, whole µs
	Frac   int64 // gcra: TAT's fraction, in units of 1/B µs
	Log    Log   // sliding log: admitted timestamps
	Leases []Lease
	// BlockedUntil is the end of the penalty box, µs epoch; 0 = none.
	BlockedUntil int64
}

// Log is a ring buffer of ascending timestamps.
type Log struct {
	buf        []int64
	head, size int
}

// Len returns the number of timestamps held.
func (l *Log) Len() int { return l.size }

// At returns the i-th oldest timestamp.
func (l *Log) At(i int) int64 { return l.buf[(l.head+i)%len(l.buf)] }

func (l *Log) popFront() { l.head = (l.head + 1) % len(l.buf); l.size-- }

func (l *Log) push(t int64, capacity int) {
	// Grow by doubling up to capacity, so that a key pays for the entries it
	// holds, not for its limit; shrink when the limit was lowered.
	if grow := l.size == len(l.buf) && len(l.buf) < capacity; grow || len(l.buf) > capacity {
		nc := capacity
		if grow {
			nc = min(max(2*len(l.buf), 4), capacity)
		}
		nb := make([]int64, nc)
		keep := min(l.size, nc)
		for i := 0; i < keep; i++ {
			nb[i] = l.At(l.size - keep + i)
		}
		l.buf, l.head, l.size = nb, 0, keep
	}
	if l.size == len(l.buf) {
		l.popFront()
	}
	l.buf[(l.head+l.size)%len(l.buf)] = t
	l.size++
}

// Take decides a request of cost n at time now (µs) against s, updating s
// when the request is admitted or a penalty box starts. n == 0 peeks: it
// reports whether a request of cost 1 would be admitted and changes nothing.
// The caller must have checked 0 <= n <= p.MaxCost().
func Take(p *Params, s *State, now, n int64, mode Mode) Decision {
	return take(p, s, now, n, mode, true)
}

// Check decides like Take but consumes nothing and starts no penalty box.
// Stores use it for the first phase of an all-or-nothing batch. Granted and
// Remaining describe the state as it is, before any consumption.
func Check(p *Params, s *State, now, n int64, mode Mode) Decision {
	return take(p, s, now, n, mode, false)
}

func take(p *Params, s *State, now, n int64, mode Mode, commit bool) Decision {
	peek := n == 0
	cost := n
	if peek {
		cost = 1
		mode = Exact
	}
	if s.BlockedUntil != 0 && s.BlockedUntil <= now {
		s.BlockedUntil = 0 // the penalty box has lapsed
	}
	if s.BlockedUntil > now && p.Block > 0 {
		// Only a limit with a penalty box honours one: a box another limit
		// left on the key (say before a reload removed block) does not
		// bind a limit without one, and a store need not read it.
		left := s.BlockedUntil - now
		if p.BoxOutlasts() {
			// The box's end is later than anything the frozen state needs.
			return Decision{Limit: p.Cap, RetryAfter: left, ResetAfter: left, BlockedUntil: s.BlockedUntil, TTL: left}
		}
		d := decide(p, s, now, cost, mode, false)
		d.Allowed, d.Granted, d.Remaining, d.Delay = false, 0, 0, 0
		d.RetryAfter = max(d.RetryAfter, left)
		d.ResetAfter = max(d.ResetAfter, left) // nothing is usable before the box opens
		d.BlockedUntil = s.BlockedUntil
		d.TTL = d.ResetAfter
		return d
	}
	commit = commit && !peek
	d := decide(p, s, now, cost, mode, commit)
	if peek {
		d.Granted = 0
		d.Delay = 0
	}
	if !d.Allowed && commit && p.Block > 0 {
		s.BlockedUntil = now + p.Block
		d.BlockedUntil = s.BlockedUntil
		d.RetryAfter = max(d.RetryAfter, p.Block)
		d.Remaining = 0
		d.Changed = true
	}
	d.TTL = d.ResetAfter
	if s.BlockedUntil > now {
		d.TTL = max(d.TTL, s.BlockedUntil-now)
	}
	return d
}

// grant applies the mode: how much of cost to admit given avail.
func grant(cost, avail int64, mode Mode) int64 {
	if avail >= cost {
		return cost
	}
	if mode == AtMost && avail > 0 {
		return avail
	}
	return 0
}

func decide(p *Params, s *State, now, cost int64, mode Mode, apply bool) Decision {
	d := Decision{Limit: p.Cap}
	switch p.Kind {
	case FixedWindow:
		w := now / p.Period
		count := s.Count
		if s.Window != w {
			count = 0
		}
		count = min(count, p.Rate)
		g := grant(cost, p.Rate-count, mode)
		end := (w+1)*p.Period - now
		if g == 0 {
			d.RetryAfter = end
		} else if apply {
			count += g
			s.Window, s.Count = w, count
			d.Changed = true
		}
		d.Granted, d.Remaining = g, p.Rate-count
		if count > 0 {
			d.ResetAfter = end
		}

	case SlidingLog:
		for s.Log.size > 0 && s.Log.At(0)+p.Period <= now {
			s.Log.popFront()
		}
		count := min(int64(s.Log.size), p.Rate)
		g := grant(cost, p.Rate-count, mode)
		if g == 0 {
			// The (count+cost−Rate)-th oldest entry must leave the window.
			k := count + cost - p.Rate
			d.RetryAfter = s.Log.At(int(int64(s.Log.size)-count+k-1)) + p.Period - now
		} else if apply {
			for i := int64(0); i < g; i++ {
				s.Log.push(now, int(p.Rate))
			}
			count += g
			d.Changed = true
		}
		d.Granted, d.Remaining = g, p.Rate-count
		if s.Log.size > 0 {
			d.ResetAfter = s.Log.At(s.Log.size-1) + p.Period - now
		}

	case SlidingWindow:
		// estimate = ceil(prev × (P−e)/P) + cur, in ticks.
		pt := p.Period / p.Tick
		nt := now / p.Tick
		w := nt / pt
		e := nt - w*pt
		var cur, prev int64
		switch s.Window {
		case w:
			cur, prev = s.Count, s.Prev
		case w - 1:
			prev = s.Count
		}
		cur, prev = min(cur, p.Rate), min(prev, p.Rate)
		weighted := ceilDiv(prev*(pt-e), pt)
		est := weighted + cur
		g := grant(cost, max(p.Rate-est, 0), mode)
		if g == 0 {
			var at int64 // the instant, in ticks, when the request fits
			if k := p.Rate - cur - cost; k >= 0 {
				// Same window: ceil(prev(P−e')/P) ≤ k ⇔ e' ≥ P − floor(kP/prev).
				at = w*pt + pt - (k*pt)/prev
			} else {
				// Next window, where the current count becomes prev.
				need := int64(0)
				if cur > 0 {
					need = max(pt-((p.Rate-cost)*pt)/cur, 0)
				}
				at = (w+1)*pt + need
			}
			d.RetryAfter = at*p.Tick - now
		} else if apply {
			cur += g
			est += g
			s.Window, s.Count, s.Prev = w, cur, prev
			d.Changed = true
		}
		d.Granted, d.Remaining = g, max(p.Rate-est, 0)
		switch {
		case cur > 0:
			d.ResetAfter = (w+2)*pt*p.Tick - now
		case prev > 0:
			d.ResetAfter = (w+1)*pt*p.Tick - now
		}

	case TokenBucket:
		c := p.Burst * p.A
		tokens := c
		if s.TS != 0 {
			tokens = min(s.Level, c)
			if el := now - s.TS; el > 0 {
				if el >= ceilDiv(c-tokens, p.B) {
					tokens = c
				} else {
					tokens += el * p.B
				}
			}
		}
		g := grant(cost, tokens/p.A, mode)
		if g == 0 {
			d.RetryAfter = ceilDiv(cost*p.A-tokens, p.B)
		} else if apply {
			tokens -= g * p.A
			s.Level, s.TS = tokens, now
			d.Changed = true
		}
		d.Granted, d.Remaining = g, tokens/p.A
		d.ResetAfter = ceilDiv(c-tokens, p.B)

	case GCRA:
		// diff = TAT − now in units of 1/B µs; a full burst is Burst·A.
		c := p.Burst * p.A
		var diff int64
		if s.TAT != 0 {
			switch ahead := s.TAT - now; {
			case ahead > c/p.B:
				diff = c
			case ahead >= 0:
				diff = ahead*p.B + s.Frac
			} // a TAT in the past leaves diff 0 (Frac < B), and never multiplies a long idle time
		}
		g := grant(cost, max(c-diff, 0)/p.A, mode)
		if g == 0 {
			d.RetryAfter = ceilDiv(diff+cost*p.A-c, p.B)
		} else if apply {
			diff += g * p.A
			s.TAT, s.Frac = now+diff/p.B, diff%p.B
			d.Changed = true
		}
		d.Granted, d.Remaining = g, max(c-diff, 0)/p.A
		d.ResetAfter = ceilDiv(diff, p.B)

	case LeakyBucket:
		c := p.Burst * p.A
		var level int64
		if s.TS != 0 {
			level = min(s.Level, c)
			if el := now - s.TS; el > 0 {
				if el >= ceilDiv(level, p.B) {
					level = 0
				} else {
					level -= el * p.B
				}
			}
		}
		// room is the level a request may find and still be admitted, plus its own cost.
		room := c
		if p.Shaping() {
			room = min(room, p.MaxDelay*p.B+p.DelayAfter*p.A)
		}
		g := grant(cost, max(room-level, 0)/p.A, mode)
		if g == 0 {
			d.RetryAfter = ceilDiv(level-(room-cost*p.A), p.B)
		} else if apply {
			level += g * p.A
			s.Level, s.TS = level, now
			d.Changed = true
		}
		if g > 0 && p.Shaping() {
			after := level
			if !apply {
				after += g * p.A
			}
			d.Delay = max(ceilDiv(after-p.DelayAfter*p.A, p.B), 0)
		}
		d.Granted, d.Remaining = g, max(room-level, 0)/p.A
		d.ResetAfter = ceilDiv(level, p.B)

	case Concurrency:
		i := 0
		for i < len(s.Leases) && s.Leases[i].Expiry <= now {
			i++
		}
		if i > 0 {
			s.Leases = append(s.Leases[:0], s.Leases[i:]...)
		}
		var held int64
		for _, l := range s.Leases {
			held += l.Weight
		}
		held = min(held, p.Rate)
		g := grant(cost, p.Rate-held, mode)
		if g == 0 {
			// Wait for the earliest leases to expire until cost fits.
			need := held + cost - p.Rate
			for _, l := range s.Leases {
				need -= l.Weight
				if need <= 0 {
					d.RetryAfter = l.Expiry - now
					break
				}
			}
		} else if apply {
			held += g
			s.Leases = append(s.Leases, Lease{Expiry: now + p.Period, Weight: g})
			d.Changed = true
		}
		d.Granted, d.Remaining = g, p.Rate-held
		if n := len(s.Leases); n > 0 {
			d.ResetAfter = s.Leases[n-1].Expiry - now
		}
	}
	d.Allowed = d.Granted > 0
	return d
}

// Release removes the concurrency lease with the given id from s, reporting
// whether it was held.
func Release(s *State, id string) bool {
	if id == "" {
		return false
	}
	for i, l := range s.Leases {
		if l.ID == id {
			s.Leases = append(s.Leases[:i], s.Leases[i+1:]...)
			return true
		}
	}
	return false
}

// SetLeaseID names the lease that the last admitted Take added to s, so that
// Release can find it. It must be called right after that Take.
func SetLeaseID(s *State, id string) {
	if n := len(s.Leases); n > 0 {
		s.Leases[n-1].ID = id
	}
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
