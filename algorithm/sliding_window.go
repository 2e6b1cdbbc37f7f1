package algorithm

// sliding_window: Cloudflare's two-counter approximation. The previous
// window's count is weighted by the part of it still inside the sliding
// window, in ticks of Tick µs: estimate = ceil(prev × (P − e)/P) + cur.
// With Buckets, the period is split into Buckets sub-windows and only the
// oldest is weighted (slidingBuckets). Mirrors scripts/sliding_window.lua.
// State: Window, Count (cur), Prev; with buckets, Window and the ring of
// counts (bucketCounts).

// slidingWindow decides a sliding window (ALG.sliding_window.decide).
func slidingWindow(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	if p.Buckets > 0 {
		return slidingBuckets(p, s, now, cost, mode, apply)
	}
	pt := p.Period / p.Tick // the period in ticks (Tick divides it)
	nt := now / p.Tick      // now in ticks
	w := nt / pt            // the current window
	e := nt - w*pt          // ticks elapsed in it
	cur, prev := swCounts(p, s, w)
	r := carryRate(p, s) // what a count over the rate pays back per window
	// prev·(pt−e) ≤ Rate·pt < 2^53: Compile chose Tick to make it so.
	weighted := ceilDiv(prev*(pt-e), pt)
	est := weighted + cur
	g := grant(cost, max(p.Rate-est, 0), mode)
	if g == 0 {
		retryAfter = swRetry(p, w, pt, cur, prev, cost, r)*p.Tick - now
	} else if apply {
		cur += g
		est += g
		s.Window, s.Count, s.Prev = w, cur, prev
		setDebt(p, s, false)
	}
	granted, remaining = g, max(p.Rate-est, 0)
	switch {
	case cur > 0:
		// cur weighs nothing two windows on; in debt it carries on for
		// ceil(cur/r) windows first.
		resetAfter = (w+1+ceilDiv(cur, r))*pt*p.Tick - now
	case prev > 0:
		resetAfter = (w+1)*pt*p.Tick - now
	}
	return
}

// swCounts returns the current and previous windows' counts in window w
// (sw_counts): the stored ones, capped at the rate (a lowered limit). In
// debt the current count is not capped, and what is over the rate carries
// into the next window, paid back at r = carryRate per window: k windows
// on, the current count is cur − k·r and the previous one
// min(cur − (k−1)·r, Rate).
func swCounts(p *Params, s *State, w int64) (cur, prev int64) {
	switch k := w - s.Window; {
	case k == 0:
		cur, prev = s.Count, s.Prev
	case k == 1 && !s.Debt:
		prev = s.Count // the stored window is now the previous one
	case k >= 1 && s.Debt && k-1 <= s.Count/carryRate(p, s):
		r := carryRate(p, s)
		prev = s.Count - (k-1)*r
		cur = max(prev-r, 0)
	}
	if !s.Debt {
		cur = min(cur, p.Rate)
	}
	return cur, min(prev, p.Rate)
}

// swRetry returns the tick at which a request of cost fits (sw_retry),
// given the counts in window w (of pt ticks) and r, what the current count
// pays back per window (carryRate). The estimate only falls: the request
// fits in the first window w+m where the (carried) current count
// cur_m = cur − m·r leaves k = Rate − cur_m − cost ≥ 0, once the weighted
// previous count is at most k: ceil(prev(P−e')/P) ≤ k ⇔ e' ≥ P − floor(kP/prev).
func swRetry(p *Params, w, pt, cur, prev, cost, r int64) int64 {
	if k := p.Rate - cur - cost; k >= 0 {
		return w*pt + pt - (k*pt)/prev // same window: prev > 0, as it weighs more than k
	}
	m := ceilDiv(cur+cost-p.Rate, r) // ≥ 1
	curM := max(cur-m*r, 0)
	prevM := min(cur-(m-1)*r, p.Rate) // > Rate − cost ≥ 0, as m is the first
	k := p.Rate - curM - cost
	return (w+m)*pt + max(pt-(k*pt)/prevM, 0)
}

// bucketCounts returns a bucketed sliding window's counts: a ring of
// Buckets+1, the count of bucket i at i mod (Buckets+1), the newest bucket
// being s.Window. They live in the slice that holds a sliding log's
// timestamps: a State serves one algorithm, and sharing keeps every key's
// State as small as it was before buckets.
func (s *State) bucketCounts() *[]int64 { return &s.Log.ts }

// swCount returns bucket i's count, capped at the rate (a lowered limit),
// or 0 if the ring does not hold it (sw_count). valid says whether the
// ring holds buckets s.Window−nb .. s.Window.
func swCount(p *Params, s *State, valid bool, i int64) int64 {
	if !valid || i > s.Window || i < 0 {
		return 0
	}
	c := (*s.bucketCounts())[i%(p.Buckets+1)]
	if !s.Debt {
		c = min(c, p.Rate) // in debt a bucket counts in full
	}
	return c
}

// slidingBuckets decides a sliding window of p.Buckets sub-windows
// (buckets) of bt ticks each (sw_buckets). The trailing period holds the
// current bucket w (e ticks of it elapsed), the nb−1 before it whole, and
// the part of bucket w−nb still inside it, weighted as the plain sliding
// window weighs its previous window:
//
//	estimate = ceil(c[w−nb] × (bt−e)/bt) + c[w−nb+1] + … + c[w]
//
// Only one bucket is estimated, so the error is at most one bucket's
// count; with one bucket this is the plain sliding window.
//
// The ring is indexed by bucket number, which an instant before the epoch
// would make negative: such an instant counts as the epoch. (Redis's
// clock never reads before it, so the Lua has no such step.)
func slidingBuckets(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	now = max(now, 0)
	nb := p.Buckets
	ring := nb + 1
	bt := p.Period / p.Tick / nb // a bucket, in ticks (Compile made it whole)
	nt := now / p.Tick
	w := nt / bt
	e := nt - w*bt
	// The ring holds buckets Window−nb .. Window; a state written under
	// another bucket count, or in the future, or too long ago, is empty.
	counts := s.bucketCounts()
	valid := int64(len(*counts)) == ring && s.Window <= w && w-s.Window <= nb
	old := swCount(p, s, valid, w-nb)
	var held int64 // buckets w−nb+1 .. w, wholly inside the trailing period
	for i := w - nb + 1; i <= w; i++ {
		held += swCount(p, s, valid, i)
	}
	// old·(bt−e) ≤ Rate·bt ≤ Rate·Period/Tick < 2^53: Compile chose Tick.
	est := ceilDiv(old*(bt-e), bt) + held
	g := grant(cost, max(p.Rate-est, 0), mode)
	if g == 0 {
		// In bucket w+m the estimate is ceil(c[w+m−nb] × (bt−e')/bt) plus
		// rest, the counts of w+m−nb+1 .. w; it only falls. The request
		// fits in the first bucket where k = Rate − cost − rest ≥ 0, at
		// e' = bt − floor(k × bt / c[w+m−nb]). (At m = nb, rest is 0.)
		rest := held
		for m := int64(0); m <= nb; m++ {
			o := swCount(p, s, valid, w+m-nb)
			if m > 0 {
				rest -= o
			}
			if k := p.Rate - cost - rest; k >= 0 {
				at := (w + m) * bt // in ticks
				if o > 0 {
					at += bt - (k*bt)/o
				}
				retryAfter = at*p.Tick - now
				break
			}
		}
	} else if apply {
		if int64(len(*counts)) != ring {
			*counts = make([]int64, ring)
		}
		c := *counts
		// Rewrite the ring as buckets w−nb .. w: each index has its own
		// slot. Counting bucket i before writing slot i reads the old ring.
		for i := max(w-nb, 0); i <= w; i++ {
			c[i%ring] = swCount(p, s, valid, i)
		}
		c[w%ring] += g
		setDebt(p, s, s.Debt && ringOver(p, c))
		s.Window, s.Count, s.Prev = w, 0, 0
		valid = true
		est += g
	}
	granted, remaining = g, max(p.Rate-est, 0)
	// The newest bucket with a count leaves the trailing period nb+1
	// buckets after it began.
	for i := w; i >= w-nb; i-- {
		if swCount(p, s, valid, i) > 0 {
			resetAfter = (i+nb+1)*bt*p.Tick - now
			break
		}
	}
	return
}

// slidingWindowRefund takes the g events out of the counter that holds
// them now: cur if the take's window is still the stored one, prev if the
// stored window is the next one (its take moved the count into prev);
// with buckets, the take's bucket if the ring still holds it.
func slidingWindowRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if p.Buckets > 0 {
		tb := takeNow / p.Tick / (p.Period / p.Tick / p.Buckets)
		c := *s.bucketCounts()
		if int64(len(c)) == p.Buckets+1 && tb <= s.Window && tb >= s.Window-p.Buckets && tb >= 0 {
			if j := tb % (p.Buckets + 1); c[j] > 0 {
				c[j] = max(c[j]-g, 0)
				return true
			}
		}
		return false
	}
	tw := takeNow / p.Tick / (p.Period / p.Tick)
	if s.Window == tw && s.Count > 0 {
		s.Count = max(s.Count-g, 0)
		if s.Count <= p.Rate {
			setDebt(p, s, false)
		}
		return true
	} else if s.Window == tw+1 && s.Prev > 0 {
		s.Prev = max(s.Prev-g, 0)
		return true
	}
	return false
}

// slidingWindowDebit counts n more in the current window, past the rate
// if need be (debt), up to debtCapEvents (ALG.sliding_window.debit).
// Without buckets only (Params.Debts).
func slidingWindowDebit(p *Params, s *State, now, n int64) {
	if p.Buckets > 0 {
		bucketsDebit(p, s, now, n)
		return
	}
	w := now / p.Tick / (p.Period / p.Tick)
	cur, prev := swCounts(p, s, w)
	cur = addCapped(cur, n, 1, debtCapEvents(p))
	s.Window, s.Count, s.Prev = w, cur, prev
	setDebt(p, s, cur > p.Rate)
}

// slidingWindowCredit counts n fewer: first in the current window, then
// in the previous one, floored at 0 (ALG.sliding_window.credit).
func slidingWindowCredit(p *Params, s *State, now, n int64) {
	if p.Buckets > 0 {
		bucketsCredit(p, s, now, n)
		return
	}
	w := now / p.Tick / (p.Period / p.Tick)
	cur, prev := swCounts(p, s, w)
	from := min(n, cur)
	cur -= from
	prev = max(prev-(n-from), 0)
	s.Window, s.Count, s.Prev = w, cur, prev
	setDebt(p, s, cur > p.Rate)
}

// ringOver reports whether a bucket of the ring counts more than the rate
// (the state is in debt).
func ringOver(p *Params, c []int64) bool {
	for _, x := range c {
		if x > p.Rate {
			return true
		}
	}
	return false
}

// bucketRing rewrites a bucketed window's ring as buckets w−nb .. w, as
// an admitted take does (sw_ring), and returns it with w.
// An instant before the epoch counts as the epoch, as in slidingBuckets.
func bucketRing(p *Params, s *State, now int64) ([]int64, int64) {
	now = max(now, 0)
	nb := p.Buckets
	ring := nb + 1
	w := now / p.Tick / (p.Period / p.Tick / nb)
	counts := s.bucketCounts()
	valid := int64(len(*counts)) == ring && s.Window <= w && w-s.Window <= nb
	if int64(len(*counts)) != ring {
		*counts = make([]int64, ring)
	}
	c := *counts
	for i := max(w-nb, 0); i <= w; i++ {
		c[i%ring] = swCount(p, s, valid, i)
	}
	s.Window, s.Count, s.Prev = w, 0, 0
	return c, w
}

// bucketsDebit adds n to the newest bucket, past the rate if need be
// (debt): a bucket then counts in full until it leaves the trailing
// period. The ring holds at most 2·Rate events (ALG.sliding_window.debit
// with buckets).
func bucketsDebit(p *Params, s *State, now, n int64) {
	c, w := bucketRing(p, s, now)
	var total int64
	for _, x := range c {
		total += x
	}
	c[w%(p.Buckets+1)] += min(n, max(2*p.Rate-total, 0))
	setDebt(p, s, ringOver(p, c))
}

// bucketsCredit takes n back from the newest buckets first, floored at 0
// (ALG.sliding_window.credit with buckets).
func bucketsCredit(p *Params, s *State, now, n int64) {
	c, w := bucketRing(p, s, now)
	ring := p.Buckets + 1
	for i := w; i >= max(w-p.Buckets, 0) && n > 0; i-- {
		t := min(n, c[i%ring])
		c[i%ring] -= t
		n -= t
	}
	setDebt(p, s, ringOver(p, c))
}
