package algorithm_test

import (
	"math/rand/v2"
	"testing"

	"github.com/weir-dev/weir/algorithm"
)

// TestSettleNeverOverRefunds: a settlement's refund leaves the state no
// fuller than it would be had the take cost the actual at its time,
// whatever happened in between. Key A takes est at t0, others
// take and debit on it, and at t1 A settles at actual; key B took actual
// at t0 and sees the same admitted takes and debits (B, emptier, admits
// every take A admitted). From t1 on A never has more room than B. With
// nothing in between and t1 = t0 the settlement is exact: A is B.
func TestSettleNeverOverRefunds(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 15))
	const t0 = 1_700_000_000_000_000
	for _, p := range refundLimits(t) {
		if !p.Debts() || p.Block > 0 {
			continue
		}
		p := p
		for run := 0; run < 300; run++ {
			var a, b algorithm.State
			now := int64(t0) + rng.Int64N(p.Period)
			// Some history first, the same on both.
			for k := rng.IntN(4); k > 0; k-- {
				n := 1 + rng.Int64N(p.MaxCost())
				algorithm.Take(&p, &a, now, n, algorithm.Exact)
				algorithm.Take(&p, &b, now, n, algorithm.Exact)
				now += rng.Int64N(p.Period / 2)
			}
			est := 1 + rng.Int64N(p.MaxCost())
			da := algorithm.Take(&p, &a, now, est, algorithm.Exact)
			if !da.Allowed {
				continue
			}
			actual := rng.Int64N(est)
			algorithm.Take(&p, &b, now, actual, algorithm.Exact) // 0 peeks: nothing taken
			taken := algorithm.Taken{At: now, Cost: est, Remaining: da.Remaining}
			exact := rng.IntN(4) == 0
			if !exact {
				for k := rng.IntN(6); k > 0; k-- {
					now += rng.Int64N(p.Period)
					n := 1 + rng.Int64N(p.MaxCost())
					if rng.IntN(4) == 0 {
						algorithm.Take(&p, &a, now, n, algorithm.Debit)
						algorithm.Take(&p, &b, now, n, algorithm.Debit)
						continue
					}
					if algorithm.Take(&p, &a, now, n, algorithm.Exact).Allowed {
						if !algorithm.Take(&p, &b, now, n, algorithm.Exact).Allowed {
							t.Fatalf("%+v run %d: B, which took less, rejected a take A admitted", p.Config, run)
						}
					}
				}
				now += rng.Int64N(p.Period)
			}
			algorithm.SettleTake(&p, &a, now, est-actual, taken)
			for k := 0; k < 4; k++ {
				pa := algorithm.Take(&p, &a, now, 0, algorithm.Exact)
				pb := algorithm.Take(&p, &b, now, 0, algorithm.Exact)
				if exact && (pa.Remaining != pb.Remaining || pa.ResetAfter != pb.ResetAfter) {
					t.Fatalf("%+v run %d: an immediate settlement is not exact: %+v, want %+v", p.Config, run, pa, pb)
				}
				if pa.Remaining > pb.Remaining || pa.ResetAfter < pb.ResetAfter {
					t.Fatalf("%+v run %d: the settlement gave back too much at +%dµs: %+v, had the take cost %d: %+v", p.Config, run, k, pa, actual, pb)
				}
				now += rng.Int64N(p.Period / 2)
			}
		}
	}
}
