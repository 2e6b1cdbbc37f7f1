package policy

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

func TestBreaker(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	var mu sync.Mutex
	var transitions []string
	g := NewGuard(store, GuardConfig{
		Timeout: time.Second,
		Breaker: BreakerConfig{Failures: 3, Cooldown: 5 * time.Second, FailureRatio: 2}, // ratio off
		Now:     clock.Now,
		Logger:  slog.New(&countingHandler{}),
		OnStateChange: func(from, to BreakerState) {
			mu.Lock()
			transitions = append(transitions, from.String()+"→"+to.String())
			mu.Unlock()
		},
	})
	l := weir.PerMinute(weir.GCRA, 100)
	take := func() error { _, err := g.Take(ctx, "k", l, 1); return err }

	if err := take(); err != nil || g.State() != BreakerClosed {
		t.Fatalf("healthy: %v %v", err, g.State())
	}
	store.down.Store(true)
	for i := 0; i < 3; i++ {
		if err := take(); !errors.Is(err, errDown) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if g.State() != BreakerOpen {
		t.Fatalf("after 3 failures: %v", g.State())
	}
	// Open: calls fail fast without touching the store.
	calls := store.calls.Load()
	for i := 0; i < 100; i++ {
		if err := take(); !errors.Is(err, ErrCircuitOpen) || !errors.Is(err, weir.ErrStore) {
			t.Fatalf("open: %v", err)
		}
	}
	if store.calls.Load() != calls || g.Rejected() != 100 {
		t.Fatalf("the open breaker touched the store: %d calls, %d rejected", store.calls.Load()-calls, g.Rejected())
	}
	// After the cooldown one probe goes through; it fails: open again.
	clock.Advance(5 * time.Second)
	if g.State() != BreakerHalfOpen {
		t.Fatalf("after the cooldown: %v", g.State())
	}
	if err := take(); !errors.Is(err, errDown) {
		t.Fatalf("probe: %v", err)
	}
	if err := take(); !errors.Is(err, ErrCircuitOpen) {
		t.Fatalf("after a failed probe: %v", err)
	}
	// The store recovers; the next probe closes the breaker.
	store.down.Store(false)
	clock.Advance(5 * time.Second)
	if err := take(); err != nil {
		t.Fatalf("probe: %v", err)
	}
	if g.State() != BreakerClosed {
		t.Fatalf("after a good probe: %v", g.State())
	}
	if err := take(); err != nil {
		t.Fatal(err)
	}
	want := []string{"closed→open", "open→half_open", "half_open→open", "open→half_open", "half_open→closed"}
	if !reflect.DeepEqual(transitions, want) {
		t.Fatalf("transitions %v, want %v", transitions, want)
	}
}

// TestBreakerOneProbe: while the half-open probe is in flight, other calls
// fail fast.
func TestBreakerOneProbe(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	g := NewGuard(store, GuardConfig{Timeout: 10 * time.Second, Breaker: BreakerConfig{Failures: 1, Cooldown: time.Second}, Now: clock.Now, Logger: slog.New(&countingHandler{})})
	l := weir.PerMinute(weir.GCRA, 100)
	store.down.Store(true)
	g.Take(ctx, "k", l, 1)
	if g.State() != BreakerOpen {
		t.Fatal("not open")
	}
	clock.Advance(time.Second)
	store.down.Store(false)
	store.block.Store(true) // the probe hangs until its context ends
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { _, err := g.Take(pctx, "k", l, 1); done <- err }()
	waitFor(t, 5*time.Second, "the probe to reach the store", func() bool { return store.calls.Load() == 2 })
	if _, err := g.Take(ctx, "k", l, 1); !errors.Is(err, ErrCircuitOpen) {
		t.Fatalf("a second call during the probe: %v", err)
	}
	cancel()
	<-done
	// A probe the caller cancelled proves nothing: it is not a success.
	if g.State() != BreakerHalfOpen {
		t.Fatalf("after a cancelled probe: %v, want half_open", g.State())
	}
	store.block.Store(false)
	if _, err := g.Take(ctx, "k", l, 1); err != nil || g.State() != BreakerClosed {
		t.Fatalf("the next probe: %v, %v", err, g.State())
	}
}

func TestBreakerRatio(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	g := NewGuard(store, GuardConfig{Timeout: time.Second, Breaker: BreakerConfig{Failures: 100, FailureRatio: 0.5, MinRequests: 10, Window: time.Minute}, Now: clock.Now, Logger: slog.New(&countingHandler{})})
	l := weir.PerMinute(weir.GCRA, 1000)
	for i := 0; i < 20; i++ {
		store.down.Store(i%2 == 1) // every other call fails: never 100 in a row
		g.Take(ctx, "k", l, 1)
		if i < 9 && g.State() != BreakerClosed {
			t.Fatalf("opened after %d calls", i+1)
		}
	}
	if g.State() != BreakerOpen {
		t.Fatal("half the calls failed, yet the breaker is closed")
	}
}

// TestNotFailures: bad requests and callers that give up do not count.
func TestNotFailures(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	g := NewGuard(store, GuardConfig{Timeout: time.Second, Breaker: BreakerConfig{Failures: 1}, Now: clock.Now})
	l := weir.PerMinute(weir.FixedWindow, 5)
	if _, err := g.Take(ctx, "k", l, 6); !errors.Is(err, weir.ErrInvalidCost) {
		t.Fatal(err)
	}
	if _, err := g.Take(ctx, "k", weir.Limit{Algorithm: "nope", Rate: 1, Period: time.Second}, 1); !errors.Is(err, weir.ErrInvalidLimit) {
		t.Fatal(err)
	}
	store.block.Store(true)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.Take(cctx, "k", l, 1); err == nil {
		t.Fatal("no error")
	}
	if g.State() != BreakerClosed || g.Failures() != 0 {
		t.Fatalf("state %v, %d failures", g.State(), g.Failures())
	}
}

// TestTimeout: a store that hangs is cut off at the deadline, counts as a
// failure, and the rule falls back.
func TestTimeout(t *testing.T) {
	store := newFakeStore(nil)
	store.block.Store(true)
	cfg, _ := Parse([]byte("store: {timeout: 20ms, on_error: allow}\nrules:\n  - {name: r, limit: 1/m}\n"), "t.yaml")
	p, err := New(cfg, store, WithLogger(slog.New(&countingHandler{})))
	if err != nil {
		t.Fatal(err)
	}
	v := p.Check(ctx, req("GET", "/"))
	if !v.Allowed || !errors.Is(v.Results[0].Err, context.DeadlineExceeded) || v.Results[0].Fallback != "allow" || !store.sawDeadline.Load() {
		t.Fatalf("%+v", v.Results[0])
	}
	if p.Guard().Failures() != 1 {
		t.Fatalf("%d failures", p.Guard().Failures())
	}
}

func TestFailureLoggedOncePerInterval(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	h := &countingHandler{}
	g := NewGuard(store, GuardConfig{Breaker: BreakerConfig{Failures: 1000000, FailureRatio: 2}, Now: clock.Now, Logger: slog.New(h), LogInterval: 10 * time.Second})
	store.down.Store(true)
	l := weir.PerMinute(weir.GCRA, 10)
	for i := 0; i < 100; i++ {
		g.Take(ctx, "k", l, 1)
	}
	if n := h.count("weir: store failing"); n != 1 {
		t.Fatalf("%d log lines for 100 failures", n)
	}
	clock.Advance(10 * time.Second)
	for i := 0; i < 100; i++ {
		g.Take(ctx, "k", l, 1)
	}
	if n := h.count("weir: store failing"); n != 2 {
		t.Fatalf("%d log lines after the interval", n)
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
	store.down.Store(true)

	for i := 0; i < 3; i++ {
		v := p.Check(ctx, req("GET", "/open"))
		if !v.Allowed || v.Results[0].Fallback != "allow" || v.Results[0].Err == nil {
			t.Fatalf("allow: %+v", v.Results[0])
		}
	}
	if p.Guard().State() != BreakerOpen {
		t.Fatal("the breaker did not open")
	}
	calls := store.calls.Load()

	v := p.Check(ctx, req("GET", "/closed"))
	if rr := v.Results[0]; v.Allowed || rr.Fallback != "deny" || rr.Result.RetryAfter < time.Second || !errors.Is(rr.Err, ErrCircuitOpen) {
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
	if store.calls.Load() != calls {
		t.Fatal("the open breaker let calls through")
	}

	// Recovery: after the cooldown the probe succeeds and the store decides again.
	store.down.Store(false)
	clock.Advance(10 * time.Second)
	v = p.Check(ctx, req("GET", "/open"))
	if !v.Allowed || v.Results[0].Err != nil || v.Results[0].Fallback != "" {
		t.Fatalf("after recovery: %+v", v.Results[0])
	}
	if p.Guard().State() != BreakerClosed {
		t.Fatal("the breaker did not close")
	}
	if v := p.Check(ctx, req("GET", "/open")); v.Allowed {
		t.Fatal("the store's own limit does not apply after recovery")
	}
}

// TestCheckKeyFallback: CheckKey follows on_error too.
func TestCheckKeyFallback(t *testing.T) {
	store := newFakeStore(nil)
	store.down.Store(true)
	p := mustPolicy(t, `
instances: 3
rules:
  - {name: l, limit: 6/h, algorithm: sliding_log}
  - {name: d, limit: 6/h, on_error: deny}
`, store, WithLogger(slog.New(&countingHandler{})))
	rr, err := p.CheckKey(ctx, "l", "k", 2)
	if err != nil || !rr.Result.Allowed || rr.Fallback != "local" || rr.Result.Remaining != 0 {
		t.Fatalf("local: %+v %v", rr, err)
	}
	if rr, _ := p.CheckKey(ctx, "l", "k", 1); rr.Result.Allowed {
		t.Fatal("local: over the instance's share")
	}
	if rr, _ := p.CheckKey(ctx, "d", "k", 1); rr.Result.Allowed || rr.Fallback != "deny" {
		t.Fatalf("deny: %+v", rr)
	}
}

func TestScaleLimit(t *testing.T) {
	for _, c := range []struct {
		l    weir.Limit
		n    int
		want weir.Limit
	}{
		{weir.Limit{Algorithm: weir.GCRA, Rate: 100, Period: time.Minute, Burst: 10}, 3, weir.Limit{Algorithm: weir.GCRA, Rate: 34, Period: time.Minute, Burst: 4}},
		{weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Minute}, 5, weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute}},
		{weir.Limit{Algorithm: weir.SlidingLog, Rate: 7, Period: time.Minute, Block: time.Hour}, 1, weir.Limit{Algorithm: weir.SlidingLog, Rate: 7, Period: time.Minute, Block: time.Hour}},
	} {
		if got := scaleLimit(c.l, c.n); got != c.want {
			t.Errorf("scaleLimit(%v, %d) = %+v, want %+v", c.l, c.n, got, c.want)
		}
	}
}

// TestCallerDeadlineIsNotAStoreFailure: a caller whose own deadline passes
// (Envoy's rate-limit filter times out after 20ms by default) must not
// count against the store, or a burst of impatient callers would open the
// breaker for everyone.
func TestCallerDeadlineIsNotAStoreFailure(t *testing.T) {
	store := newFakeStore(nil)
	store.block.Store(true) // the store answers only when the context ends
	g := NewGuard(store, GuardConfig{Timeout: time.Second, Breaker: BreakerConfig{Failures: 1}})
	l := weir.PerMinute(weir.FixedWindow, 5)
	for i := 0; i < 3; i++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		_, err := g.Take(cctx, "k", l, 1)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if g.State() != BreakerClosed || g.Failures() != 0 {
		t.Fatalf("after callers' own deadlines: breaker %v, %d failures; want closed, 0", g.State(), g.Failures())
	}
	// The guard's own deadline, shorter than the caller's, is a failure.
	g2 := NewGuard(store, GuardConfig{Timeout: 5 * time.Millisecond, Breaker: BreakerConfig{Failures: 1}})
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := g2.Take(cctx, "k", l, 1); err == nil || g2.Failures() != 1 || g2.State() != BreakerOpen {
		t.Fatalf("store timeout: err %v, %d failures, breaker %v; want 1 failure and open", err, g2.Failures(), g2.State())
	}
}

// timedStore is a fakeStore that ends its calls by a timeout of its own,
// as redisstore.Store does.
type timedStore struct {
	*fakeStore
	timeout time.Duration
}

func (s timedStore) Timeout() time.Duration { return s.timeout }

// TestGuardTrustsStoreTimeout: a store that ends every call by its own
// timeout, no longer than the guard's, gets no timer from the guard (a
// timer costs every call); one with a longer timeout still does.
func TestGuardTrustsStoreTimeout(t *testing.T) {
	for _, tc := range []struct {
		store time.Duration
		want  bool
	}{{50 * time.Millisecond, false}, {10 * time.Millisecond, false}, {time.Second, true}} {
		st := timedStore{newFakeStore(nil), tc.store}
		g := NewGuard(st, GuardConfig{Timeout: 50 * time.Millisecond})
		if _, err := g.Take(context.Background(), "k", weir.Limit{Rate: 1, Period: time.Minute}, 1); err != nil {
			t.Fatal(err)
		}
		if got := st.sawDeadline.Load(); got != tc.want {
			t.Errorf("store timeout %v under a 50ms guard: the store saw a deadline %v, want %v", tc.store, got, tc.want)
		}
	}
}
