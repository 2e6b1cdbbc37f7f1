package algorithm

// leaky_bucket: a bucket that drains at Rate per Period. Each admitted
// event adds A units; it holds c = Burst·A and leaks B per µs. Policing
// rejects what does not fit; shaping (MaxDelay > 0) admits up to a level of
// room = min(c, MaxDelay·B + DelayAfter·A) and asks the caller to delay
// each request until its units have drained below DelayAfter events
// (nginx's burst without nodelay, and its delay=N). Mirrors
// scripts/leaky_bucket.lua. State: Level at TS; TS 0 is an empty bucket.

// lbLevel returns the level at now: the stored one minus el·B, floored at
// 0, then capped at c (lb_level). Drain, then cap: a level above a lowered
// burst counts as a full bucket, as GCRA caps its TAT. Capping first would
// make the level depend on when the state was last written: a rewrite of
// the same level at a later ts (the refund of a cross-slot batch) would
// drain it less.
func lbLevel(p *Params, s *State, now, c int64) int64 {
	var level int64
	if s.TS != 0 {
		level = s.Level
		if el := now - s.TS; el > 0 {
			// Compare before multiplying: el·B only when it stays below level.
			if el >= ceilDiv(level, p.B) {
				level = 0
			} else {
				level -= el * p.B
			}
		}
		if !s.Debt {
			level = min(level, c)
		}
	}
	return level
}

// leakyBucket decides a leaky bucket (ALG.leaky_bucket.decide).
func leakyBucket(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	c := p.Burst * p.A
	level := lbLevel(p, s, now, c)
	// room is the level a request may find and still be admitted, plus its own cost.
	room := c
	if p.Shaping() {
		room = min(room, p.MaxDelay*p.B+p.DelayAfter*p.A)
	}
	g := grant(cost, max(room-level, 0)/p.A, mode)
	if g == 0 {
		retryAfter = ceilDiv(level-(room-cost*p.A), p.B) // until cost·A fits
	} else if apply {
		level += g * p.A
		s.Level, s.TS = level, now
		s.Debt = false // it fitted: level <= room
	}
	if g > 0 && p.Shaping() {
		// Hold the request until the level drains to DelayAfter events.
		after := level
		if !apply {
			after += g * p.A
		}
		delay = max(ceilDiv(after-p.DelayAfter*p.A, p.B), 0)
	}
	granted, remaining = g, max(room-level, 0)/p.A
	resetAfter = ceilDiv(level, p.B) // until the bucket is empty
	return
}

// leakyBucketRefund takes g·A units out at now, floored at 0; draining is
// linear above 0, so this is the level the bucket would have without the
// take. The take admitted, so the level it found was below c and uncapped:
// the state written here drains exactly as the one before the take would
// have, under this limit or a lowered one.
func leakyBucketRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if s.TS == 0 {
		return false // expired: the bucket is empty anyway
	}
	level := lbLevel(p, s, now, p.Burst*p.A)
	s.Level, s.TS = max(level-g*p.A, 0), max(now, s.TS)
	s.Debt = s.Debt && s.Level > p.Burst*p.A
	return true
}

// leakyBucketDebit pours n·A units in at now, over c if need be (debt),
// at most debtCapUnits over it (ALG.leaky_bucket.debit). Policing only.
func leakyBucketDebit(p *Params, s *State, now, n int64) {
	c := p.Burst * p.A
	level := addCapped(lbLevel(p, s, now, c), n, p.A, c+debtCapUnits(p, c))
	s.Level, s.TS = level, now
	s.Debt = level > c
}

// leakyBucketCredit takes n·A units out at now, floored at 0
// (ALG.leaky_bucket.credit).
func leakyBucketCredit(p *Params, s *State, now, n int64) {
	c := p.Burst * p.A
	level := subFloored(lbLevel(p, s, now, c), n, p.A)
	s.Level, s.TS = level, now
	s.Debt = level > c
}

// leakyBucketLife is how much longer the stored level lasts at now: after
// a lowered burst it may exceed the burst, and it matters until drained.
func leakyBucketLife(p *Params, s *State, now int64) int64 {
	if s.TS == 0 {
		return 0
	}
	return s.TS + ceilDiv(s.Level, p.B) - now
}
