package policy

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/guard"
)

// TestTimeout: a store that hangs is cut off at the deadline, counts as a
// failure, and the rule falls back.
func TestTimeout(t *testing.T) {
	store := newFakeStore(nil)
	store.Block.Store(true)
	cfg, _ := Parse([]byte("store: {timeout: 20ms, on_error: allow}\nrules:\n  - {name: r, limit: 1/m}\n"), "t.yaml")
	p, err := New(cfg, store, WithLogger(slog.New(&countingHandler{})))
	if err != nil {
		t.Fatal(err)
	}
	v := p.Check(ctx, req("GET", "/"))
	if !v.Allowed || !errors.Is(v.Results[0].Err, context.DeadlineExceeded) || v.Results[0].Fallback != "allow" || !store.SawDeadline.Load() {
		t.Fatalf("%+v", v.Results[0])
	}
	if p.Guard().Failures() != 1 {
		t.Fatalf("%d failures", p.Guard().Failures())
	}
}

// TestOnError covers the three failure policies and the breaker in a
// policy: the fallback applies while the store is down, the breaker stops
// store calls, and recovery is automatic.
func TestOnError(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	p := mustPolicy(t, `
store:
  on_error: allow
  breaker: {failures: 2, cooldown: 10s}
instances: 2
rules:
  - {name: open, match: {path: /open}, identity: const:x, limit: 1/h, algorithm: fixed_window}
  - {name: closed, match: {path: /closed}, identity: const:x, limit: 1/h, algorithm: fixed_window, on_error: deny}
  - {name: local, match: {path: /local}, identity: const:x, limit: 5/h, algorithm: fixed_window, on_error: local}
  - {name: both, match: {path: /both}, identity: const:y, limit: 5/h, algorithm: fixed_window, on_error: local}
  - {name: both-deny, match: {path: /both}, identity: const:y, limit: 5/h, algorithm: fixed_window, on_error: deny}
`, store, WithClock(clock.Now), WithLogger(slog.New(&countingHandler{})))
	store.Down.Store(true)

	for i := 0; i < 3; i++ {
		v := p.Check(ctx, req("GET", "/open"))
		if !v.Allowed || v.Results[0].Fallback != "allow" || v.Results[0].Err == nil {
			t.Fatalf("allow: %+v", v.Results[0])
		}
	}
	if p.Guard().State() != guard.BreakerOpen {
		t.Fatal("the breaker did not open")
	}
	calls := store.Calls.Load()

	v := p.Check(ctx, req("GET", "/closed"))
	if rr := v.Results[0]; v.Allowed || rr.Fallback != "deny" || rr.Result.RetryAfter < time.Second || !errors.Is(rr.Err, guard.ErrCircuitOpen) {
		t.Fatalf("deny: %+v", v)
	}
	// local: 5/h over 2 instances is 3 each (rounded up).
	admitted := 0
	for i := 0; i < 10; i++ {
		v := p.Check(ctx, req("GET", "/local"))
		if v.Results[0].Fallback != "local" || v.Results[0].Result.Limit != 3 {
			t.Fatalf("local: %+v", v.Results[0])
		}
		if v.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("local fallback admitted %d, want 3", admitted)
	}
	// A deny rule rejects; the local rule beside it consumes nothing.
	for i := 0; i < 4; i++ {
		if v := p.Check(ctx, req("GET", "/both")); v.Allowed {
			t.Fatal("admitted despite on_error: deny")
		}
	}
	if r, _ := p.Guard().Local().Take(ctx, weir.Key("both", "y"), weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: time.Hour}, 0); r.Remaining != 3 {
		t.Fatalf("the local rule consumed %d beside a deny", 3-r.Remaining)
	}
	if store.Calls.Load() != calls {
		t.Fatal("the open breaker let calls through")
	}

	// Recovery: after the cooldown the probe succeeds and the store decides again.
	store.Down.Store(false)
	clock.Advance(10 * time.Second)
	v = p.Check(ctx, req("GET", "/open"))
	if !v.Allowed || v.Results[0].Err != nil || v.Results[0].Fallback != "" {
		t.Fatalf("after recovery: %+v", v.Results[0])
	}
	if p.Guard().State() != guard.BreakerClosed {
		t.Fatal("the breaker did not close")
	}
	if v := p.Check(ctx, req("GET", "/open")); v.Allowed {
		t.Fatal("the store's own limit does not apply after recovery")
	}
}

// TestCheckKeyFallback: CheckKey follows on_error too.
func TestCheckKeyFallback(t *testing.T) {
	store := newFakeStore(nil)
	store.Down.Store(true)
	p := mustPolicy(t, `
instances: 3
rules:
  - {name: l, limit: 6/h, algorithm: sliding_log}
  - {name: d, limit: 6/h, on_error: deny}
`, store, WithLogger(slog.New(&countingHandler{})))
	rr, err := p.CheckKey(ctx, KeyRequest{Rule: "l", Key: "k", N: 2})
	if err != nil || !rr.Result.Allowed || rr.Fallback != "local" || rr.Result.Remaining != 0 {
		t.Fatalf("local: %+v %v", rr, err)
	}
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "l", Key: "k", N: 1}); rr.Result.Allowed {
		t.Fatal("local: over the instance's share")
	}
	if rr, _ := p.CheckKey(ctx, KeyRequest{Rule: "d", Key: "k", N: 1}); rr.Result.Allowed || rr.Fallback != "deny" {
		t.Fatalf("deny: %+v", rr)
	}
}
