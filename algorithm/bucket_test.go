package algorithm_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// TestLeakyBucketRebase: a leaky bucket's state means the same whenever it
// was last written. A level x at ts and the level it drains to by a later
// ts1, written at ts1 (what a Redis refund of a cross-slot batch writes),
// must decide alike at every later instant, under the limit and under a
// lowered burst. Capping the level at the burst before draining it broke
// this: a level above a lowered burst then drained from the burst as of
// its last write, so the older write drained further.
func TestLeakyBucketRebase(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 1))
	for _, l := range []weir.Limit{
		{Rate: 3, Period: 10 * time.Second, Burst: 4},
		{Rate: 3, Period: 10 * time.Second, Burst: 8, MaxDelay: 7 * time.Second},
		{Rate: 4, Period: time.Minute, Burst: 6, DelayAfter: 3, MaxDelay: time.Hour},
		{Rate: 1000, Period: 7 * time.Second, Burst: 9},
	} {
		l.Algorithm = weir.LeakyBucket
		lo := l
		lo.Burst = l.Burst / 2
		if lo.DelayAfter > lo.Burst {
			lo.DelayAfter = lo.Burst
		}
		p, err := l.Compile()
		if err != nil {
			t.Fatal(err)
		}
		var plo algorithm.Params
		if plo, err = lo.Compile(); err != nil {
			t.Fatal(err)
		}
		full := p.MaxWait
		for i := 0; i < 2000; i++ {
			t0 := int64(1_893_456_000_000_000)
			var s algorithm.State
			if d := algorithm.Take(&p, &s, t0, 1+rng.Int64N(p.Burst), algorithm.AtMost); !d.Allowed {
				t.Fatalf("%v: a take on an empty bucket: %+v", l, d)
			}
			t1 := t0 + rng.Int64N(full+1)
			// The same level, written at t1: what a refund writes.
			re := algorithm.State{Level: max(s.Level-(t1-t0)*p.B, 0), TS: t1}
			t2 := t1 + rng.Int64N(full+1)
			n := rng.Int64N(plo.Burst + 1)
			for _, q := range []*algorithm.Params{&p, &plo} {
				a, b := s, re
				da, db := algorithm.Check(q, &a, t2, n, algorithm.Exact), algorithm.Check(q, &b, t2, n, algorithm.Exact)
				if da != db {
					t.Fatalf("%v (burst %d) at +%dµs, n=%d: state {%d at 0} decides %+v; the same drained to +%dµs decides %+v",
						l, q.Burst, t2-t0, n, s.Level, da, t1-t0, db)
				}
			}
		}
	}
}

// TestLeakyBucketLoweredBurst: three events poured into a bucket that
// drains 0.3 per second leave 1.5 after five seconds. A burst lowered to 2
// then holds them all: half an event of room, so a request of one is
// rejected until the level drains to 1, 5/3 s later. GCRA, which the
// policing leaky bucket must match, says the same.
func TestLeakyBucketLoweredBurst(t *testing.T) {
	for _, a := range []weir.Algorithm{weir.LeakyBucket, weir.GCRA} {
		l := weir.Limit{Algorithm: a, Rate: 3, Period: 10 * time.Second, Burst: 4}
		lo := l
		lo.Burst = 2
		p, _ := l.Compile()
		plo, _ := lo.Compile()
		var s algorithm.State
		t0 := int64(1_893_456_000_000_000)
		if d := algorithm.Take(&p, &s, t0, 3, algorithm.Exact); !d.Allowed {
			t.Fatalf("%s: first take rejected: %+v", a, d)
		}
		d := algorithm.Take(&plo, &s, t0+5_000_000, 1, algorithm.Exact)
		if d.Allowed || d.Remaining != 0 || d.RetryAfter != 1_666_667 || d.ResetAfter != 5_000_000 {
			t.Fatalf("%s: after 5s under burst 2: %+v, want rejected, RetryAfter 1666667µs, ResetAfter 5s", a, d)
		}
	}
}
