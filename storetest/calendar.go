package storetest

import (
	"time"
	_ "time/tzdata" // the calendar tests' zones, whatever the machine has

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// calendar checks calendar windows (a fixed window per day, week or month
// in a time zone, from a time of day): months of their real length, days
// of 23 and 25 hours at daylight-saving changes, and ResetAfter and
// RetryAfter exact to the boundary.
func (t *tester) calendar() {
	type check struct {
		what    string
		at      time.Time // the clock
		n       int64
		allowed bool
		left    int64
		reset   time.Duration // ResetAfter, and RetryAfter when rejected
	}
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		name   string
		limit  weir.Limit
		checks []check
	}{
		{"month end", weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Calendar: algorithm.CalendarMonth}, []check{
			{"the last minute of January", utc("2030-01-31T23:59:00Z"), 3, true, 0, time.Minute},
			{"January is spent", utc("2030-01-31T23:59:59.999999Z"), 1, false, 0, time.Microsecond},
			{"February starts afresh, 28 days long", utc("2030-02-01T00:00:00Z"), 1, true, 2, 28 * 24 * time.Hour},
			{"the last hour of February", utc("2030-02-28T23:00:00Z"), 2, true, 0, time.Hour},
			{"still February", utc("2030-02-28T23:59:59Z"), 1, false, 0, time.Second},
			{"March, 31 days long", utc("2030-03-01T00:00:00Z"), 1, true, 2, 31 * 24 * time.Hour},
		}},
		{"month in a zone", weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Calendar: algorithm.CalendarMonth, Timezone: "Asia/Shanghai"}, []check{
			// April begins at 2030-03-31T16:00Z in Shanghai (UTC+8).
			{"April in Shanghai, March in UTC", utc("2030-03-31T16:00:00Z"), 2, true, 0, 30 * 24 * time.Hour},
			{"spent", utc("2030-04-30T15:59:59Z"), 1, false, 0, time.Second},
			{"May in Shanghai", utc("2030-04-30T16:00:00Z"), 1, true, 1, 31 * 24 * time.Hour},
		}},
		{"DST spring forward, 23h day", weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Calendar: algorithm.CalendarDay, Timezone: "America/New_York"}, []check{
			// 2030-03-10: clocks go from 02:00 EST to 03:00 EDT.
			{"local midnight (EST)", utc("2030-03-10T05:00:00Z"), 2, true, 0, 23 * time.Hour},
			{"spent until local midnight (EDT)", utc("2030-03-11T03:59:59Z"), 1, false, 0, time.Second},
			{"the next day", utc("2030-03-11T04:00:00Z"), 1, true, 1, 24 * time.Hour},
		}},
		{"DST fall back, 25h day, reset at 02:00", weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Calendar: algorithm.CalendarDay, Timezone: "America/New_York", ResetAt: 2 * time.Hour}, []check{
			// Clocks go back from 02:00 EDT to 01:00 EST on 2030-11-03, so
			// the day that starts 2030-11-02 02:00 EDT (06:00Z) ends
			// 2030-11-03 02:00 EST (07:00Z), 25 hours later.
			{"just before 02:00 EDT: the old day", utc("2030-11-02T05:59:59Z"), 2, true, 0, time.Second},
			{"02:00 EDT", utc("2030-11-02T06:00:00Z"), 2, true, 0, 25 * time.Hour},
			{"spent for 25 hours", utc("2030-11-03T06:59:59.5Z"), 1, false, 0, 500 * time.Millisecond},
			{"02:00 EST", utc("2030-11-03T07:00:00Z"), 1, true, 1, 24 * time.Hour},
		}},
		{"week from Monday", weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Calendar: algorithm.CalendarWeek, Timezone: "UTC", ResetAt: 90 * time.Minute}, []check{
			// 2030-01-01 is a Tuesday: the week began Monday 2029-12-31 01:30.
			{"Tuesday", utc("2030-01-01T00:00:00Z"), 1, true, 0, 6*24*time.Hour + 90*time.Minute},
			{"Monday before 01:30", utc("2030-01-07T01:29:59Z"), 1, false, 0, time.Second},
			{"Monday 01:30", utc("2030-01-07T01:30:00Z"), 1, true, 0, 7 * 24 * time.Hour},
		}},
	} {
		l := c.limit
		l.Period = 0 // the unit's nominal length
		key := c.name
		for _, ch := range c.checks {
			t.h.Clock.Set(ch.at)
			r := t.take(key, l, ch.n)
			if r.Allowed != ch.allowed || r.Remaining != ch.left || r.ResetAfter != ch.reset || (!r.Allowed && r.RetryAfter != ch.reset) {
				t.Fatalf("%s, %s: got allowed=%v remaining=%d retry=%v reset=%v; want allowed=%v remaining=%d reset (and retry if rejected) %v",
					c.name, ch.what, r.Allowed, r.Remaining, r.RetryAfter, r.ResetAfter, ch.allowed, ch.left, ch.reset)
			}
			if t.h.TTL != nil && r.Allowed {
				if ttl, ok := t.h.TTL(t.key(key), l); !ok || ttl < ch.reset-time.Second || ttl > ch.reset+t.h.TTLSlack {
					t.Fatalf("%s, %s: TTL %v, want the window's rest %v", c.name, ch.what, ttl, ch.reset)
				}
			}
		}
	}
}
