package algorithm

import "testing"

// TestDebtBounds: the largest debit on extreme limits saturates at the
// debt's bound: every stored quantity stays an exact integer (below 2^53),
// RetryAfter and ResetAfter stay within ten years and a period or two,
// and a credit of as much brings the key back to empty.
func TestDebtBounds(t *testing.T) {
	const year = 366 * 24 * 3600 * 1_000_000
	now := int64(1_900_000_000_000_000) // 2030, in µs
	for _, c := range []Config{
		{Kind: TokenBucket, Rate: 1_000_000_000, Period: 1_000_000},
		{Kind: TokenBucket, Rate: 1, Period: 10 * year},
		{Kind: GCRA, Rate: 7, Period: 3_000_001, Burst: 1_000_000},
		{Kind: GCRA, Rate: MaxExact - 1, Period: 1},
		{Kind: LeakyBucket, Rate: 3, Period: 10_000_000},
		{Kind: FixedWindow, Rate: MaxExact - 1, Period: 1_000_000},
		{Kind: FixedWindow, Rate: 1, Period: 1},
		{Kind: SlidingWindow, Rate: 1000, Period: 7_000_000},
		{Kind: SlidingWindow, Rate: 10, Period: 60_000_000, Buckets: 60},
		{Kind: SlidingLog, Rate: MaxLogSize, Period: 3_600_000_000},
	} {
		p, err := Compile(c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		var s State
		d := DebitTake(&p, &s, now, MaxDebt)
		maxWait := MaxPeriod + 3*p.MaxWait
		fits := MaxDebt <= p.Cap
		if d.Allowed != fits || d.Granted != MaxDebt || (d.RetryAfter > 0) == fits || d.RetryAfter > maxWait || d.ResetAfter < d.RetryAfter || d.ResetAfter > maxWait {
			t.Errorf("%+v: Debit(MaxDebt) = %+v", c, d)
		}
		for _, v := range []int64{s.Level, s.TAT, s.Frac, s.Count, s.Prev} {
			if v >= MaxExact || v <= -MaxExact {
				t.Errorf("%+v: a state value %d is past 2^53: %+v", c, v, s)
			}
		}
		// Twice more saturates; then a credit of everything empties it.
		DebitTake(&p, &s, now, MaxDebt)
		d2 := DebitTake(&p, &s, now, MaxDebt)
		if d2.RetryAfter > maxWait {
			t.Errorf("%+v: a saturated debt grew: %+v", c, d2)
		}
		for range 3 {
			CreditTake(&p, &s, now, MaxDebt)
		}
		if d := Take(&p, &s, now, 0, Exact); !d.Allowed || d.Remaining != p.Cap {
			t.Errorf("%+v: after crediting everything back: %+v", c, d)
		}
	}
}
