package algorithm_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// refundLimits are the limits the refund tests run: every algorithm, with
// fractional emission intervals, bursts, penalty boxes, shaping and
// buckets.
func refundLimits(t *testing.T) []algorithm.Params {
	var out []algorithm.Params
	for _, a := range weir.Algorithms() {
		ls := []weir.Limit{
			{Rate: 4, Period: time.Minute},
			{Rate: 7, Period: 3 * time.Second},
			{Rate: 3, Period: 10 * time.Second, Block: 20 * time.Second},
			{Rate: 5, Period: 1234567 * time.Microsecond},
			{Rate: 1000, Period: 7 * time.Second},
		}
		switch a {
		case weir.TokenBucket, weir.GCRA, weir.LeakyBucket:
			ls = append(ls, weir.Limit{Rate: 3, Period: 10 * time.Second, Burst: 5},
				weir.Limit{Rate: 1_000_000_007, Period: time.Second, Burst: 3})
		case weir.SlidingWindow:
			ls = append(ls, weir.Limit{Rate: 7, Period: 3 * time.Second, Buckets: 3},
				weir.Limit{Rate: 10, Period: time.Minute, Buckets: 60})
		}
		if a == weir.TokenBucket || a == weir.GCRA {
			// Warm-ups: a take that starts one on a cold key, given back,
			// leaves the key cold; steps of 2s (a step's refill smaller
			// than its rise in capacity) and of 300ms.
			ls = append(ls, weir.Limit{Rate: 3, Period: 10 * time.Second, Burst: 5, Warmup: 20 * time.Second},
				weir.Limit{Rate: 1000, Period: 7 * time.Second, Burst: 9, Warmup: 3 * time.Second, Block: 2 * time.Second})
		}
		if a == weir.LeakyBucket {
			ls = append(ls, weir.Limit{Rate: 4, Period: time.Minute, Burst: 6, DelayAfter: 3, MaxDelay: time.Hour},
				weir.Limit{Rate: 3, Period: 10 * time.Second, Burst: 8, MaxDelay: 7 * time.Second})
		}
		for _, l := range ls {
			l.Algorithm = a
			p, err := l.Compile()
			if err != nil {
				t.Fatalf("%+v: %v", l, err)
			}
			out = append(out, p)
		}
	}
	return out
}

// op is one step of a key's history.
type op struct {
	dt, n int64
	mode  algorithm.Mode
}

func randomOps(rng *rand.Rand, p *algorithm.Params, k int) []op {
	ops := make([]op, k)
	for i := range ops {
		ops[i] = op{dt: rng.Int64N(p.MaxWait/3 + 2), n: rng.Int64N(p.MaxCost() + 1), mode: algorithm.Mode(rng.IntN(2))}
		if rng.IntN(4) == 0 {
			ops[i].dt = 0 // several calls in one microsecond
		}
	}
	return ops
}

// replay runs ops on a fresh state from now and returns the state and the
// time of the last op.
func replay(p *algorithm.Params, now int64, ops []op) (algorithm.State, int64) {
	var s algorithm.State
	for _, o := range ops {
		now += o.dt
		algorithm.Take(p, &s, now, o.n, o.mode)
	}
	return s, now
}

// TestRefundRestores: a take that a refund gives back leaves a state that
// decides exactly as the state without the take, for every algorithm, at
// every later instant: the Redis store refunds the takes of a cross-slot
// batch that failed as a whole (multi.lua), and each Go refund is the
// reference for its Lua mirror. Two states replay one history; one of
// them takes and is refunded (with a lease id, as a Redis call has, or
// anonymous, as a memstore Take is); then both run the same random
// requests and must agree on every decision.
func TestRefundRestores(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 2))
	refunds := 0
	for _, p := range refundLimits(t) {
		t.Run(fmt.Sprintf("%s/%d_per_%dus_burst%d_block%d_delay%d_buckets%d_warmup%d", p.Kind, p.Rate, p.Period, p.Burst, p.Block, p.MaxDelay, p.Buckets, p.Warmup), func(t *testing.T) {
			for trial := range 300 {
				history := randomOps(rng, &p, rng.IntN(12))
				orig, now := replay(&p, epochUs, history)
				took, _ := replay(&p, epochUs, history)
				now += rng.Int64N(p.MaxWait/2 + 1)
				n := 1 + rng.Int64N(p.MaxCost())
				mode := algorithm.Mode(rng.IntN(2))
				d := algorithm.Take(&p, &took, now, n, mode)
				if !d.Allowed {
					continue
				}
				id := ""
				if rng.IntN(2) == 0 {
					id = fmt.Sprintf("lease-%d", trial)
					algorithm.SetLeaseID(&took, id)
				}
				later := now
				if rng.IntN(2) == 0 {
					later += rng.Int64N(p.Period/4 + 1) // the refund of a batch comes a little later
				}
				if !algorithm.Refund(&p, &took, now, later, d.Granted, id) {
					t.Fatalf("trial %d: the refund of %d granted at %d found nothing to give back (%+v)", trial, d.Granted, now, d)
				}
				refunds++
				at := later
				for i, o := range randomOps(rng, &p, 8) {
					at += o.dt
					a := algorithm.Take(&p, &orig, at, o.n, o.mode)
					b := algorithm.Take(&p, &took, at, o.n, o.mode)
					if a != b {
						t.Fatalf("trial %d: took %d at %d (+%dµs), refunded at +%dµs; step %d (+%dµs, n=%d, mode %d):\nwithout the take %+v\nrefunded         %+v",
							trial, d.Granted, now, now-epochUs, later-now, i, at-later, o.n, o.mode, a, b)
					}
				}
			}
		})
	}
	if refunds < 1000 {
		t.Fatalf("only %d refunds ran", refunds)
	}
}

// TestRefundOfNothing: a refund of nothing, or of a take whose state has
// since gone, changes nothing.
func TestRefundOfNothing(t *testing.T) {
	for _, p := range refundLimits(t) {
		var s algorithm.State
		if algorithm.Refund(&p, &s, epochUs, epochUs, 1, "x") {
			t.Errorf("%s: a refund on an empty state reported a change", p.Kind)
		}
		d := algorithm.Take(&p, &s, epochUs, 1, algorithm.Exact)
		if algorithm.Refund(&p, &s, epochUs, epochUs, 0, "") {
			t.Errorf("%s: a refund of 0 reported a change", p.Kind)
		}
		if !d.Allowed {
			t.Fatalf("%s: the first take was rejected: %+v", p.Kind, d)
		}
	}
}

// TestRefundAfterOthers: for the algorithms that count events (the
// windows, the log, leases), a refund is exact even after other requests
// changed the key: the state is then the one those requests alone would
// have made. (A bucket's refund is exact only when nothing came between,
// as its refill stops at the cap.) The state without the take replays the
// others' grants as exact requests, which it admits: it held less.
func TestRefundAfterOthers(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 3))
	refunds := 0
	for _, p := range refundLimits(t) {
		if spec, _ := p.Kind.Spec(); spec.Bucket || p.Block > 0 {
			continue // a rejection by the others would start a box the state without the take lacks
		}
		t.Run(fmt.Sprintf("%s/%d_per_%dus_buckets%d", p.Kind, p.Rate, p.Period, p.Buckets), func(t *testing.T) {
			for trial := range 300 {
				history := randomOps(rng, &p, rng.IntN(12))
				orig, now := replay(&p, epochUs, history)
				took, _ := replay(&p, epochUs, history)
				now += rng.Int64N(p.MaxWait/2 + 1)
				d := algorithm.Take(&p, &took, now, 1+rng.Int64N(p.MaxCost()), algorithm.Mode(rng.IntN(2)))
				if !d.Allowed {
					continue
				}
				id := fmt.Sprintf("lease-%d", trial)
				algorithm.SetLeaseID(&took, id)
				at := now
				for i, o := range randomOps(rng, &p, 1+rng.IntN(4)) {
					o.dt = min(o.dt, p.Period/4) // the refund comes within the take's window
					at += o.dt
					b := algorithm.Take(&p, &took, at, max(o.n, 1), o.mode)
					if !b.Allowed {
						algorithm.Take(&p, &orig, at, 0, algorithm.Exact) // expire alike
						continue
					}
					if a := algorithm.Take(&p, &orig, at, b.Granted, algorithm.Exact); !a.Allowed {
						t.Fatalf("trial %d step %d: the state without the take refused what the one with it granted: %+v", trial, i, a)
					}
				}
				// A refund that finds nothing to give back (the take's window
				// or events are gone) must leave states that agree all the same.
				if algorithm.Refund(&p, &took, now, at, d.Granted, id) {
					refunds++
				}
				for i, o := range randomOps(rng, &p, 8) {
					at += o.dt
					a := algorithm.Take(&p, &orig, at, o.n, o.mode)
					b := algorithm.Take(&p, &took, at, o.n, o.mode)
					if a != b {
						t.Fatalf("trial %d: took %d at +%dµs, refunded after others; step %d (n=%d, mode %d):\nwithout the take %+v\nrefunded         %+v",
							trial, d.Granted, now-epochUs, i, o.n, o.mode, a, b)
					}
				}
			}
		})
	}
	if refunds < 1000 {
		t.Fatalf("only %d refunds ran", refunds)
	}
}
