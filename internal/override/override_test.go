package override

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

func TestApply(t *testing.T) {
	tb := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute, Block: time.Minute}
	l, err := Apply(tb, "20/m burst 30")
	if err != nil || l.Rate != 20 || l.Burst != 30 || l.Block != time.Minute || l.Algorithm != weir.TokenBucket {
		t.Fatalf("Apply = %+v, %v", l, err)
	}
	for _, c := range []struct {
		base weir.Limit
		spec string
		want string
	}{
		{tb, "7/m", "refill in the rule's units"},
		{tb, "3/s", "refill in the rule's units"},
		{weir.Limit{Algorithm: weir.SlidingLog, Rate: 10, Period: time.Minute}, "20/h", "period"},
		{tb, "nonsense", ""},
		{weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Minute}, "10/m burst 3", "burst"},
		{weir.Limit{Algorithm: weir.SlidingWindow, Rate: 10, Period: time.Minute, Buckets: 4}, "10/m buckets 6", "buckets"},
		{weir.Limit{Algorithm: weir.FixedWindow, Calendar: algorithm.CalendarMonth, Rate: 10}, "10/week", "window"},
	} {
		_, err := Apply(c.base, c.spec)
		var oe *Error
		if !errors.As(err, &oe) || oe.Field != "limit" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Apply(%v, %q) = %v; want a limit error containing %q", c.base, c.spec, err, c.want)
		}
	}
	// A bucket's period may change when its units do not: 10/m and 2/s
	// both refill in µs.
	for _, a := range []weir.Algorithm{weir.TokenBucket, weir.LeakyBucket, weir.GCRA, ""} {
		base := weir.Limit{Algorithm: a, Rate: 10, Period: time.Minute}
		if l, err := Apply(base, "2/s"); err != nil || l.Period != time.Second || l.Rate != 2 || !Compatible(base, l) || Shape(base) != Shape(l) {
			t.Fatalf("Apply(%v, 2/s) = %+v, %v", base, l, err)
		}
	}
	if l, err := Apply(weir.Limit{Algorithm: weir.FixedWindow, Calendar: algorithm.CalendarMonth, Rate: 10}, "5000/month"); err != nil || l.Rate != 5000 {
		t.Fatalf("calendar override: %+v, %v", l, err)
	}
}

func TestShapeIsCompatible(t *testing.T) {
	ls := []weir.Limit{
		{Algorithm: weir.GCRA, Rate: 1, Period: time.Second},
		{Algorithm: "", Rate: 5, Period: time.Second},
		{Algorithm: weir.GCRA, Rate: 1, Period: time.Minute},
		{Algorithm: weir.GCRA, Rate: 1, Period: time.Second, Warmup: time.Second},
		{Algorithm: weir.LeakyBucket, Rate: 1, Period: time.Second},
		{Algorithm: weir.LeakyBucket, Rate: 1, Period: time.Second, MaxDelay: time.Second},
		{Algorithm: weir.SlidingWindow, Rate: 4, Period: time.Second, Buckets: 2},
		{Algorithm: weir.SlidingWindow, Rate: 4, Period: time.Second},
		{Algorithm: weir.FixedWindow, Calendar: algorithm.CalendarMonth, Rate: 3},
		{Algorithm: weir.FixedWindow, Calendar: algorithm.CalendarMonth, Rate: 3, Timezone: "Asia/Shanghai"},
		{Algorithm: weir.FixedWindow, Calendar: algorithm.CalendarWeek, Rate: 3},
		{Algorithm: weir.GCRA, Rate: 2, Period: time.Second},                           // the units of 1/s and 1/m
		{Algorithm: weir.GCRA, Rate: 1_000_000_007, Period: time.Second, Burst: 3},     // other units
		{Algorithm: weir.GCRA, Rate: 1_000_000_007, Period: time.Second / 2, Burst: 6}, // the same as the line above
		{Algorithm: weir.TokenBucket, Rate: 7, Period: time.Minute},                    // 7/m: other units
		{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute},                   // 10/m
		{Algorithm: weir.TokenBucket, Rate: 2, Period: time.Second},                    // 2/s: the same units as 10/m
		{Algorithm: weir.SlidingLog, Rate: 2, Period: time.Second},                     // a window: its period counts
		{Algorithm: weir.SlidingLog, Rate: 2, Period: time.Minute},
	}
	if Compatible(ls[len(ls)-5], ls[len(ls)-4]) || !Compatible(ls[len(ls)-4], ls[len(ls)-3]) || !Compatible(ls[len(ls)-7], ls[len(ls)-6]) || Compatible(ls[len(ls)-8], ls[len(ls)-7]) {
		t.Fatal("a bucket's override must be compatible exactly when its units are the same")
	}
	for _, a := range ls {
		for _, b := range ls {
			if Compatible(a, b) != (Shape(a) == Shape(b)) {
				t.Errorf("%+v / %+v: Compatible %v, shapes %q %q", a, b, Compatible(a, b), Shape(a), Shape(b))
			}
		}
	}
}

func TestPatternsLongestFirst(t *testing.T) {
	now := time.Unix(100, 0)
	ps := Patterns{
		{Key: "r:acme-big-*", Limit: weir.Limit{Rate: 2}},
		{Key: "r:acme-*", Limit: weir.Limit{Rate: 1}},
		{Key: "r:old-*", Limit: weir.Limit{Rate: 3}, Until: now},
	}
	if o := ps.Match("r:acme-big-1", now); o == nil || o.Limit.Rate != 2 {
		t.Fatalf("Match = %+v", o)
	}
	if o := ps.Match("r:acme-1", now); o == nil || o.Limit.Rate != 1 {
		t.Fatalf("Match = %+v", o)
	}
	if o := ps.Match("r:old-1", now); o != nil {
		t.Fatalf("an expired pattern matched: %+v", o)
	}
}
