package algorithm_test

import (
	"math"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// farTimes are instants far outside any real clock: the ends of int64,
// what a float such as -1e20 or NaN seconds converts to, and the edges of
// the range calendar arithmetic is exact in.
var farTimes = []int64{
	math.MinInt64, math.MinInt64 + 1, -1 << 62, -1<<62 - 1, -1e15, -1,
	0, 253402300799999999, 1 << 62, 1<<62 + 1, math.MaxInt64 - 1, math.MaxInt64,
}

// A calendar window at a far-future or far-past instant never loops or
// panics: its bounds come out in order, and hold the instant whenever it
// is within the range calendar arithmetic is exact in.
func TestCalendarFarTimes(t *testing.T) {
	zones := []string{"UTC", "Asia/Shanghai", "America/New_York", "Pacific/Apia", "Australia/Lord_Howe"}
	for _, unit := range []algorithm.CalendarUnit{algorithm.CalendarDay, algorithm.CalendarWeek, algorithm.CalendarMonth} {
		for _, loc := range zones {
			for _, resetAt := range []time.Duration{0, 2 * time.Hour, 23*time.Hour + 59*time.Minute} {
				l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Calendar: unit, Timezone: loc, ResetAt: resetAt}
				p, err := l.Compile()
				if err != nil {
					t.Fatal(err)
				}
				for _, now := range farTimes {
					b := algorithm.CalendarBounds(&p, now)
					if !(b[0] < b[1] && b[1] < b[2] && b[2] < b[3]) {
						t.Fatalf("%s in %s, reset at %s, at %d: bounds %v out of order", unit, loc, resetAt, now, b)
					}
					if now >= -1<<62 && now <= 1<<62 && !(b[1] <= now && now < b[2]) {
						t.Fatalf("%s in %s, reset at %s, at %d: bounds %v do not hold it", unit, loc, resetAt, now, b)
					}
					var s algorithm.State
					for i := 0; i < 4; i++ {
						d := algorithm.Take(&p, &s, now, 1, algorithm.Exact)
						if d.Allowed != (i < 3) {
							t.Fatalf("%s in %s at %d: take %d allowed %v", unit, loc, now, i+1, d.Allowed)
						}
					}
				}
			}
		}
	}
}

// A bucketed sliding window at an instant before the epoch never panics,
// and still limits: such instants count as the epoch.
func TestBucketsBeforeEpoch(t *testing.T) {
	p, err := weir.Limit{Algorithm: weir.SlidingWindow, Rate: 5, Period: time.Minute, Buckets: 4}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	for _, now := range farTimes {
		var s algorithm.State
		allowed := 0
		for i := 0; i < 8; i++ {
			d := algorithm.Take(&p, &s, now, 1, algorithm.Exact)
			if d.Allowed {
				allowed++
			} else if now <= 1<<62 && d.RetryAfter <= 0 {
				t.Fatalf("at %d: refused with RetryAfter %d", now, d.RetryAfter)
			}
		}
		algorithm.Refund(&p, &s, now, now, 1, "")
		algorithm.Take(&p, &s, now, 1, algorithm.Exact)
		algorithm.DebitTake(&p, &s, now, 3)
		algorithm.CreditTake(&p, &s, now, 2)
		if allowed != 5 {
			t.Fatalf("at %d: %d of 8 allowed, want 5", now, allowed)
		}
	}
}
