package algorithm

// Warm-up (Sentinel's cold start) for token_bucket and gcra: after a key
// has been idle, its rate starts at a third of the limit and rises to the
// full limit over Warmup, so that a cold cache or a new instance is not
// flooded.
//
// A key is idle (cold) when its bucket has refilled to the full burst, or
// has no state. The first request that finds it so starts a warm-up at
// that instant t0: the bucket then holds (and can hold) only a third of
// the burst, and the warm-up runs in WarmupSteps equal steps; in step k
// (0 ≤ k < WarmupSteps) both the refill rate and the capacity are
// (WarmupSteps + 2k) / (3·WarmupSteps) of the full ones: 1/3, 2/5, ...,
// 14/15, then whole from t0 + Warmup on. Once the bucket is full again the
// key is cold again. A warm-up is exact integer arithmetic: in its units an
// event is A·3·WarmupSteps, step k refills B·(WarmupSteps + 2k) per µs and
// holds Burst·A·(WarmupSteps + 2k); the full bucket refills B·3·WarmupSteps
// per µs. Both buckets run the same functions here (State.Level, TS,
// WarmStart), mirrored by scripts/warmup.lua; a warm-up limit keeps its
// state under its own Redis key.

// WarmupSteps is the number of equal steps in which a warm-up's rate rises
// from a third to the whole.
const WarmupSteps = 10

// MaxWarmup is the longest warm-up, in µs: a day.
const MaxWarmup = 24 * 3600 * 1_000_000

// Warming reports whether p has a warm-up.
func (p *Params) Warming() bool { return p.Warmup > 0 }

// warmUnit is one event in warm-up units.
func (p *Params) warmUnit() int64 { return p.A * 3 * WarmupSteps }

// warmStep is the step of the warm-up started at t0 that t falls in;
// WarmupSteps once it is over.
func (p *Params) warmStep(t0, t int64) int64 {
	return min(max(t-t0, 0)/(p.Warmup/WarmupSteps), WarmupSteps)
}

// warmRate and warmCap are step k's refill per µs and capacity, in
// warm-up units.
func (p *Params) warmRate(k int64) int64 { return p.B * (WarmupSteps + 2*k) }
func (p *Params) warmCap(k int64) int64  { return p.Burst * p.A * (WarmupSteps + 2*k) }

// warmFill adds what [t, end) refills at rate r to lvl, capped at c,
// without forming a product past c (warm_fill).
func warmFill(lvl, t, end, r, c int64) int64 {
	if lvl >= c {
		return c
	}
	if end-t >= ceilDiv(c-lvl, r) {
		return c
	}
	return lvl + (end-t)*r
}

// warmTokens returns the bucket at now and its warm-up's start; a cold key
// (no state, or a full bucket) starts a warm-up at now with a third of the
// burst (warm_tokens).
func warmTokens(p *Params, s *State, now int64) (tokens, t0 int64) {
	if s.TS == 0 {
		return p.warmCap(0), now
	}
	lvl, t, t0 := s.Level, s.TS, s.WarmStart
	for t < now {
		k := p.warmStep(t0, t)
		end := now
		if k < WarmupSteps {
			end = min(now, t0+(k+1)*(p.Warmup/WarmupSteps))
		}
		lvl = warmFill(lvl, t, end, p.warmRate(k), p.warmCap(k))
		t = end
	}
	if lvl >= p.warmCap(WarmupSteps) {
		return p.warmCap(0), now // idle: the bucket is full, a new warm-up starts
	}
	return min(lvl, p.warmCap(p.warmStep(t0, now))), t0
}

// warmWait returns the µs from now until a bucket holding tokens at now,
// Warming up since t0, holds target (warm_wait).
func warmWait(p *Params, t0, now, tokens, target int64) int64 {
	lvl, t := tokens, now
	for lvl < target {
		k := p.warmStep(t0, t)
		r := p.warmRate(k)
		if k >= WarmupSteps {
			return t - now + ceilDiv(target-lvl, r)
		}
		end := t0 + (k+1)*(p.Warmup/WarmupSteps)
		if p.warmCap(k) >= target {
			if need := ceilDiv(target-lvl, r); t+need <= end {
				return t + need - now
			}
		}
		lvl = warmFill(lvl, t, end, r, p.warmCap(k))
		t = end
	}
	return t - now
}

// warmBucket decides a token bucket or GCRA with a warm-up
// (ALG.<bucket>.decide with p.warm). A rejection that finds the key cold
// records the warm-up's start, so that its RetryAfter holds.
func warmBucket(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	u := p.warmUnit()
	tokens, t0 := warmTokens(p, s, now)
	started := s.TS == 0 || t0 != s.WarmStart
	g := grant(cost, tokens/u, mode)
	if g == 0 {
		retryAfter = warmWait(p, t0, now, tokens, cost*u)
	}
	if apply && (g > 0 || started) {
		tokens -= g * u
		s.Level, s.TS, s.WarmStart = tokens, now, t0
	}
	granted, remaining = g, tokens/u
	resetAfter = warmWait(p, t0, now, tokens, p.warmCap(WarmupSteps))
	return
}

// warmRefund gives back the g events that an admitted take at takeNow
// granted (warm_refund). While nothing has refilled the bucket since (its
// state is still the take's, at takeNow), the events go back at takeNow,
// which restores the state before the take exactly; and if that take found
// the key cold and started its warm-up, the key is cold again (no state):
// a warm-up started at takeNow and kept would, by its later steps, grant
// more than the key that never saw the take. A refused request that
// started the warm-up in the take's very microsecond is forgotten with it,
// which grants less, never more. Once the state has moved on, the events
// go back at now, capped at the capacity of the warm-up's step now.
func warmRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if s.TS == 0 {
		return false
	}
	u := p.warmUnit()
	if s.TS == takeNow {
		lvl := min(s.Level+g*u, p.warmCap(p.warmStep(s.WarmStart, takeNow)))
		if s.WarmStart == takeNow && lvl >= p.warmCap(0) {
			s.Level, s.TS, s.WarmStart = 0, 0, 0 // cold, as before the take
			return true
		}
		s.Level = lvl
		return true
	}
	tokens, t0 := warmTokens(p, s, now)
	if t0 != s.WarmStart {
		return false // cold again: nothing to give back
	}
	s.Level = min(tokens+g*u, p.warmCap(p.warmStep(t0, now)))
	s.TS = max(now, s.TS)
	return true
}

// compileWarmup validates a warm-up: on a bucket whose burst stays exact
// in warm-up units, in whole steps, at most MaxWarmup.
func compileWarmup(p *Params) error {
	if p.Warmup == 0 {
		return nil
	}
	k := p.Kind
	switch {
	case p.Warmup < 0:
		return fieldError(k, FieldWarmup, Invalid, p.Warmup, "warmup must not be negative, got %dµs", p.Warmup)
	case p.Warmup > MaxWarmup:
		return fieldError(k, FieldWarmup, Invalid, p.Warmup, "warmup %dµs is longer than a day: a key idle that long is cold again long before it warms up", p.Warmup)
	case p.Warmup%WarmupSteps != 0:
		return fieldError(k, FieldWarmup, Invalid, p.Warmup, "warmup %dµs must be a whole number of %d-µs steps", p.Warmup, WarmupSteps)
	case p.Burst > (MaxExact-1)/(p.A*3*WarmupSteps):
		return fieldError(k, FieldWarmup, Invalid, p.Warmup, "warmup: burst %d × interval %d/%dµs is too large to track exactly through a warm-up (lower the burst)", p.Burst, p.A, p.B)
	}
	// From empty, a bucket refills at a third of the rate at least.
	p.MaxWait = p.Warmup + 3*p.MaxWait
	return nil
}
