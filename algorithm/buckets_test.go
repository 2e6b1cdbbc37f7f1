package algorithm_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weir-dev/weir/algorithm"
)

// epochUs is a whole day in µs, so that every window and bucket below
// starts on it.
const epochUs = 1_893_456_000_000_000

// TestOneBucketIsThePlainWindow runs the bucketed sliding window with a
// single bucket (which Compile does not offer, but the math allows) beside
// the plain two-counter window: it must make every decision alike,
// RetryAfter and ResetAfter included, since one bucket is the plain
// window's previous and current windows.
func TestOneBucketIsThePlainWindow(t *testing.T) {
	for _, c := range []algorithm.Config{
		{Rate: 4, Period: 60_000_000},
		{Rate: 7, Period: 3_000_000},
		{Rate: 5, Period: 1_234_567},
		{Rate: 1000, Period: 7_000_000},
		{Rate: 3, Period: 10_000_000, Block: 4_000_000},
	} {
		c.Kind = algorithm.SlidingWindow
		plain, err := algorithm.Compile(c)
		if err != nil {
			t.Fatal(err)
		}
		one := plain
		one.Buckets = 1
		rng := rand.New(rand.NewPCG(uint64(c.Rate), uint64(c.Period)))
		var sp, so algorithm.State
		now := int64(epochUs)
		for i := 0; i < 20_000; i++ {
			switch r := rng.IntN(100); {
			case r < 90:
				now += rng.Int64N(2*c.Period/c.Rate + 1)
			case r < 97:
				now += rng.Int64N(3 * c.Period)
			}
			n := rng.Int64N(min(c.Rate, 4) + 1)
			mode := algorithm.Exact
			if rng.IntN(5) == 0 {
				mode = algorithm.AtMost
			}
			dp := algorithm.Take(&plain, &sp, now, n, mode)
			do := algorithm.Take(&one, &so, now, n, mode)
			if dp != do {
				t.Fatalf("%+v, step %d, t=%d, n=%d: plain %+v, one bucket %+v", c, i, now-epochUs, n, dp, do)
			}
		}
	}
}

// TestBucketsBoundTheExcess checks the bucketed window's error bound on
// random traffic: a trailing period ending at an admission never holds
// more than Rate plus the admissions of the one bucket it only partly
// covers (the plain window's bound is Rate plus a whole window).
func TestBucketsBoundTheExcess(t *testing.T) {
	for _, nb := range []int64{2, 3, 6, 60} {
		c := algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 50, Period: 60_000_000, Buckets: nb}
		p, err := algorithm.Compile(c)
		if err != nil {
			t.Fatal(err)
		}
		bt := c.Period / nb
		rng := rand.New(rand.NewPCG(uint64(nb), 7))
		var s algorithm.State
		var admitted []int64
		now := int64(epochUs)
		worst := int64(0)
		for i := 0; i < 50_000; i++ {
			now += int64(rng.ExpFloat64() * float64(c.Period) / (2 * float64(c.Rate)))
			if !algorithm.Take(&p, &s, now, 1, algorithm.Exact).Allowed {
				continue
			}
			admitted = append(admitted, now)
			var held, partial int64
			first := (now/bt - nb) * bt // the bucket the trailing period only partly covers
			for j := len(admitted) - 1; j >= 0 && admitted[j] >= first; j-- {
				if admitted[j] > now-c.Period {
					held++
				}
				if admitted[j] < first+bt {
					partial++
				}
			}
			if held > c.Rate+partial {
				t.Fatalf("%d buckets: %d admitted in the period ending at %d, over %d + %d in the partial bucket", nb, held, now-epochUs, c.Rate, partial)
			}
			worst = max(worst, held)
		}
		if worst <= c.Rate {
			t.Fatalf("%d buckets: the traffic never exceeded the limit (worst %d); the test proves nothing", nb, worst)
		}
	}
}

// TestBucketsCompile checks what Compile accepts for Buckets, and that
// each error names the bad value.
func TestBucketsCompile(t *testing.T) {
	for _, c := range []struct {
		cfg  algorithm.Config
		want string // "" for no error
	}{
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 100, Period: 60_000_000, Buckets: 6}, ""},
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 100, Period: 60_000_000, Buckets: 60}, ""},
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 100, Period: 60_000_000, Buckets: 1}, "buckets must be 2 to 60, got 1"},
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 100, Period: 60_000_000, Buckets: 61}, "buckets must be 2 to 60, got 61"},
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 100, Period: 60_000_000, Buckets: -2}, "got -2"},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 100, Period: 60_000_000, Buckets: 6}, "buckets apply to sliding_window, not gcra"},
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 5, Period: 1_234_567, Buckets: 10}, "a 1234567µs period does not split into 10 buckets"},
	} {
		p, err := algorithm.Compile(c.cfg)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: got %v, want an error containing %q", c.cfg, err, c.want)
		case c.want == "":
			if bt := c.cfg.Period / p.Tick; bt%c.cfg.Buckets != 0 {
				t.Errorf("%+v: tick %d does not divide a bucket", c.cfg, p.Tick)
			}
			if want := c.cfg.Period + c.cfg.Period/c.cfg.Buckets; p.MaxWait != want {
				t.Errorf("%+v: MaxWait %d, want %d", c.cfg, p.MaxWait, want)
			}
		}
	}
}

// TestBucketsAllocFree checks that a bucketed window allocates its ring
// once per key and nothing per decision after that.
func TestBucketsAllocFree(t *testing.T) {
	p, err := algorithm.Compile(algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 1000, Period: 60_000_000, Buckets: 12})
	if err != nil {
		t.Fatal(err)
	}
	var s algorithm.State
	now := int64(epochUs)
	algorithm.Take(&p, &s, now, 1, algorithm.Exact)
	if a := testing.AllocsPerRun(1000, func() {
		now += 7_000_000
		algorithm.Take(&p, &s, now, 1, algorithm.Exact)
		algorithm.Take(&p, &s, now, 1000, algorithm.AtMost)
	}); a != 0 {
		t.Fatalf("%v allocations per decision", a)
	}
}
