package storetest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/override"
)

// RunOverrides checks a store's per-key limit overrides (the stores'
// SetOverride): under every algorithm an override changes the limit and
// keeps the count, expires by the store's clock, gives way when deleted,
// carries the penalty box, applies to a pattern's keys, refuses bad input
// storing nothing, and logs every change. The harness's store must
// implement override.Store and have a clock.
func RunOverrides(t *testing.T, newHarness func(t *testing.T) Harness) {
	for _, a := range weir.Algorithms() {
		t.Run(string(a), func(t *testing.T) {
			h := newHarness(t)
			os, ok := h.Store.(override.Store)
			if !ok || h.Clock == nil {
				t.Fatalf("%T keeps no overrides or has no clock", h.Store)
			}
			overrideCarries(t, h, os, a)
		})
	}
	for _, a := range []weir.Algorithm{weir.TokenBucket, weir.LeakyBucket, weir.GCRA} {
		t.Run("Units/"+string(a), func(t *testing.T) { overrideUnits(t, newHarness(t), a) })
	}
	t.Run("Expiry", func(t *testing.T) { overrideExpiry(t, newHarness(t)) })
	t.Run("Calendar", func(t *testing.T) { overrideCalendar(t, newHarness(t)) })
	t.Run("PenaltyBox", func(t *testing.T) { overrideBox(t, newHarness(t)) })
	t.Run("Pattern", func(t *testing.T) { overridePattern(t, newHarness(t)) })
	t.Run("BadInput", func(t *testing.T) { overrideBadInput(t, newHarness(t)) })
	t.Run("Log", func(t *testing.T) { overrideLog(t, newHarness(t)) })
	t.Run("Concurrent", func(t *testing.T) { overrideConcurrent(t, newHarness(t)) })
	t.Run("ConcurrentLowered", func(t *testing.T) { overrideLowered(t, newHarness(t)) })
}

// admitted takes 1 from key under l until a rejection and returns how
// many were admitted (at most 1000).
func admitted(t *testing.T, s weir.Store, key string, l weir.Limit) int {
	t.Helper()
	for i := range 1000 {
		r, err := s.Take(context.Background(), key, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Allowed {
			return i
		}
	}
	return 1000
}

func set(t *testing.T, s override.Store, key string, base weir.Limit, spec string, until time.Time) {
	t.Helper()
	l, err := override.Apply(base, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetOverride(context.Background(), override.Override{Key: key, Limit: l, Until: until, Note: "test"}); err != nil {
		t.Fatal(err)
	}
}

// overrideCarries: 10 per minute, all taken; raised to 20, the windows,
// the log and concurrency admit exactly 10 more at once, the buckets
// none at once (their refill time carries) and then one per new
// interval; lowered to 5, nothing until the count falls under it.
func overrideCarries(t *testing.T, h Harness, s override.Store, a weir.Algorithm) {
	base := weir.Limit{Algorithm: a, Rate: 10, Period: time.Minute}
	key := weir.Key(t.Name(), "tenant")
	if n := admitted(t, s, key, base); n != 10 {
		t.Fatalf("base limit admitted %d, want 10", n)
	}
	set(t, s, key, base, "20/m", time.Time{})
	n := admitted(t, s, key, base)
	bucket := a == weir.TokenBucket || a == weir.LeakyBucket || a == weir.GCRA || a == ""
	if bucket {
		if n != 0 {
			t.Fatalf("raised to 20/m, an empty bucket admitted %d at once, want 0", n)
		}
		h.Clock.Advance(3 * time.Second) // one interval of 20/m
		if n := admitted(t, s, key, base); n != 1 {
			t.Fatalf("raised to 20/m, 3s later: %d admitted, want 1", n)
		}
	} else if n != 10 {
		t.Fatalf("raised to 20/m mid-window: %d more admitted, want 10", n)
	}
	// Lowered: nothing, whatever the algorithm.
	set(t, s, key, base, "5/m", time.Time{})
	if n := admitted(t, s, key, base); n != 0 {
		t.Fatalf("lowered to 5/m with the count over it: %d admitted", n)
	}
	// Deleted: the rule's limit again, and the count still over it.
	if ok, err := s.DeleteOverride(context.Background(), key); err != nil || !ok {
		t.Fatalf("DeleteOverride = %v, %v", ok, err)
	}
	if n := admitted(t, s, key, base); n != 0 {
		t.Fatalf("override deleted: %d admitted over the rule's limit", n)
	}
	// Another key under the same rule keeps the rule's limit.
	if n := admitted(t, s, weir.Key(t.Name(), "other"), base); n != 10 {
		t.Fatalf("a key without an override admitted %d, want 10", n)
	}
}

// takeN takes 1 from key under l n times, all of which must be admitted
// under the limit want.
func takeN(t *testing.T, s weir.Store, key string, l weir.Limit, n int, want int64) {
	t.Helper()
	for i := range n {
		r, err := s.Take(context.Background(), key, l, 1)
		if err != nil || !r.Allowed || r.Limit != want {
			t.Fatalf("take %d of %d: %+v, %v; want admitted under %d", i+1, n, r, err, want)
		}
	}
}

// overrideUnits: a bucket's override may change its period when its
// units stay (10/m and 2/s both refill in µs); the level carries as
// refill time (docs/algorithms.md, "Overrides"): the token bucket its
// free time, capped at the new bucket's span; the leaky bucket and GCRA
// their time to drain, read as a full bucket while it passes the new
// span.
func overrideUnits(t *testing.T, h Harness, a weir.Algorithm) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: a, Rate: 10, Period: time.Minute} // a span of 60 s
	key := weir.Key(t.Name(), "t")
	takeN(t, s, key, base, 10, 10) // empty: 60 s of refill to full
	// 2/s burst 120 keeps the span of 60 s: empty still, then one every 0.5 s.
	set(t, s, key, base, "2/s burst 120", time.Time{})
	if n := admitted(t, s, key, base); n != 0 {
		t.Fatalf("10/m emptied, now 2/s burst 120: %d admitted at once, want 0", n)
	}
	h.Clock.Advance(500 * time.Millisecond)
	takeN(t, s, key, base, 1, 120)
	if n := admitted(t, s, key, base); n != 0 {
		t.Fatalf("2/s burst 120, 0.5 s later: more than 1 admitted (%d more)", n)
	}
	// 2/s (burst 2: a span of 1 s).
	set(t, s, key, base, "2/s", time.Time{})
	h.Clock.Advance(500 * time.Millisecond)
	if a == weir.TokenBucket {
		// 0.5 s of refill carried: one token.
		takeN(t, s, key, base, 1, 2)
		if n := admitted(t, s, key, base); n != 0 {
			t.Fatalf("2/s with 0.5 s refilled: %d more admitted", n)
		}
	} else {
		// 59.5 s to drain, more than the span of 1 s: full until it is
		// under 0.5 s (at t0 + 60 s, 59 s from now).
		if n := admitted(t, s, key, base); n != 0 {
			t.Fatalf("2/s with 59.5 s to drain: %d admitted", n)
		}
		h.Clock.Advance(58*time.Second + 999*time.Millisecond)
		if n := admitted(t, s, key, base); n != 0 {
			t.Fatalf("2/s, 1 ms before the level is under the span: %d admitted", n)
		}
		h.Clock.Advance(time.Millisecond)
		takeN(t, s, key, base, 1, 2)
	}
	// Back to the rule: the time carries again.
	if ok, err := s.DeleteOverride(context.Background(), key); err != nil || !ok {
		t.Fatalf("DeleteOverride = %v, %v", ok, err)
	}
	if a == weir.TokenBucket {
		// Empty: 6 s to a token of 10/m.
		if n := admitted(t, s, key, base); n != 0 {
			t.Fatalf("back to 10/m, empty: %d admitted", n)
		}
		h.Clock.Advance(6 * time.Second)
		takeN(t, s, key, base, 1, 10)
	} else {
		// 1 s to drain (the last take's 0.5 s on 0.5 s left) of a span of
		// 60 s: 9 admitted at 6 s each.
		takeN(t, s, key, base, 9, 10)
	}
	if n := admitted(t, s, key, base); n != 0 {
		t.Fatalf("back to 10/m: %d more admitted", n)
	}
}

// overrideExpiry: an override until a time stops applying at it.
func overrideExpiry(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
	key := weir.Key(t.Name(), "t")
	set(t, s, key, base, "30/h", h.Clock.Now().Add(10*time.Minute))
	if n := admitted(t, s, key, base); n != 30 {
		t.Fatalf("under the override: %d admitted, want 30", n)
	}
	h.Clock.Advance(10 * time.Minute)
	if r, err := s.Take(context.Background(), key, base, 0); err != nil || r.Limit != 10 || r.Allowed {
		t.Fatalf("at the override's end: %+v, %v; want the rule's limit 10, count over it", r, err)
	}
}

// overrideBox: a penalty box started under the rule holds under a raise.
func overrideBox(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Hour, Block: 30 * time.Minute}
	key := weir.Key(t.Name(), "t")
	if n := admitted(t, s, key, base); n != 2 {
		t.Fatalf("admitted %d, want 2", n)
	}
	set(t, s, key, base, "100/h", time.Time{})
	if n := admitted(t, s, key, base); n != 0 {
		t.Fatalf("inside the penalty box, raised: %d admitted", n)
	}
	h.Clock.Advance(30 * time.Minute)
	if n := admitted(t, s, key, base); n != 98 {
		t.Fatalf("after the box: %d admitted, want 98", n)
	}
}

// overridePattern: a pattern covers the keys it prefixes; an exact
// override beats it; the longest pattern wins.
func overridePattern(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: weir.SlidingLog, Rate: 3, Period: time.Hour}
	rule := t.Name()
	set(t, s, weir.Key(rule, "acme-")+"*", base, "5/h", time.Time{})
	set(t, s, weir.Key(rule, "acme-big-")+"*", base, "7/h", time.Time{})
	set(t, s, weir.Key(rule, "acme-1"), base, "9/h", time.Time{})
	for id, want := range map[string]int{"acme-2": 5, "acme-big-1": 7, "acme-1": 9, "other": 3} {
		if n := admitted(t, s, weir.Key(rule, id), base); n != want {
			t.Errorf("%s: %d admitted, want %d", id, n, want)
		}
	}
	list, err := s.Overrides(context.Background(), weir.Key(rule))
	if err != nil || len(list) != 3 {
		t.Fatalf("Overrides = %d, %v; want 3", len(list), err)
	}
}

// overrideBadInput: each bad field is named and nothing is stored.
func overrideBadInput(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	good := weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: time.Hour}
	long := make([]byte, override.MaxNote+1)
	for i := range long {
		long[i] = 'x'
	}
	for _, c := range []struct {
		field string
		o     override.Override
	}{
		{"key", override.Override{Key: "", Limit: good}},
		{"key", override.Override{Key: "r:a*b*", Limit: good}},
		{"note", override.Override{Key: "r:a", Limit: good, Note: string(long)}},
		{"until", override.Override{Key: "r:a", Limit: good, Until: h.Clock.Now().Add(-time.Second)}},
		{"limit", override.Override{Key: "r:a", Limit: weir.Limit{Algorithm: weir.FixedWindow, Rate: -1, Period: time.Hour}}},
	} {
		err := s.SetOverride(context.Background(), c.o)
		var oe *override.Error
		if !errors.As(err, &oe) || oe.Field != c.field {
			t.Errorf("SetOverride(%+v) = %v; want an error naming %q", c.o, err, c.field)
		}
	}
	if list, err := s.Overrides(context.Background(), ""); err != nil || len(list) != 0 {
		t.Fatalf("after bad input the store holds %d overrides (%v)", len(list), err)
	}
	if log, _ := s.OverrideLog(context.Background(), 10); len(log) != 0 {
		t.Fatalf("bad input was logged: %+v", log)
	}
}

// overrideLog: every change, in order.
func overrideLog(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: weir.GCRA, Rate: 3, Period: time.Hour}
	key := weir.Key(t.Name(), "t")
	set(t, s, key, base, "4/h", time.Time{})
	set(t, s, key, base, "5/h", time.Time{})
	if _, err := s.DeleteOverride(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	log, err := s.OverrideLog(context.Background(), 10)
	if err != nil || len(log) != 3 {
		t.Fatalf("OverrideLog = %+v, %v; want 3 changes", log, err)
	}
	if log[0].Op != "set" || log[0].Override.Limit.Rate != 4 || log[1].Override.Limit.Rate != 5 || log[2].Op != "delete" || log[2].Override.Key != key {
		t.Fatalf("OverrideLog = %+v", log)
	}
}

// overrideConcurrent: 16 goroutines take from one key while the limit
// is raised from 50 to 80 in the middle of the window: exactly 80 are
// admitted in all, and none of the takes that began after the raise
// returned saw the old limit.
func overrideConcurrent(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: weir.FixedWindow, Rate: 50, Period: time.Hour}
	key := weir.Key(t.Name(), "t")
	var total, stale atomic.Int64
	var raised atomic.Bool
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				after := raised.Load()
				r, err := s.Take(context.Background(), key, base, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					total.Add(1)
				}
				if after && r.Limit != 80 {
					stale.Add(1)
				}
			}
		}()
	}
	set(t, s, key, base, "80/h", time.Time{})
	raised.Store(true)
	wg.Wait()
	if n := admitted(t, s, key, base); total.Load()+int64(n) != 80 {
		t.Fatalf("admitted %d during the race and %d after, want 80 in all", total.Load(), n)
	}
	if stale.Load() != 0 {
		t.Fatalf("%d decisions after the raise was acknowledged used the old limit", stale.Load())
	}
}

// overrideCalendar: a monthly quota raised mid-month counts the month's
// use, and the next month starts afresh under the override.
func overrideCalendar(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Calendar: algorithm.CalendarMonth, Timezone: "Europe/Paris"}
	key := weir.Key(t.Name(), "t")
	h.Clock.Set(time.Date(2030, 1, 10, 12, 0, 0, 0, time.UTC))
	if n := admitted(t, s, key, base); n != 3 {
		t.Fatalf("admitted %d, want 3", n)
	}
	set(t, s, key, base, "5/month", time.Time{})
	if n := admitted(t, s, key, base); n != 2 {
		t.Fatalf("raised to 5/month with 3 used: %d admitted, want 2", n)
	}
	h.Clock.Set(time.Date(2030, 2, 1, 0, 0, 0, 0, time.UTC)) // 01:00 in Paris: February
	if n := admitted(t, s, key, base); n != 5 {
		t.Fatalf("the next month: %d admitted, want 5", n)
	}
}

// overrideLowered: 16 goroutines take from one key while its limit is
// lowered from 80 to 30: no take that began after the change returned is
// admitted under the old limit, and the total never passes the larger of
// 30 and what was admitted before.
func overrideLowered(t *testing.T, h Harness) {
	s := h.Store.(override.Store)
	base := weir.Limit{Algorithm: weir.SlidingLog, Rate: 80, Period: time.Hour}
	key := weir.Key(t.Name(), "t")
	var before, after, stale, decided atomic.Int64
	var lowered atomic.Bool
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				late := lowered.Load()
				r, err := s.Take(context.Background(), key, base, 1)
				if err != nil {
					t.Error(err)
					return
				}
				decided.Add(1)
				switch {
				case !r.Allowed:
				case late:
					after.Add(1)
					if r.Limit != 30 {
						stale.Add(1)
					}
				default:
					before.Add(1)
				}
			}
		}()
	}
	for decided.Load() < 16 {
		time.Sleep(time.Millisecond)
	}
	set(t, s, key, base, "30/h", time.Time{})
	lowered.Store(true)
	wg.Wait()
	if stale.Load() != 0 {
		t.Fatalf("%d admissions after the change used the old limit", stale.Load())
	}
	if total := before.Load() + after.Load(); total > max(30, before.Load()) {
		t.Fatalf("admitted %d before the change and %d after: more than the lowered limit allows", before.Load(), after.Load())
	}
}
