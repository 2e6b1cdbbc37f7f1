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
		{Kind: SlidingLog, Rate: maxLogSize, Period: 3_600_000_000},
	} {
		p, err := Compile(c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		var s State
		d := debitTake(&p, &s, now, MaxDebt)
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
		debitTake(&p, &s, now, MaxDebt)
		d2 := debitTake(&p, &s, now, MaxDebt)
		if d2.RetryAfter > maxWait {
			t.Errorf("%+v: a saturated debt grew: %+v", c, d2)
		}
		for range 3 {
			creditTake(&p, &s, now, MaxDebt)
		}
		if d := Take(&p, &s, now, 0, Exact); !d.Allowed || d.Remaining != p.Cap {
			t.Errorf("%+v: after crediting everything back: %+v", c, d)
		}
	}
}

// TestDebtLoweredLimit: a window's debt is paid back at the rate of the
// limit it was written under, so under a lowered limit (a reload halving
// the rate) a key decides the same whether or not its state was rewritten
// in between, and the state matters no longer than the TTL the store set
// when it wrote it. A debt repaid at the lowered rate broke both: a take
// and its refund (a failed batch across Redis Cluster slots) left a state
// that forgot the debt memstore still carried, and Redis expired a state
// that memstore still counted (the differential test, seeds 1 and 4).
func TestDebtLoweredLimit(t *testing.T) {
	const epoch = int64(1_893_456_000_000_000) // 2030-01-01, in µs: a whole day
	for _, c := range []Config{
		{Kind: FixedWindow, Rate: 4, Period: 60_000_000},
		{Kind: FixedWindow, Rate: 500, Period: 7_000_000},
		{Kind: SlidingWindow, Rate: 4, Period: 60_000_000},
		{Kind: SlidingWindow, Rate: 500, Period: 7_000_000},
	} {
		p, err := Compile(c)
		if err != nil {
			t.Fatal(err)
		}
		debitAt := epoch + c.Period/3
		var debt State
		dd := debitTake(&p, &debt, debitAt, c.Rate*5/2+1) // 2.5 windows' worth and one
		expires := debitAt + dd.TTL
		for _, lo := range []int64{c.Rate / 2, c.Rate / 4, 1} {
			lc := c
			lc.Rate = lo
			q, err := Compile(lc)
			if err != nil {
				t.Fatal(err)
			}
			peek := func(s State, now int64) Outcome {
				d := Take(&q, &s, now, 0, Exact)
				d.TTL = 0
				return d
			}
			// Past the TTL, the state is as good as none.
			for now := expires; now < expires+3*c.Period; now += c.Period / 7 {
				if got, want := peek(debt, now), peek(State{}, now); got != want {
					t.Errorf("%s %d/%dµs lowered to %d, %dµs after the debit's TTL ended: %+v, want %+v (an empty key's)", c.Kind, c.Rate, c.Period, lo, now-expires, got, want)
				}
			}
			// An admitted take and its refund, in each window until the
			// debt is paid, change nothing the lowered limit sees.
			for w := int64(1); w <= 3; w++ {
				takeAt := epoch + w*c.Period + c.Period*9/10
				re := debt
				if d := Take(&p, &re, takeAt, 1, Exact); !d.Allowed {
					continue
				}
				if !refundTake(&p, &re, takeAt, takeAt, 1, "") {
					t.Fatalf("%+v: the refund at window %d found nothing", c, w)
				}
				for now := takeAt; now < expires+c.Period; now += c.Period / 7 {
					if got, want := peek(re, now), peek(debt, now); got != want {
						t.Errorf("%s %d/%dµs lowered to %d, rewritten in window %d, at %dµs: %+v, want %+v (as never rewritten)", c.Kind, c.Rate, c.Period, lo, w, now-epoch, got, want)
					}
				}
			}
		}
	}
}
