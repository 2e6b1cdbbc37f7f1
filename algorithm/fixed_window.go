package algorithm

// fixed_window: a counter per window, windows aligned to the Unix epoch.
// Calendar windows (calendar.go) are identified by their start instead.
// Mirrors scripts/fixed_window.lua. State: Window, Count.

// fixedWindow decides a fixed window (ALG.fixed_window.decide).
func fixedWindow(p *Params, s *State, now, cost int64, mode Mode, apply bool) Decision {
	d := Decision{Limit: p.Cap}
	w, wend := fwWindow(p, now) // the window now falls in
	count := s.Count
	if s.Window != w {
		count = 0 // a new window starts empty
	}
	count = min(count, p.Rate)
	g := grant(cost, p.Rate-count, mode)
	end := wend - now // µs until this window ends
	if g == 0 {
		d.RetryAfter = end // the next window admits anything up to Rate
	} else if apply {
		count += g
		s.Window, s.Count = w, count
		d.Changed = true
	}
	d.Granted, d.Remaining = g, p.Rate-count
	if count > 0 {
		d.ResetAfter = end
	}
	return d
}

// fixedWindowRefund: the g events counted at takeNow leave the count, if
// that window is still the stored one (a later window forgot them anyway).
func fixedWindowRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if w, _ := fwWindow(p, takeNow); s.Window != w || s.Count == 0 {
		return false
	}
	s.Count = max(s.Count-g, 0)
	return true
}
