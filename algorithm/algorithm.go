// Package algorithm holds the state transitions of weir's seven rate-limiting
// algorithms as pure functions over integer microseconds.
//
// One table (table.go) says what each algorithm is: its name, the settings
// it takes beyond rate and period, what it supports, how Compile validates
// it, and its functions. Every other list of algorithms in weir derives
// from it.
//
// # The Go and the Lua mirror each other
//
// Every store runs the same math: memstore calls [Take] directly, and the
// Redis store runs Lua (store/redisstore/scripts) that mirrors this package
// function for function, with the same step order and names, so that both
// agree to the microsecond:
//
//	Go (package algorithm)                 Lua (store/redisstore/scripts)
//	take (Take, Check)                     prelude.lua take
//	decide (the table's decide, Allowed)   prelude.lua decide
//	grant, ceilDiv, decision               prelude.lua grant, ceil_div, decision
//	fixed_window.go fixedWindow            fixed_window.lua ALG.fixed_window.decide
//	sliding_log.go slidingLog              sliding_log.lua ALG.sliding_log.decide
//	sliding_window.go slidingWindow        sliding_window.lua ALG.sliding_window.decide
//	  slidingBuckets, swCount                sw_buckets, sw_count
//	token_bucket.go tokenBucket, tbTokens  token_bucket.lua decide, tb_tokens
//	leaky_bucket.go leakyBucket, lbLevel   leaky_bucket.lua decide, lb_level
//	gcra.go gcra, gcraDiff                 gcra.lua decide, gcra_diff
//	concurrency.go concurrency             concurrency.lua ALG.concurrency.decide
//	Refund, <algorithm>Refund              multi.lua's refund, ALG.<algorithm>.refund
//	SettleTake: settleRefund, settleRoom   prelude.lua settle, settle_room
//	  Log.removeAt                           ALG.sliding_log.settle
//
// What differs, and why:
//
//   - State. Go holds a key's State in memory; each Lua file adds load and
//     save, which read and write its Redis key (prelude.lua's save deletes
//     an empty one and sets the TTL). The sliding log's expiry and the
//     concurrency leases' expiry are the first steps of the Go functions
//     and of the Lua loads.
//   - The sliding log and concurrency keep their entries in a ZSET, read by
//     rank and score (a binary search of ZRANGE calls for Log.eventTS, a
//     scan from whichever end is shorter for a concurrency RetryAfter)
//     instead of slices; the results are the same.
//   - Refunds find what a take added by its call id in Lua (a log member,
//     a lease); Go merges the calls of one microsecond into one log entry
//     and finds an anonymous lease by its expiry (see slidingLogRefund and
//     concurrencyRefund). memstore decides a batch under one lock and never
//     refunds; the Redis store refunds the takes of a cross-slot batch that
//     failed as a whole.
//   - Arithmetic. Lua numbers are doubles: where a Go product could only
//     overflow int64 past 2^53, the Lua orders the same sum so that it never
//     passes 2^53 (gcra's RetryAfter), and the prelude's idiv, imod and
//     ceil_div are Go's / and % and ceilDiv (see its proof).
//   - life (the TTL of a state a lowered burst left over) is Go's alone:
//     Redis keeps a key for the TTL it was written with.
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
// is then an exact integer. The sliding window weights its previous window
// (or, with Buckets, its oldest sub-window) in ticks of Tick microseconds,
// chosen so that Rate × Period/Tick stays exact and the sub-windows are
// whole ticks.
//
// Lua numbers are IEEE doubles, exact up to 2^53, so Compile rejects limits
// whose state would need larger integers; the error says which value to change.
package algorithm

import "time"

// MaxExact is the largest integer every store can represent exactly (2^53,
// the limit of a Lua number).
const MaxExact = 1 << 53

// MaxPeriod is the longest period, block or delay, in µs: ten years.
const MaxPeriod = 10 * 366 * 24 * 3600 * 1_000_000

// MinBuckets and MaxBuckets bound a bucketed sliding window's sub-windows.
const (
	MinBuckets = 2
	MaxBuckets = 60
)

// maxLogSize caps the rate of a sliding log, whose memory is one entry per
// admitted request.
const maxLogSize = 1_000_000

// Config is a limit as the algorithms see it, with durations in microseconds.
type Config struct {
	Kind       Kind
	Rate       int64 // events per Period; for Concurrency, the number of slots
	Period     int64 // µs; for Concurrency, the lease TTL
	Burst      int64 // bucket capacity in events; 0 means Rate
	Block      int64 // µs of penalty box after a rejection; 0 = none
	MaxDelay   int64 // leaky bucket: µs of shaping delay allowed; 0 = policing
	DelayAfter int64 // leaky bucket shaping: events admitted at once before delays begin; 0 means 1
	Buckets    int64 // sliding window: sub-windows counted apart, MinBuckets..MaxBuckets; 0 = two windows

	// Escalate lists, in µs, the penalty boxes of the second, third...
	// rejection that starts a box within ForgetAfter of the last box's
	// end; the last one repeats. Zeros end the list (penalty.go).
	Escalate [MaxBlockSteps - 1]int64
	// ForgetAfter is how long after a box ends the penalty history lasts,
	// µs; it needs Escalate.
	ForgetAfter int64

	// Calendar makes a fixed window's windows calendar days, weeks or
	// months in Location (nil: UTC), starting ResetAt µs after local
	// midnight (calendar.go). Period is then the unit's nominal length.
	Calendar CalendarUnit
	Location *time.Location
	ResetAt  int64

	// Warmup is a token bucket's or GCRA's cold start, µs: after a key has
	// been idle its rate starts at a third and rises to the full rate over
	// Warmup (warmup.go); 0 = none.
	Warmup int64
}

// Params is a compiled Config: validated, with the derived constants the
// transitions need. Build it with Compile.
type Params struct {
	Config
	// Cap is the reported limit: Rate for windows and concurrency, Burst for buckets.
	Cap int64
	// A and B: one event is A units; a bucket drains (or refills) B units per µs.
	A, B int64
	// Tick is the sliding window's time unit in µs. It divides a bucket.
	Tick int64
	// MaxWait bounds, in µs, how far past the last change of a key's state
	// its RetryAfter or ResetAfter can reach: one period for the windows,
	// the log and leases, two for the sliding window (one and a bucket with
	// Buckets), a full refill for the buckets.
	MaxWait int64
}

// BoxOutlasts reports whether p's penalty box outlasts anything the key's
// state could still need. Nothing is consumed while a box holds, so the
// state is frozen at the rejection that started it, and its every instant
// lies within MaxWait of that: the box's end decides RetryAfter and
// ResetAfter, and a blocked check need not look at the state at all (in
// Redis: one GET of the box key).
func (p *Params) BoxOutlasts() bool { return p.Block > 0 && p.Block >= p.MaxWait }

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

// Outcome is the result of one step of an algorithm (Take, Check, TakeTo),
// in microseconds: what the store turns into a weir.Result.
type Outcome struct {
	Allowed      bool
	Granted      int64 // events admitted: n, up to n with AtMost, 0 when rejected or peeking
	Limit        int64
	Remaining    int64
	RetryAfter   int64 // µs until the same request would be admitted; 0 if allowed
	ResetAfter   int64 // µs until the state is back to empty
	Delay        int64 // µs a shaping leaky bucket asks the caller to wait
	BlockedUntil int64 // µs epoch while a penalty box holds the key; 0 if none
	TTL          int64 // µs for which the stored state still matters; 0 means it can be dropped
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
	Window int64   // fixed/sliding window: index of the current window
	Count  int64   // fixed/sliding window: events in the current window
	Prev   int64   // sliding window: events in the previous window
	Level  int64   // token bucket: tokens; leaky bucket: level (both in units of 1/A event); a window in debt: its debt rate (see carryRate)
	TS     int64   // token/leaky bucket: µs of the last update; 0 = never
	TAT    int64   // gcra: theoretical arrival time, whole µs
	Frac   int64   // gcra: TAT's fraction, in units of 1/B µs
	Log    Log     // sliding log: admitted events; a bucketed sliding window's counts (see bucketCounts)
	Leases []Lease // concurrency: live leases, in the order they were taken
	Held   int64   // concurrency: the sum of the Leases' weights
	// BlockedUntil is the end of the penalty box, µs epoch; 0 = none.
	BlockedUntil int64
	// Strikes counts the boxes of an escalating penalty's history, and
	// LastBox is the end of the last one (kept after it lapses, so that
	// the history is forgotten ForgetAfter later); see penalty.go.
	Strikes, LastBox int64
	// WarmStart is when a warm-up began (warmup.go), µs epoch.
	WarmStart int64
	// Debt: a debit left the state over its capacity (gcra, leaky bucket,
	// the windows), so the excess counts in full instead of being capped
	// as a lowered limit's is (see debt.go).
	Debt bool
}

// Take decides a request of cost n at time now (µs) against s, updating s
// when the request is admitted or a penalty box starts. n == 0 peeks: it
// reports whether a request of cost 1 would be admitted and changes nothing.
// The caller must have checked 0 <= n <= p.MaxCost().
//
// With mode Debit or Credit it is debitTake or creditTake (n up to MaxDebt).
func Take(p *Params, s *State, now, n int64, mode Mode) Outcome {
	if mode >= Debit {
		return debtOp(p, s, now, n, mode)
	}
	return take(p, s, now, n, mode, true)
}

// Check decides like Take but consumes nothing and starts no penalty box.
// Stores use it for the first phase of an all-or-nothing batch. Granted and
// Remaining describe the state as it is, before any consumption.
func Check(p *Params, s *State, now, n int64, mode Mode) Outcome {
	return take(p, s, now, n, mode, false)
}

func take(p *Params, s *State, now, n int64, mode Mode, commit bool) Outcome {
	var d Outcome
	takeTo(p, s, now, n, mode, commit, &d)
	return d
}

// TakeTo is Take writing its Outcome to *d (every field of it) instead of
// returning it. An Outcome is too large to come back in registers: each
// frame a returned one passes through copies it, and right after its
// fields were written one by one such a copy stalls the CPU (a 16-byte
// load over two 8-byte stores is not forwarded). memstore, whose
// single-key decision this dominated, decides into an Outcome of its own.
func TakeTo(p *Params, s *State, now, n int64, mode Mode, d *Outcome) {
	if mode >= Debit {
		*d = debtOp(p, s, now, n, mode)
		return
	}
	takeTo(p, s, now, n, mode, true, d)
}

func takeTo(p *Params, s *State, now, n int64, mode Mode, commit bool, d *Outcome) {
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
			*d = Outcome{Limit: p.Cap, RetryAfter: left, ResetAfter: left, BlockedUntil: s.BlockedUntil, TTL: max(left, life(p, s, now), historyLife(p, s, now))}
			return
		}
		*d = decide(p, s, now, cost, mode, false)
		d.Allowed, d.Granted, d.Remaining, d.Delay = false, 0, 0, 0
		d.RetryAfter = max(d.RetryAfter, left)
		d.ResetAfter = max(d.ResetAfter, left) // nothing is usable before the box opens
		d.BlockedUntil = s.BlockedUntil
		d.TTL = max(d.ResetAfter, life(p, s, now), historyLife(p, s, now))
		return
	}
	commit = commit && !peek
	// decide, written out: the table's function returns its five
	// integers in registers, written to *d one by one.
	sp := &specs[p.Kind]
	f := sp.decide
	if p.Warmup > 0 {
		f = warmBucket
	}
	d.Limit, d.BlockedUntil = p.Cap, 0
	d.Granted, d.Remaining, d.RetryAfter, d.ResetAfter, d.Delay = f(p, s, now, cost, mode, commit)
	d.Allowed = d.Granted > 0
	if peek {
		d.Granted = 0
		d.Delay = 0
	}
	if !d.Allowed && commit && p.Block > 0 {
		box := startBox(p, s, now)
		d.BlockedUntil = s.BlockedUntil
		d.RetryAfter = max(d.RetryAfter, box)
		d.Remaining = 0
	}
	d.TTL = d.ResetAfter
	if sp.life != nil {
		d.TTL = max(d.TTL, sp.life(p, s, now))
	}
	if s.BlockedUntil > now {
		d.TTL = max(d.TTL, s.BlockedUntil-now)
	}
	d.TTL = max(d.TTL, historyLife(p, s, now))
}

// life returns how much longer s's stored state lasts at now, in µs, for
// the buckets whose reading is capped at the burst (leaky bucket, GCRA).
// After a lowered burst the stored level can exceed the new burst: it reads
// as a full bucket, and ResetAfter counts from that, but the state matters
// until the stored level has drained, so a store keeps it that long (as
// Redis keeps the key for the TTL it was written with).
func life(p *Params, s *State, now int64) int64 {
	if f := specs[p.Kind].life; f != nil {
		return f(p, s, now)
	}
	return 0
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

// decide runs p's algorithm from the table: it decides a request of cost
// at now against s, and when apply, consumes what it grants.
func decide(p *Params, s *State, now, cost int64, mode Mode, apply bool) Outcome {
	f := specs[p.Kind].decide
	if p.Warmup > 0 {
		f = warmBucket
	}
	return decision(p, f, s, now, cost, mode, apply)
}

// decision returns what the table's function f decides as an Outcome.
func decision(p *Params, f decideFunc, s *State, now, cost int64, mode Mode, apply bool) Outcome {
	d := Outcome{Limit: p.Cap}
	d.Granted, d.Remaining, d.RetryAfter, d.ResetAfter, d.Delay = f(p, s, now, cost, mode, apply)
	d.Allowed = d.Granted > 0
	return d
}

// refundTake gives back g events that an admitted Take at takeNow granted
// (with lease id id, for a concurrency lease or a sliding log call; "" for
// none), as the Redis store does for the takes of a cross-slot batch that
// failed as a whole, and reports whether s changed. It is exact when
// nothing else changed the key in between: s then decides as if the take
// had never happened. A refund of a take whose state has since expired or
// moved on does nothing.
func refundTake(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if g <= 0 {
		return false
	}
	if p.Warmup > 0 {
		return warmRefund(p, s, takeNow, now, g, id)
	}
	return specs[p.Kind].refund(p, s, takeNow, now, g, id)
}

// Release removes the concurrency lease with the given id from s, reporting
// whether it was held.
func Release(s *State, id string) bool {
	if id == "" {
		return false
	}
	for i, l := range s.Leases {
		if l.ID == id {
			s.Held -= l.Weight
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
