package algorithm_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// eventLog is the sliding log as it was specified before entries carried
// weights: one timestamp per admitted event, the newest Rate kept. The
// weighted Log must decide exactly as it does.
type eventLog struct{ ts []int64 }

func (e *eventLog) take(p *algorithm.Params, now, n int64, mode algorithm.Mode) algorithm.Outcome {
	cost := n
	if n == 0 {
		cost, mode = 1, algorithm.Exact
	}
	for len(e.ts) > 0 && e.ts[0]+p.Period <= now {
		e.ts = e.ts[1:]
	}
	d := algorithm.Outcome{Limit: p.Cap}
	count := min(int64(len(e.ts)), p.Rate)
	g := int64(0)
	switch {
	case p.Rate-count >= cost:
		g = cost
	case mode == algorithm.AtMost && p.Rate-count > 0:
		g = p.Rate - count
	}
	if g == 0 {
		k := count + cost - p.Rate
		d.RetryAfter = e.ts[int64(len(e.ts))-count+k-1] + p.Period - now
	} else if n > 0 {
		for range g {
			e.ts = append(e.ts, now)
		}
		if int64(len(e.ts)) > p.Rate {
			e.ts = e.ts[int64(len(e.ts))-p.Rate:]
		}
		count += g
	}
	d.Allowed = g > 0 // a peek reports whether one event would be admitted
	if n == 0 {
		g = 0
	}
	d.Granted, d.Remaining = g, p.Rate-count
	if len(e.ts) > 0 {
		d.ResetAfter = e.ts[len(e.ts)-1] + p.Period - now
	}
	d.TTL = d.ResetAfter
	return d
}

// TestSlidingLogWeighted checks that the weighted log decides exactly as a
// log of one timestamp per event, over random costs, partial grants, peeks,
// several calls in one microsecond and lowered limits on live state.
func TestSlidingLogWeighted(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 12))
	for run := range 200 {
		rate := 1 + rng.Int64N(60)
		period := time.Duration(1+rng.Int64N(5000)) * time.Microsecond
		var s algorithm.State
		var ref eventLog
		now := int64(1_893_456_000_000_000)
		for step := range 400 {
			if rng.IntN(40) == 0 { // a lowered (or raised) limit on live state
				rate = 1 + rng.Int64N(60)
			}
			p, err := weir.Limit{Algorithm: weir.SlidingLog, Rate: rate, Period: period}.Compile()
			if err != nil {
				t.Fatal(err)
			}
			if rng.IntN(3) > 0 {
				now += rng.Int64N(int64(period/time.Microsecond)/4 + 1)
			}
			n := rng.Int64N(rate + 1)
			mode := algorithm.Exact
			if rng.IntN(4) == 0 {
				mode = algorithm.AtMost
			}
			want := ref.take(&p, now, n, mode)
			got := algorithm.Take(&p, &s, now, n, mode)
			if got != want {
				t.Fatalf("run %d step %d: rate %d period %v now %d n %d mode %d:\n got  %+v\n want %+v", run, step, rate, period, now, n, mode, got, want)
			}
			if s.Log.Events() != int64(len(ref.ts)) {
				t.Fatalf("run %d step %d: %d events held, want %d", run, step, s.Log.Events(), len(ref.ts))
			}
		}
	}
}

// TestSlidingLogEntryPerCall checks that a call of cost n adds one entry,
// not n: 20 calls of 50000 under 1000000/h hold 20 entries.
func TestSlidingLogEntryPerCall(t *testing.T) {
	p, err := weir.Limit{Algorithm: weir.SlidingLog, Rate: 1_000_000, Period: time.Hour}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var s algorithm.State
	now := int64(1_893_456_000_000_000)
	for i := range 20 {
		if d := algorithm.Take(&p, &s, now+int64(i), 50_000, algorithm.Exact); !d.Allowed {
			t.Fatalf("call %d rejected: %+v", i, d)
		}
	}
	if s.Log.Len() != 20 || s.Log.Cap() > 32 || s.Log.Events() != 1_000_000 {
		t.Fatalf("log holds %d entries in a buffer of %d for %d events; want 20 entries, at most 32", s.Log.Len(), s.Log.Cap(), s.Log.Events())
	}
	// The millionth-and-first event waits for the oldest call to leave.
	d := algorithm.Take(&p, &s, now+100, 1, algorithm.Exact)
	if want := int64(time.Hour/time.Microsecond) - 100; d.Allowed || d.RetryAfter != want {
		t.Fatalf("got %+v, want a rejection with RetryAfter %dµs", d, want)
	}
	// One of cost 50001 waits for the second call too.
	d = algorithm.Take(&p, &s, now+100, 50_001, algorithm.Exact)
	if want := int64(time.Hour/time.Microsecond) - 99; d.Allowed || d.RetryAfter != want {
		t.Fatalf("got %+v, want a rejection with RetryAfter %dµs", d, want)
	}
}

// TestConcurrencyHeld checks the running total of lease weights against
// expiry and release.
func TestConcurrencyHeld(t *testing.T) {
	p, err := weir.Limit{Algorithm: weir.Concurrency, Rate: 1_000_000, Period: time.Second}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	var s algorithm.State
	now := int64(1_893_456_000_000_000)
	algorithm.Take(&p, &s, now, 600_000, algorithm.Exact)
	algorithm.SetLeaseID(&s, "a")
	algorithm.Take(&p, &s, now+10, 300_000, algorithm.Exact)
	algorithm.SetLeaseID(&s, "b")
	if d := algorithm.Take(&p, &s, now+20, 200_000, algorithm.Exact); d.Allowed || d.RetryAfter != 1_000_000-20 || d.Remaining != 100_000 {
		t.Fatalf("got %+v", d)
	}
	algorithm.Release(&s, "a")
	if d := algorithm.Take(&p, &s, now+30, 0, algorithm.Exact); d.Remaining != 700_000 {
		t.Fatalf("after releasing a: %+v", d)
	}
	if d := algorithm.Take(&p, &s, now+1_000_010, 0, algorithm.Exact); d.Remaining != 1_000_000 || s.Held != 0 || len(s.Leases) != 0 {
		t.Fatalf("after b expired: %+v, held %d, %d leases", d, s.Held, len(s.Leases))
	}
}
