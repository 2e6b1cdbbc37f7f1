package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// TestDebtExtremesSame: the largest debits, on limits at the edges of what
// Compile accepts, saturate alike in Lua and in Go: both stores give the
// same Results to the microsecond (the Lua's doubles stay exact).
func TestDebtExtremesSame(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("dx%d", prefixSeq.Add(1))})
	lims := [2]*weir.Limiter{weir.NewLimiter(rs), weir.NewLimiter(memstore.New(memstore.WithClock(clock.Now)))}
	year := 366 * 24 * time.Hour
	ctx := context.Background()
	for i, l := range []weir.Limit{
		{Algorithm: weir.TokenBucket, Rate: 1_000_000_000, Period: time.Second},
		{Algorithm: weir.TokenBucket, Rate: 1, Period: 10 * year},
		{Algorithm: weir.GCRA, Rate: 7, Period: 3_000_001 * time.Microsecond, Burst: 1_000_000},
		{Algorithm: weir.GCRA, Rate: 1_000_000_007, Period: time.Second, Burst: 3},
		{Algorithm: weir.LeakyBucket, Rate: 3, Period: 10 * time.Second, Block: time.Hour},
		{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Microsecond},
		{Algorithm: weir.FixedWindow, Rate: 999_983, Period: 24 * time.Hour},
		{Algorithm: weir.SlidingWindow, Rate: 1000, Period: 7 * time.Second},
		{Algorithm: weir.SlidingWindow, Rate: 999_983, Period: 24 * time.Hour, Buckets: 24},
		{Algorithm: weir.SlidingLog, Rate: 1000, Period: time.Hour},
	} {
		key := fmt.Sprintf("x%d", i)
		step := func(what string, f func(*weir.Limiter) (weir.Result, error)) {
			t.Helper()
			var r [2]weir.Result
			var e [2]error
			for j, lim := range lims {
				r[j], e[j] = f(lim)
			}
			if e[0] != nil || e[1] != nil || r[0] != r[1] {
				t.Fatalf("%v %s:\n redisstore %+v %v\n memstore   %+v %v", l, what, r[0], e[0], r[1], e[1])
			}
		}
		for range 2 {
			step("Debit(MaxDebt)", func(lim *weir.Limiter) (weir.Result, error) { return lim.Debit(ctx, key, l, algorithm.MaxDebt) })
		}
		clock.Advance(l.Period / 3)
		step("Peek", func(lim *weir.Limiter) (weir.Result, error) { return lim.Peek(ctx, key, l) })
		step("Refund(MaxDebt/3)", func(lim *weir.Limiter) (weir.Result, error) { return lim.Refund(ctx, key, l, algorithm.MaxDebt/3) })
		step("Debit(12345)", func(lim *weir.Limiter) (weir.Result, error) { return lim.Debit(ctx, key, l, 12345) })
	}
}

// TestDebtRateStored: a window in debt keeps the rate its debt is paid
// back at (":d<rate>" on a fixed window's string, the sliding window's
// "d" field), and a state written by a version that kept none (a bare
// ":d", d = "1") still decides as memstore's does under its own limit.
func TestDebtRateStored(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	for _, a := range []weir.Algorithm{weir.FixedWindow, weir.SlidingWindow} {
		clock := storetest.NewClock(storetest.Epoch)
		rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("dr%d", prefixSeq.Add(1))})
		lims := [2]*weir.Limiter{weir.NewLimiter(rs), weir.NewLimiter(memstore.New(memstore.WithClock(clock.Now)))}
		l := weir.Limit{Algorithm: a, Rate: 4, Period: time.Minute}
		for _, lim := range lims {
			if _, err := lim.Debit(ctx, "k", l, 10); err != nil {
				t.Fatal(err)
			}
		}
		kind, _ := a.Kind()
		name := rs.names("k", stateAlgo(kind, l)).state
		c := rs.Client()
		if a == weir.FixedWindow {
			v, err := c.Do(ctx, c.B().Get().Key(name).Build()).ToString()
			if err != nil || !strings.HasSuffix(v, ":10:d4") {
				t.Fatalf("fixed_window state after Debit(10) of 4/min: %q %v, want …:10:d4", v, err)
			}
			old := strings.TrimSuffix(v, "4")
			if err := c.Do(ctx, c.B().Set().Key(name).Value(old).Px(time.Hour).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		} else {
			v, err := c.Do(ctx, c.B().Hget().Key(name).Field("d").Build()).ToString()
			if err != nil || v != "4" {
				t.Fatalf("sliding_window field d after Debit(10) of 4/min: %q %v, want 4", v, err)
			}
			if err := c.Do(ctx, c.B().Hset().Key(name).FieldValue().FieldValue("d", "1").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		for _, at := range []time.Duration{time.Minute, 2 * time.Minute, 2*time.Minute + 45*time.Second, 3 * time.Minute} {
			clock.Set(storetest.Epoch.Add(at))
			var r [2]weir.Result
			for i, lim := range lims {
				var err error
				if r[i], err = lim.Peek(ctx, "k", l); err != nil {
					t.Fatal(err)
				}
			}
			if r[0] != r[1] || r[0].Allowed && at < 2*time.Minute {
				t.Fatalf("%s, old-format debt, peek at %v:\n redisstore %+v\n memstore   %+v", a, at, r[0], r[1])
			}
		}
	}
}

// TestStampIsRedisTime: with no test clock, a reservation is dated by
// Redis's own TIME (the clock every decision reads), not the client's.
func TestStampIsRedisTime(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Prefix: "stamp"})
	redisNow := func() int64 { return redisTime(t, srv) }
	lim := weir.NewLimiter(s)
	l := weir.PerMinute(weir.TokenBucket, 10)
	before := redisNow()
	rv, res, err := lim.Reserve(context.Background(), "k", l, 4)
	after := redisNow()
	if err != nil || rv == nil || rv.Stamp.At < before || rv.Stamp.At > after || rv.Stamp.Remaining != res.Remaining || rv.Stamp.Estimate != 4 {
		t.Fatalf("Reserve: %+v %+v %v; want a stamp within Redis TIME %d..%d", rv, res, err, before, after)
	}
	if res, err := rv.Settle(context.Background(), 1); err != nil || res.Remaining != 9 {
		t.Fatalf("an immediate settle of 1 of 4: %+v %v, want 9 remaining", res, err)
	}
}
