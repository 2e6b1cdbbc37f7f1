package policy

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
)

// openGuard returns a guard over a store that validates requests before it
// sends them (as redisstore does), with the breaker opened by one failure.
func openGuard(t *testing.T) (*guard.Guard, *fakeStore, func(time.Duration)) {
	t.Helper()
	clock := newClock()
	store := newFakeStore(clock)
	store.Validate = true
	g := guard.New(store, guard.Config{Breaker: guard.BreakerConfig{Failures: 1, Cooldown: 5 * time.Second}, Now: clock.Now, Logger: slog.New(&countingHandler{})})
	store.Down.Store(true)
	if _, err := g.Take(ctx, "k", weir.PerMinute(weir.FixedWindow, 5), 1); !errors.Is(err, errDown) {
		t.Fatalf("the failing call: %v", err)
	}
	if g.State() != guard.BreakerOpen {
		t.Fatalf("after a failure: %v", g.State())
	}
	return g, store, clock.Advance
}

// TestInvalidRequestDoesNotCloseBreaker: a request the store refuses as
// invalid (hits over the limit, a bad limit) never reached the store, so
// as the half-open probe it must not close the breaker; the probe is left
// to the next valid call.
func TestInvalidRequestDoesNotCloseBreaker(t *testing.T) {
	l := weir.PerMinute(weir.FixedWindow, 5)
	bad := []struct {
		name string
		call func(g *guard.Guard) error
	}{
		{"Take over the limit", func(g *guard.Guard) error { _, err := g.Take(ctx, "k", l, 6); return err }},
		{"Take of a negative cost", func(g *guard.Guard) error { _, err := g.Take(ctx, "k", l, -1); return err }},
		{"Take under an invalid limit", func(g *guard.Guard) error {
			_, err := g.Take(ctx, "k", weir.Limit{Algorithm: "nope", Rate: 1, Period: time.Second}, 1)
			return err
		}},
		{"TakeAll over the limit", func(g *guard.Guard) error {
			var out [2]weir.Result
			return g.Do(ctx, []weir.Request{{Key: "a", Limit: l, N: 1}, {Key: "b", Limit: l, N: 9}}, out[:])
		}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			g, store, advance := openGuard(t)
			// Open: the request gets its own error, as when the store
			// answers, not the breaker's.
			if err := c.call(g); !errors.Is(err, weir.ErrInvalidCost) && !errors.Is(err, weir.ErrInvalidLimit) {
				t.Fatalf("while open: %v, want the validation error", err)
			}
			advance(5 * time.Second)
			calls := store.Calls.Load()
			if err := c.call(g); !errors.Is(err, weir.ErrInvalidCost) && !errors.Is(err, weir.ErrInvalidLimit) {
				t.Fatalf("half-open: %v, want the validation error", err)
			}
			if s := g.State(); s != guard.BreakerHalfOpen {
				t.Fatalf("after an invalid request in half-open: breaker %v, want half_open (the store is still down)", s)
			}
			// The next valid call is the probe: it reaches the store,
			// which is down, and the breaker opens again.
			if _, err := g.Take(ctx, "k", l, 1); !errors.Is(err, errDown) {
				t.Fatalf("the probe: %v, want the store's error", err)
			}
			if store.Calls.Load() != calls+1 || g.State() != guard.BreakerOpen {
				t.Fatalf("probe: %d store calls, breaker %v; want 1 and open", store.Calls.Load()-calls, g.State())
			}
			if g.Failures() != 2 {
				t.Fatalf("%d failures, want 2: validation errors are no failures", g.Failures())
			}
		})
	}
}

// TestInvalidCheckKeyDuringOutage: POST /v1/check with hits over the limit
// during an outage is a client error, as when the store answers, and
// leaves the breaker open; it is not a fallback decision.
func TestInvalidCheckKeyDuringOutage(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	store.Validate = true
	p := mustPolicy(t, `
store: {breaker: {failures: 1, cooldown: 5s}}
rules:
  - {name: r, limit: 3/m}
`, store, WithClock(clock.Now), WithLogger(slog.New(&countingHandler{})))
	store.Down.Store(true)
	if rr, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1}); err != nil || rr.Fallback != config.OnErrorLocal {
		t.Fatalf("outage: %+v %v", rr, err)
	}
	for _, advance := range []time.Duration{0, 5 * time.Second} {
		clock.Advance(advance)
		if _, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 4}); !errors.Is(err, weir.ErrInvalidCost) {
			t.Fatalf("hits over the limit after %v: %v, want ErrInvalidCost", advance, err)
		}
		if s := p.Guard().State(); s == guard.BreakerClosed {
			t.Fatalf("hits over the limit after %v closed the breaker over a dead store", advance)
		}
	}
	store.Down.Store(false)
	if rr, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 1}); err != nil || rr.Err != nil || p.Guard().State() != guard.BreakerClosed {
		t.Fatalf("the valid probe over a live store: %+v %v, breaker %v", rr, err, p.Guard().State())
	}
}

// TestInconclusiveProbeFreesTheSlot: a probe that was never sent
// (weir.ErrNotSent) or whose caller gave up proves nothing; the next call
// probes again.
func TestInconclusiveProbeFreesTheSlot(t *testing.T) {
	g, store, advance := openGuard(t)
	l := weir.PerMinute(weir.FixedWindow, 5)
	advance(5 * time.Second)
	store.NotSent.Store(true)
	for i := range 3 {
		if _, err := g.Take(ctx, "k", l, 1); !errors.Is(err, weir.ErrNotSent) {
			t.Fatalf("call %d: %v, want ErrNotSent (each call probes)", i, err)
		}
		if g.State() != guard.BreakerHalfOpen {
			t.Fatalf("after a probe never sent: %v, want half_open", g.State())
		}
	}
	store.NotSent.Store(false)
	store.Down.Store(false)
	if _, err := g.Take(ctx, "k", l, 1); err != nil || g.State() != guard.BreakerClosed {
		t.Fatalf("the next probe: %v, breaker %v", err, g.State())
	}
	if g.Failures() != 1 {
		t.Fatalf("%d failures; calls never sent are none", g.Failures())
	}
}

// TestFallbackOneAnswer: the same outage gives the same answer through
// Check, CheckKey and Guard.Fallback, the one fallback, for each on_error
// mode: Allowed, Limit, Remaining, RetryAfter (the rest of the breaker's
// cooldown), ResetAfter.
func TestFallbackOneAnswer(t *testing.T) {
	for _, mode := range []string{config.OnErrorAllow, config.OnErrorDeny, config.OnErrorLocal} {
		t.Run(mode, func(t *testing.T) {
			clock := newClock()
			store := newFakeStore(clock)
			p := mustPolicy(t, `
store: {on_error: `+mode+`, breaker: {failures: 1, cooldown: 30s}}
instances: 3
rules:
  - {name: r, identity: header:X-Key, limit: 7/m, algorithm: fixed_window}
`, store, WithClock(clock.Now), WithLogger(slog.New(&countingHandler{})))
			store.Down.Store(true)
			p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "opener", N: 1}) // opens the breaker
			clock.Advance(4 * time.Second)                              // 26s of cooldown left
			limit, _ := p.Limit("r", "")
			g := p.Guard()
			for i := range 4 {
				v := p.Check(ctx, req("GET", "/", "X-Key", "a"))
				ck, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "b", N: 1})
				if err != nil {
					t.Fatal(err)
				}
				var fb [1]weir.Result
				if err := g.Fallback(ctx, mode, []weir.Request{{Key: weir.Key("r", "c"), Limit: limit, N: 1}}, fb[:], 3); err != nil {
					t.Fatal(err)
				}
				chk := v.Results[0]
				if chk.Fallback != mode || ck.Fallback != mode || !errors.Is(chk.Err, guard.ErrCircuitOpen) || !errors.Is(ck.Err, guard.ErrCircuitOpen) {
					t.Fatalf("request %d: fallbacks %q %q, errors %v %v", i, chk.Fallback, ck.Fallback, chk.Err, ck.Err)
				}
				if chk.Result != ck.Result || ck.Result != fb[0] || v.Allowed != ck.Result.Allowed {
					t.Fatalf("request %d: Check %+v, CheckKey %+v, Fallback %+v: they differ", i, chk.Result, ck.Result, fb[0])
				}
				r := fb[0]
				switch mode {
				case config.OnErrorAllow:
					if !r.Allowed || r.Limit != 7 || r.Remaining != 7 || r.Granted != 1 {
						t.Fatalf("allow: %+v", r)
					}
				case config.OnErrorDeny:
					if r.Allowed || r.Limit != 7 || r.RetryAfter != 26*time.Second || r.ResetAfter != 26*time.Second {
						t.Fatalf("deny: %+v, want a retry after the 26s of cooldown left", r)
					}
				case config.OnErrorLocal:
					// 7/m over 3 instances: 3 each, rounded up.
					if r.Limit != 3 || r.Allowed != (i < 3) || r.Remaining != int64(max(2-i, 0)) {
						t.Fatalf("local, request %d: %+v", i, r)
					}
				}
			}
		})
	}
}

// TestFallbackLocalRefused: under on_error: local, a request the
// instance's share can never admit (more hits than its capacity, though
// within the whole limit's) is refused the way deny refuses, on every path.
func TestFallbackLocalRefused(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	p := mustPolicy(t, `
store: {breaker: {failures: 1, cooldown: 30s}}
instances: 3
rules:
  - {name: r, limit: 6/h, algorithm: sliding_log}
`, store, WithClock(clock.Now), WithLogger(slog.New(&countingHandler{})))
	store.Down.Store(true)
	p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "opener", N: 1})
	clock.Advance(10 * time.Second)
	rr, err := p.CheckKey(ctx, KeyRequest{Rule: "r", Key: "k", N: 3}) // the local share is 2
	if err != nil || rr.Fallback != config.OnErrorLocal {
		t.Fatalf("%+v %v", rr, err)
	}
	want := weir.Result{Limit: 2, RetryAfter: 20 * time.Second, ResetAfter: 20 * time.Second}
	if rr.Result != want {
		t.Fatalf("CheckKey: %+v, want %+v", rr.Result, want)
	}
	limit, _ := p.Limit("r", "")
	var out [1]weir.Result
	if err := p.Guard().Fallback(ctx, config.OnErrorLocal, []weir.Request{{Key: "x", Limit: limit, N: 3}}, out[:], 3); err != nil || out[0] != want {
		t.Fatalf("Fallback: %+v %v, want %+v", out[0], err, want)
	}
	if err := p.Guard().Fallback(ctx, "sometimes", []weir.Request{{Key: "x", Limit: limit, N: 1}}, out[:], 3); err == nil {
		t.Fatal("an unknown mode was accepted")
	}
}
