package algorithm

// gcra: the generic cell rate algorithm (redis-cell semantics). The state
// is the theoretical arrival time TAT; a request fits while TAT − now
// leaves room for its cells in a burst of c = Burst·A units. TAT is kept
// as whole µs plus a fraction Frac in units of 1/B µs, so nothing is ever
// rounded. Mirrors scripts/gcra.lua. State: TAT, Frac; TAT 0 is idle.

// gcraDiff returns TAT − now in units of 1/B µs, in [0, c] (gcra_diff).
// A TAT in the past leaves 0 (Frac < B), and never multiplies a long idle
// time; one more than c/B µs ahead (after a lowered burst) reads as c.
func gcraDiff(p *Params, s *State, now, c int64) int64 {
	var diff int64
	if s.TAT != 0 {
		switch ahead := s.TAT - now; {
		case ahead > c/p.B && !s.Debt:
			diff = c // guard before multiplying: ahead·B would pass c
		case ahead > c/p.B:
			diff = ahead*p.B + s.Frac // in debt: debtCapUnits bounds it
		case ahead >= 0:
			diff = ahead*p.B + s.Frac
		}
	}
	return diff
}

// gcra decides GCRA (ALG.gcra.decide).
func gcra(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	c := p.Burst * p.A
	diff := gcraDiff(p, s, now, c)
	g := grant(cost, max(c-diff, 0)/p.A, mode)
	if g == 0 {
		retryAfter = ceilDiv(diff+cost*p.A-c, p.B)
	} else if apply {
		diff += g * p.A
		s.TAT, s.Frac = now+diff/p.B, diff%p.B
		s.Debt = false // it fitted: diff <= c
	}
	granted, remaining = g, max(c-diff, 0)/p.A
	resetAfter = ceilDiv(diff, p.B) // until TAT
	return
}

// gcraRefund moves TAT back by g cells, measured from now and floored at
// now (TAT advances linearly, so this is the TAT without the take).
func gcraRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if s.TAT == 0 {
		return false
	}
	c := p.Burst * p.A
	diff := max(gcraDiff(p, s, now, c)-g*p.A, 0)
	s.TAT, s.Frac = now+diff/p.B, diff%p.B
	s.Debt = s.Debt && diff > c
	return true
}

// gcraDebit moves TAT n cells on from max(TAT, now), past the burst if
// need be (debt), at most debtCapUnits past it (ALG.gcra.debit).
func gcraDebit(p *Params, s *State, now, n int64) {
	c := p.Burst * p.A
	diff := addCapped(gcraDiff(p, s, now, c), n, p.A, c+debtCapUnits(p, c))
	s.TAT, s.Frac = now+diff/p.B, diff%p.B
	s.Debt = diff > c
}

// gcraCredit moves TAT back n cells, floored at now (ALG.gcra.credit).
func gcraCredit(p *Params, s *State, now, n int64) {
	c := p.Burst * p.A
	diff := subFloored(gcraDiff(p, s, now, c), n, p.A)
	s.TAT, s.Frac = now+diff/p.B, diff%p.B
	s.Debt = diff > c
}

// gcraLife is how much longer the stored TAT lasts at now: after a lowered
// burst it may lie further ahead than the burst reads.
func gcraLife(p *Params, s *State, now int64) int64 {
	if s.TAT == 0 {
		return 0
	}
	l := s.TAT - now
	if s.Frac > 0 {
		l++
	}
	return l
}
