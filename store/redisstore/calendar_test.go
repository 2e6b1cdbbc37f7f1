package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// TestCalendarSameAsMemstore: calendar windows decide alike in both stores,
// to the microsecond, on random traffic (takes, debits past the limit,
// refunds) across a month end and across both daylight-saving changes of
// a year (the Lua picks the window by its clock
// among the bounds Go sends; memstore computes them itself).
func TestCalendarSameAsMemstore(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for i, c := range []struct {
		name  string
		start time.Time
		limit weir.Limit
		step  time.Duration // the typical advance
	}{
		{"month end UTC", at("2030-01-31T16:00:00Z"), weir.Limit{Rate: 15, Calendar: algorithm.CalendarMonth}, 15 * time.Minute},
		{"month end Shanghai reset 02:00", at("2030-04-30T10:00:00Z"), weir.Limit{Rate: 15, Calendar: algorithm.CalendarMonth, Timezone: "Asia/Shanghai", ResetAt: 2 * time.Hour}, 15 * time.Minute},
		{"spring forward New York", at("2030-03-09T20:00:00Z"), weir.Limit{Rate: 15, Calendar: algorithm.CalendarDay, Timezone: "America/New_York"}, 20 * time.Minute},
		{"fall back New York reset 01:30", at("2030-11-02T20:00:00Z"), weir.Limit{Rate: 15, Calendar: algorithm.CalendarDay, Timezone: "America/New_York", ResetAt: 90 * time.Minute}, 20 * time.Minute},
		{"week Berlin over DST", at("2030-03-28T00:00:00Z"), weir.Limit{Rate: 25, Calendar: algorithm.CalendarWeek, Timezone: "Europe/Berlin"}, 2 * time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.limit
			l.Algorithm = weir.FixedWindow
			clock := storetest.NewClock(c.start)
			rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("cal%d", i)})
			ms := memstore.New(memstore.WithClock(clock.Now))
			stores := [2]weir.Store{rs, ms}
			rng := rand.New(rand.NewPCG(uint64(i), 19))
			p, err := l.Compile()
			if err != nil {
				t.Fatal(err)
			}
			firstEnd := time.UnixMicro(algorithm.CalendarBounds(&p, c.start.UnixMicro())[2])
			rejectedBefore, admittedAfter := false, false
			for step := 0; step < 400; step++ {
				switch r := rng.IntN(100); {
				case r < 85:
					clock.Advance(time.Duration(rng.Int64N(int64(c.step))) + time.Duration(rng.IntN(3))*time.Microsecond)
				case r < 95:
					clock.Advance(0)
				default:
					clock.Advance(time.Duration(rng.Int64N(int64(6 * c.step))))
				}
				k := fmt.Sprintf("k%d", rng.IntN(2))
				var res [2]weir.Result
				var errs [2]error
				n := rng.Int64N(4)
				switch op := rng.IntN(10); {
				case op < 2:
					// Debts (a budget's settlement): a debit past the
					// limit lasts until its window ends, a refund.
					for j, s := range stores {
						f := weir.NewLimiter(s).Debit
						if op == 1 {
							f = weir.NewLimiter(s).Refund
						}
						res[j], errs[j] = f(ctx, k, l, 1+n*3)
					}
				case op < 4:
					for j, s := range stores {
						var out [1]weir.Result
						errs[j] = s.Do(ctx, []weir.Request{{Key: k, Limit: l, N: max(n, 1), Mode: weir.ModeAtMost}}, out[:])
						res[j] = out[0]
					}
				default:
					for j, s := range stores {
						res[j], errs[j] = s.Take(ctx, k, l, n)
					}
				}
				if errs[0] != nil || errs[1] != nil {
					t.Fatalf("step %d: errors %v, %v", step, errs[0], errs[1])
				}
				if res[0] != res[1] {
					t.Fatalf("step %d at %v, n=%d:\n redisstore %+v\n memstore   %+v", step, clock.Now(), n, res[0], res[1])
				}
				if clock.Now().Before(firstEnd) {
					rejectedBefore = rejectedBefore || !res[0].Allowed
				} else {
					admittedAfter = admittedAfter || res[0].Granted > 0
				}
			}
			if !rejectedBefore || !admittedAfter {
				t.Fatalf("the run must exhaust the first window (%v) and admit after its end %v (%v)", rejectedBefore, firstEnd, admittedAfter)
			}
		})
	}
}

// TestCalendarReadsRedisClock: the window is picked by Redis's own clock
// among the bounds sent; an instance clock a day behind still gets the
// right window, and one further off than the bounds reach is refused with
// an error that says so, never a wrong decision.
func TestCalendarReadsRedisClock(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "calclock"}) // Redis TIME
	day := weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Calendar: algorithm.CalendarDay, Timezone: "UTC"}
	rs.boundsClock = func() time.Time { return time.Now().Add(-25 * time.Hour) }
	before := time.Now()
	r, err := rs.Take(ctx, "k", day, 1)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	// Redis (on this machine) read its clock between before and after; its
	// day ends at the next UTC midnight. (The instance's would have ended a
	// day earlier.)
	midnight := before.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	if !r.Allowed || (after.Before(midnight) && (r.ResetAfter < midnight.Sub(after.Add(time.Microsecond)) || r.ResetAfter > midnight.Sub(before.Truncate(time.Microsecond)))) {
		t.Fatalf("got %+v, want ResetAfter to %v, the UTC midnight after Redis's clock", r, midnight)
	}
	rs.boundsClock = func() time.Time { return time.Now().Add(-4 * 24 * time.Hour) }
	weir.NewLimiter(rs).Reset(ctx, "other", day)
	if _, err := rs.Take(ctx, "other", day, 1); err == nil || !strings.Contains(err.Error(), "clocks disagree") {
		t.Fatalf("bounds four days off: %v, want the script to refuse", err)
	}
}
