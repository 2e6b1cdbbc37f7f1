package algorithm_test

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// TestTakeToSameAsTake runs random workloads (every algorithm, with
// penalty boxes, escalation, warm-up, shaping, buckets, peeks, partial
// grants, debits and credits) on two states in lockstep, one through Take
// and one through TakeTo into an Outcome that holds junk from before, and
// requires the same Outcome and the same State after every operation:
// TakeTo writes every field of the Outcome.
func TestTakeToSameAsTake(t *testing.T) {
	var limits []weir.Limit
	for _, a := range weir.Algorithms() {
		base := weir.Limit{Algorithm: a, Rate: 5, Period: time.Second}
		boxed := base
		boxed.Block = 3 * time.Second
		boxed.Escalate[0] = 7 * time.Second
		boxed.ForgetAfter = time.Minute
		long := base
		long.Block = time.Minute // outlasts the state: answered by the box alone
		limits = append(limits, base, boxed, long)
	}
	limits = append(limits,
		weir.Limit{Algorithm: weir.TokenBucket, Rate: 5, Period: time.Second, Burst: 5, Warmup: 20 * time.Second},
		weir.Limit{Algorithm: weir.GCRA, Rate: 5, Period: time.Second, Burst: 5, Warmup: 20 * time.Second},
		weir.Limit{Algorithm: weir.LeakyBucket, Rate: 5, Period: time.Second, Burst: 6, MaxDelay: time.Second, DelayAfter: 2},
		weir.Limit{Algorithm: weir.SlidingWindow, Rate: 5, Period: time.Second, Buckets: 4},
	)
	junk := algorithm.Outcome{Allowed: true, Granted: -1, Limit: -2, Remaining: -3, RetryAfter: -4, ResetAfter: -5, Delay: -6, BlockedUntil: -7, TTL: -8}
	for _, l := range limits {
		p, err := l.Compile()
		if err != nil {
			t.Fatalf("%+v: %v", l, err)
		}
		for seed := range uint64(5) {
			rng := rand.New(rand.NewPCG(seed, 2))
			var s1, s2 algorithm.State
			now := int64(1_893_456_000_000_000)
			for op := range 2000 {
				now += rng.Int64N(400_000)
				n := rng.Int64N(min(p.MaxCost(), 4) + 1)
				mode := algorithm.Mode(rng.IntN(2)) // Exact or AtMost
				if p.Debts() && rng.IntN(5) == 0 {
					mode = algorithm.Debit + algorithm.Mode(rng.IntN(2))
				}
				want := algorithm.Take(&p, &s1, now, n, mode)
				got := junk
				algorithm.TakeTo(&p, &s2, now, n, mode, &got)
				if got != want {
					t.Fatalf("%s seed %d op %d n=%d mode %d: TakeTo %+v, Take %+v", l.Algorithm, seed, op, n, mode, got, want)
				}
				if !reflect.DeepEqual(s1, s2) {
					t.Fatalf("%s seed %d op %d: states differ: %+v and %+v", l.Algorithm, seed, op, s1, s2)
				}
			}
		}
	}
}
