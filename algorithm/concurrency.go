package algorithm

// concurrency: at most Rate slots held at once; each lease expires Period
// after it was taken, so a crashed holder cannot leak a slot. Mirrors
// scripts/concurrency.lua, whose ZSET holds one member per lease scored by
// its expiry, and a running total of held slots (Held here).

// concurrency decides a concurrency limit (ALG.concurrency.decide; its
// load drops the expired leases, which here is the first step).
func concurrency(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	// Drop expired leases (expiry <= now), each once, with their weights.
	i := 0
	for i < len(s.Leases) && s.Leases[i].Expiry <= now {
		s.Held -= s.Leases[i].Weight
		i++
	}
	if i > 0 {
		// Reslicing, not copying, keeps expiry O(1) amortised: append
		// moves the live leases to a new array when this one is full.
		clear(s.Leases[:i])
		s.Leases = s.Leases[i:]
	}
	held := min(s.Held, p.Rate)
	g := grant(cost, p.Rate-held, mode)
	if g == 0 {
		// Wait for the earliest leases to expire until cost fits: the first
		// lease (in expiry order) by which need slots have expired.
		need := held + cost - p.Rate
		for _, l := range s.Leases {
			need -= l.Weight
			if need <= 0 {
				retryAfter = l.Expiry - now
				break
			}
		}
	} else if apply {
		held += g
		s.Leases = append(s.Leases, Lease{Expiry: now + p.Period, Weight: g})
		s.Held += g
	}
	granted, remaining = g, p.Rate-held
	if n := len(s.Leases); n > 0 {
		// The last lease to expire.
		resetAfter = s.Leases[n-1].Expiry - now
	}
	return
}

// concurrencyRefund releases exactly the lease the take added: the one
// named id, or for an anonymous take (id "") the newest unnamed lease of
// weight g that the take at takeNow would have made.
func concurrencyRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	for i := len(s.Leases) - 1; i >= 0; i-- {
		l := s.Leases[i]
		if l.ID == id && l.Weight == g && (id != "" || l.Expiry == takeNow+p.Period) {
			s.Held -= g
			s.Leases = append(s.Leases[:i], s.Leases[i+1:]...)
			return true
		}
	}
	return false
}
