package algorithm

// Debt: costs known only after the work is done (LLM tokens, bytes, rows).
// Debit always consumes, even past the limit: the key goes into debt, which
// it pays back at the limit's own rate before anything fits again. Credit
// gives back what was consumed, never beyond an empty state. Both mirror
// prelude.lua's debit and credit, and each algorithm that supports them has
// a <algorithm>Debit and <algorithm>Credit (ALG.<algorithm>.debit, credit).
//
// What debt means per algorithm (docs/algorithms.md, "Debt"):
//
//   - token_bucket: the tokens go negative and refill at the rate.
//   - gcra: TAT moves past the burst; it catches up at the rate.
//   - leaky_bucket (policing): the level rises past the burst and drains.
//   - fixed_window: the count passes the rate; what is over the rate in one
//     window carries into the next, Rate per window.
//   - sliding_window: the current count passes the rate and carries into
//     the next windows the same way, weighted as usual. With buckets, the
//     newest bucket passes the rate and counts in full until it leaves the
//     trailing period; the ring holds at most 2·Rate events.
//   - sliding_log: an entry of weight n; the debt lasts until its events
//     leave the trailing period. The log holds at most 2·Rate events.
//
// A bucket or window whose stored state is over its capacity because of a
// debit says so (State.Debt), so that its excess counts in full instead of
// being capped, as a state left over by a lowered limit is.

// A window's debt (fixed_window, sliding_window without buckets) is paid
// back at the rate of the limit it was written under, which the state
// keeps (State.Level, which a window does not otherwise use; Redis: after
// the ":d" of a fixed window's string, the value of a sliding window's "d"
// field). A limit lowered since neither caps what is left of the debt nor
// slows its payback, so the debt ends when the store's TTL for the state,
// set when it was written, ends: a lowered limit cannot bring back a debt
// that a store has forgotten, nor one that an admitted take, or a take and
// its refund on a Redis Cluster, has rewritten as the count it carried.

// carryRate returns what a window's count over the rate pays back per
// window: the debt's rate, or p's if that is higher (a raised limit).
// Without debt it is p's rate.
func carryRate(p *Params, s *State) int64 {
	if s.Debt {
		return max(p.Rate, s.Level)
	}
	return p.Rate
}

// setDebt sets a window's debt flag, and with it the debt's rate: p's.
// (A bucketed window's debt counts in full until it leaves the trailing
// period, whatever the rate: it keeps none.)
func setDebt(p *Params, s *State, debt bool) {
	s.Debt, s.Level = debt, 0
	if debt && p.Buckets == 0 {
		s.Level = p.Rate
	}
}

// Debit and Credit are the Modes of Take for debt: Take(p, s, now, n,
// Debit) is Debit(p, s, now, n), and likewise for Credit. A store passes
// them through its usual path (the Redis scripts' mode argument).
const (
	// Debit consumes n even past the limit.
	Debit Mode = 2
	// Credit gives n back, never beyond an empty state.
	Credit Mode = 3
)

// MaxDebt bounds the cost of one debit or credit. The debt a key can owe
// is bounded too (debtCap): ten years of the limit's rate, and less where
// the state's integers would pass 2^53; a debit beyond it saturates.
const MaxDebt = 1 << 51

// Debts reports whether p's algorithm supports Debit and Credit: every
// algorithm with FeatureDebt (all but concurrency), except a shaping leaky
// bucket and a warm-up (its rate is not yet the limit's). A calendar
// window's debt lasts until its window ends: it does not carry into the
// next calendar period (fwCount).
func (p *Params) Debts() bool {
	return p.Kind.Supports(FeatureDebt) && !p.Shaping() && p.Warmup == 0
}

// debtCapUnits is the most a bucket's state may hold beyond empty (token
// bucket: below 0 tokens; gcra and leaky bucket: above c), in units: ten
// years of refill, and at most half the room left below 2^53 above c.
func debtCapUnits(p *Params, c int64) int64 {
	m := (MaxExact - 1 - c) / 2
	if p.B <= m/MaxPeriod {
		m = min(m, MaxPeriod*p.B)
	}
	return m
}

// debtCapEvents is the most a window's count may reach: ten years of the
// rate, at most MaxDebt.
func debtCapEvents(p *Params) int64 {
	w := MaxPeriod/p.Period + 1
	if p.Rate > MaxDebt/w {
		return MaxDebt
	}
	return p.Rate * w
}

// addCapped returns x + n·a, or top if that passes top (x <= top).
func addCapped(x, n, a, top int64) int64 {
	if n > (top-x)/a {
		return top
	}
	return x + n*a
}

// subFloored returns max(x − n·a, 0) for x >= 0.
func subFloored(x, n, a int64) int64 {
	if n >= ceilDiv(x, a) {
		return 0
	}
	return x - n*a
}

// debitTake consumes n (1 <= n <= MaxDebt) for key state s at now whether
// or not it fits. Allowed says whether it fitted (and no penalty box held
// the key); Granted is n; Remaining, RetryAfter and ResetAfter describe the
// state afterwards as a peek does: RetryAfter is when a cost of 1 fits
// again, debt included. A debit that did not fit starts the penalty box of
// a limit with Block, as a rejection does. p must support it (Debts).
func debitTake(p *Params, s *State, now, n int64) Outcome {
	return debtOp(p, s, now, n, Debit)
}

// creditTake gives back up to n events (1 <= n <= MaxDebt) consumed
// earlier, never beyond an empty state, and reports the state afterwards
// as a peek does. Allowed is true. A penalty box is not lifted.
func creditTake(p *Params, s *State, now, n int64) Outcome {
	return debtOp(p, s, now, n, Credit)
}

func debtOp(p *Params, s *State, now, n int64, mode Mode) Outcome {
	return debtOpTaken(p, s, now, n, mode, nil)
}

// debtOpTaken is debtOp; with mode Settle and t, a settlement's refund.
func debtOpTaken(p *Params, s *State, now, n int64, mode Mode, t *Taken) Outcome {
	if n == 0 {
		return take(p, s, now, 0, Exact, true) // a peek
	}
	sp := &specs[p.Kind]
	if s.BlockedUntil != 0 && s.BlockedUntil <= now {
		s.BlockedUntil = 0
	}
	boxed := s.BlockedUntil > now && p.Block > 0
	fit := true
	if mode == Debit {
		_, remaining, _, _, _ := sp.decide(p, s, now, 1, Exact, false)
		fit = !boxed && remaining >= n
		sp.debit(p, s, now, n)
	} else if mode == Settle && t != nil {
		settleRefund(p, s, now, n, t)
	} else {
		sp.credit(p, s, now, n)
	}
	d := decision(p, sp.decide, s, now, 1, Exact, false)
	if d.Granted > 0 {
		d.RetryAfter = 0
	}
	d.Granted = 0
	if mode == Debit {
		d.Granted = n
	}
	d.Allowed = fit
	if !fit && p.Block > 0 && !boxed {
		startBox(p, s, now) // escalating, as a rejection's box is
	}
	if mode == Debit && p.Block > 0 && s.BlockedUntil > now && d.RetryAfter > 0 && now+d.RetryAfter > s.BlockedUntil {
		// The box lasts as long as the debt: nothing fits before the debt
		// is paid anyway, and a box that lapsed first would answer too
		// early a RetryAfter (a box that outlasts the limit's wait is
		// answered alone, BoxOutlasts) and then be restarted, escalating,
		// by the rejection that obeying it meets.
		s.BlockedUntil = now + d.RetryAfter
		if p.Escalating() {
			s.LastBox = s.BlockedUntil
		}
	}
	if s.BlockedUntil > now && p.Block > 0 {
		left := s.BlockedUntil - now
		d.RetryAfter = max(d.RetryAfter, left)
		d.ResetAfter = max(d.ResetAfter, left)
		d.Remaining = 0
		d.BlockedUntil = s.BlockedUntil
	}
	d.TTL = d.ResetAfter
	if sp.life != nil {
		d.TTL = max(d.TTL, sp.life(p, s, now))
	}
	if s.BlockedUntil > now {
		d.TTL = max(d.TTL, s.BlockedUntil-now)
	}
	d.TTL = max(d.TTL, historyLife(p, s, now))
	return d
}

// Settle is the Mode of a settlement's refund: a Credit bounded by what the
// take it settles cannot have recovered since (SettleTake). Take with
// Settle and no Taken is a Credit. The Redis scripts take it as mode 4,
// with the Taken in the member-id argument ("<At>:<Cost>:<Remaining>").
const Settle Mode = 4

// Taken is what a settlement knows of the take it settles: when the store
// made it, by the store's own clock, what it cost and what it left.
type Taken struct {
	At        int64 // µs since the Unix epoch, by the store's clock
	Cost      int64 // the cost taken (the reservation's estimate)
	Remaining int64 // Outcome.Remaining right after the take
}

// SettleTake gives back up to n events of a take described by t, as
// creditTake does, but never more than the limit cannot have recovered
// since t.At, so that the state is left no fuller than it would be had the
// take cost n less at t.At, whatever happened in between:
//
//   - fixed_window: only while the state's window is the take's (a later
//     window forgot the take; a carried debt it may have rewritten is kept).
//   - sliding_window: from the counter that holds the take's window or
//     bucket while the state holds it (slidingWindowRefund).
//   - sliding_log: from the log's entry at exactly t.At, while it is inside
//     the trailing period.
//   - token_bucket, gcra, leaky_bucket: room (tokens; c − (TAT − now)·B;
//     c − level) was at most x = min(c − Cost·A, Remaining·A + A − 1) right
//     after the take, and at most x + (now − At)·B since: only
//     c − min(c, x + (now − At)·B) units can still have been clipped by
//     nothing, so at most that much (in whole events) comes back. With
//     now = At and nothing in between that is at least Cost·A: exact.
//
// Allowed is true; the reply describes the state afterwards as a peek does.
func SettleTake(p *Params, s *State, now, n int64, t Taken) Outcome {
	return debtOpTaken(p, s, now, n, Settle, &t)
}

// settleRoom returns how many events a bucket settlement of a take t may
// still give back at now (see SettleTake; settle_room in prelude.lua).
func settleRoom(p *Params, t *Taken, now int64) int64 {
	c := p.Burst * p.A
	x := int64(0) // room right after the take, at most
	if t.Cost >= 0 && t.Cost < p.Burst {
		x = c - t.Cost*p.A
	}
	if t.Remaining >= 0 && t.Remaining < p.Burst {
		x = min(x, t.Remaining*p.A+p.A-1)
	}
	m := x // room since the take, at most
	if el := now - t.At; el > 0 {
		if el >= ceilDiv(c-x, p.B) {
			m = c
		} else {
			m = x + el*p.B
		}
	}
	return (c - m) / p.A
}

// settleRefund applies a settlement's refund of n events of the take t
// (prelude.lua's settle; the sliding log's Log.removeAt is
// ALG.sliding_log.settle).
func settleRefund(p *Params, s *State, now, n int64, t *Taken) {
	switch p.Kind {
	case TokenBucket, GCRA, LeakyBucket:
		if n = min(n, settleRoom(p, t, now)); n > 0 {
			specs[p.Kind].credit(p, s, now, n)
		}
	case SlidingLog:
		if t.At+p.Period > now {
			s.Log.removeAt(t.At, n)
		}
	default: // the windows
		specs[p.Kind].refund(p, s, t.At, now, n, "")
	}
}
