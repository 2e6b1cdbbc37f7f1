package algorithm

// token_bucket: a bucket of Burst tokens refilled continuously at Rate per
// Period. In exact units: one event costs A, the bucket holds c = Burst·A
// and gains B per µs (A/B = Period/Rate, reduced by Compile). Mirrors
// scripts/token_bucket.lua. State: Level (the tokens) at TS; TS 0 is a
// full bucket.

// tbTokens returns the tokens at now: the stored ones plus el·B, capped
// at c (tb_tokens).
func tbTokens(p *Params, s *State, now, c int64) int64 {
	tokens := c
	if s.TS != 0 {
		tokens = min(s.Level, c)
		if el := now - s.TS; el > 0 {
			// Compare before multiplying: el·B only when it stays below c.
			if el >= ceilDiv(c-tokens, p.B) {
				tokens = c
			} else {
				tokens += el * p.B
			}
		}
	}
	return tokens
}

// tokenBucket decides a token bucket (ALG.token_bucket.decide).
func tokenBucket(p *Params, s *State, now, cost int64, mode Mode, apply bool) (granted, remaining, retryAfter, resetAfter, delay int64) {
	c := p.Burst * p.A
	tokens := tbTokens(p, s, now, c)
	g := grant(cost, tokens/p.A, mode)
	if g == 0 {
		retryAfter = ceilDiv(cost*p.A-tokens, p.B) // until cost·A tokens are in
	} else if apply {
		tokens -= g * p.A
		s.Level, s.TS = tokens, now
	}
	granted, remaining = g, max(tokens, 0)/p.A // tokens < 0: in debt
	resetAfter = ceilDiv(c-tokens, p.B)        // until the bucket is full
	return
}

// tokenBucketRefund puts g·A tokens back at now, capped at c. Refilling is
// linear below the cap, so this is the state the bucket would have without
// the take: min(min(x − gA, c) + gA, c) = min(x, c).
func tokenBucketRefund(p *Params, s *State, takeNow, now, g int64, id string) bool {
	if s.TS == 0 {
		return false // expired: the bucket is full anyway
	}
	c := p.Burst * p.A
	tokens := tbTokens(p, s, now, c)
	if tokens >= c-g*p.A {
		tokens = c
	} else {
		tokens += g * p.A
	}
	s.Level, s.TS = tokens, max(now, s.TS)
	return true
}

// tokenBucketDebit takes n·A tokens at now, below 0 if need be (debt),
// down to −debtCapUnits (ALG.token_bucket.debit).
func tokenBucketDebit(p *Params, s *State, now, n int64) {
	c := p.Burst * p.A
	low := debtCapUnits(p, c)
	tokens := tbTokens(p, s, now, c)
	s.Level, s.TS = -addCapped(-tokens, n, p.A, low), now
}

// tokenBucketCredit puts n·A tokens back at now, capped at c
// (ALG.token_bucket.credit).
func tokenBucketCredit(p *Params, s *State, now, n int64) {
	c := p.Burst * p.A
	tokens := tbTokens(p, s, now, c)
	s.Level, s.TS = c-subFloored(c-tokens, n, p.A), now
}
