package algorithm

// fixed_window: a counter per window, windows aligned to the Unix epoch.
// Calendar windows (calendar.go) are identified by their start instead.
// Mirrors scripts/fixed_window.lua. State: Window, Count.

// fwCount returns the count of window w (fw_count): the stored count in
// its own window, capped at the rate (a lowered limit); 0 in a later one,
// unless the state is in debt, whose excess carries on, paid back at
// carryRate per window. A calendar window's debt does not carry: each
// calendar period starts empty (a budget's month is its own).
func fwCount(p *Params, s *State, w int64) int64 {
	count := s.Count
	if s.Window != w {
		count = 0 // a new window starts empty
		if s.Debt && s.Window < w && !p.IsCalendar() {
			r := carryRate(p, s)
			if k := w - s.Window; k <= s.Count/r {
				count = s.Count - k*r
			}
		}
	}
	if !s.Debt {
		count = min(count, p.Rate)
	}
	return count
}

// fixedWindow decides a fixed window (ALG.fixed_window.decide).
func fixedWindow(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	w, wend := fwWindow(p, now) // the window now falls in
	count := fwCount(p, s, w)
	r := carryRate(p, s) // what a count over the rate pays back per window
	g := grant(cost, p.Rate-count, mode)
	end := wend - now // µs until this window ends
	if p.IsCalendar() {
		r = max(count, p.Rate) // no debt carries: the next window is empty
	}
	if g == 0 {
		// The next window admits anything up to Rate; in debt, the first
		// window whose carried count leaves room for cost.
		retryAfter = end + (ceilDiv(count+cost-p.Rate, r)-1)*p.Period
	} else if apply {
		count += g
		s.Window, s.Count = w, count
		setDebt(p, s, false)
	}
	granted, remaining = g, max(p.Rate-count, 0)
	if count > 0 {
		resetAfter = end + (ceilDiv(count, r)-1)*p.Period
	}
	return
}

// fixedWindowRefund: the g events counted at takeNow leave the count, if
// that window is still the stored one (a later window forgot them anyway).
func fixedWindowRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if w, _ := fwWindow(p, takeNow); s.Window != w || s.Count == 0 {
		return false
	}
	s.Count = max(s.Count-g, 0)
	if s.Count <= p.Rate {
		setDebt(p, s, false)
	}
	return true
}

// fixedWindowDebit counts n more in the current window, past the rate if
// need be (debt), up to debtCapEvents (ALG.fixed_window.debit).
func fixedWindowDebit(p *Params, s *State, now, n int64) {
	w, _ := fwWindow(p, now)
	count := addCapped(fwCount(p, s, w), n, 1, debtCapEvents(p))
	s.Window, s.Count = w, count
	setDebt(p, s, count > p.Rate)
}

// fixedWindowCredit counts n fewer in the current window, floored at 0
// (ALG.fixed_window.credit).
func fixedWindowCredit(p *Params, s *State, now, n int64) {
	w, _ := fwWindow(p, now)
	count := max(fwCount(p, s, w)-n, 0)
	s.Window, s.Count = w, count
	setDebt(p, s, count > p.Rate)
}
