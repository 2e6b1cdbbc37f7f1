package guard

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/storefake"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// These tests were policy's, from when Guard lived there; the helpers
// below are the part of policy's test helpers they use.

var ctx = context.Background()

func TestBreaker(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	var mu sync.Mutex
	var transitions []string
	g := New(store, Config{
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
	store.Down.Store(true)
	for i := 0; i < 3; i++ {
		if err := take(); !errors.Is(err, errDown) {
			t.Fatalf("failure %d: %v", i, err)
		}
	}
	if g.State() != BreakerOpen {
		t.Fatalf("after 3 failures: %v", g.State())
	}
	// Open: calls fail fast without touching the store.
	calls := store.Calls.Load()
	for i := 0; i < 100; i++ {
		if err := take(); !errors.Is(err, ErrCircuitOpen) || !errors.Is(err, weir.ErrStore) {
			t.Fatalf("open: %v", err)
		}
	}
	if store.Calls.Load() != calls || g.Rejected() != 100 {
		t.Fatalf("the open breaker touched the store: %d calls, %d rejected", store.Calls.Load()-calls, g.Rejected())
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
	store.Down.Store(false)
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
	g := New(store, Config{Timeout: 10 * time.Second, Breaker: BreakerConfig{Failures: 1, Cooldown: time.Second}, Now: clock.Now, Logger: slog.New(&countingHandler{})})
	l := weir.PerMinute(weir.GCRA, 100)
	store.Down.Store(true)
	g.Take(ctx, "k", l, 1)
	if g.State() != BreakerOpen {
		t.Fatal("not open")
	}
	clock.Advance(time.Second)
	store.Down.Store(false)
	store.Block.Store(true) // the probe hangs until its context ends
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error)
	go func() { _, err := g.Take(pctx, "k", l, 1); done <- err }()
	waitFor(t, 5*time.Second, "the probe to reach the store", func() bool { return store.Calls.Load() == 2 })
	if _, err := g.Take(ctx, "k", l, 1); !errors.Is(err, ErrCircuitOpen) {
		t.Fatalf("a second call during the probe: %v", err)
	}
	cancel()
	<-done
	// A probe the caller cancelled proves nothing: it is not a success.
	if g.State() != BreakerHalfOpen {
		t.Fatalf("after a cancelled probe: %v, want half_open", g.State())
	}
	store.Block.Store(false)
	if _, err := g.Take(ctx, "k", l, 1); err != nil || g.State() != BreakerClosed {
		t.Fatalf("the next probe: %v, %v", err, g.State())
	}
}

func TestBreakerRatio(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	g := New(store, Config{Timeout: time.Second, Breaker: BreakerConfig{Failures: 100, FailureRatio: 0.5, MinRequests: 10, Window: time.Minute}, Now: clock.Now, Logger: slog.New(&countingHandler{})})
	l := weir.PerMinute(weir.GCRA, 1000)
	for i := 0; i < 20; i++ {
		store.Down.Store(i%2 == 1) // every other call fails: never 100 in a row
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
	g := New(store, Config{Timeout: time.Second, Breaker: BreakerConfig{Failures: 1}, Now: clock.Now})
	l := weir.PerMinute(weir.FixedWindow, 5)
	if _, err := g.Take(ctx, "k", l, 6); !errors.Is(err, weir.ErrInvalidCost) {
		t.Fatal(err)
	}
	if _, err := g.Take(ctx, "k", weir.Limit{Algorithm: "nope", Rate: 1, Period: time.Second}, 1); !errors.Is(err, weir.ErrInvalidLimit) {
		t.Fatal(err)
	}
	store.Block.Store(true)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := g.Take(cctx, "k", l, 1); err == nil {
		t.Fatal("no error")
	}
	if g.State() != BreakerClosed || g.Failures() != 0 {
		t.Fatalf("state %v, %d failures", g.State(), g.Failures())
	}
}

func TestFailureLoggedOncePerInterval(t *testing.T) {
	clock := newClock()
	store := newFakeStore(clock)
	h := &countingHandler{}
	g := New(store, Config{Breaker: BreakerConfig{Failures: 1000000, FailureRatio: 2}, Now: clock.Now, Logger: slog.New(h), LogInterval: 10 * time.Second})
	store.Down.Store(true)
	l := weir.PerMinute(weir.GCRA, 10)
	for i := 0; i < 100; i++ {
		g.Take(ctx, "k", l, 1)
	}
	if n := h.Count("weir: store failing"); n != 1 {
		t.Fatalf("%d log lines for 100 failures", n)
	}
	clock.Advance(10 * time.Second)
	for i := 0; i < 100; i++ {
		g.Take(ctx, "k", l, 1)
	}
	if n := h.Count("weir: store failing"); n != 2 {
		t.Fatalf("%d log lines after the interval", n)
	}
}

func TestLocalLimit(t *testing.T) {
	for _, c := range []struct {
		l    weir.Limit
		n    int
		want weir.Limit
	}{
		{weir.Limit{Algorithm: weir.GCRA, Rate: 100, Period: time.Minute, Burst: 10}, 3, weir.Limit{Algorithm: weir.GCRA, Rate: 34, Period: time.Minute, Burst: 4}},
		{weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Minute}, 5, weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute}},
		{weir.Limit{Algorithm: weir.SlidingLog, Rate: 7, Period: time.Minute, Block: time.Hour}, 1, weir.Limit{Algorithm: weir.SlidingLog, Rate: 7, Period: time.Minute, Block: time.Hour}},
	} {
		if got := LocalLimit(c.l, c.n); got != c.want {
			t.Errorf("LocalLimit(%v, %d) = %+v, want %+v", c.l, c.n, got, c.want)
		}
	}
}

// TestCallerDeadlineIsNotAStoreFailure: a caller whose own deadline passes
// (Envoy's rate-limit filter times out after 20ms by default) must not
// count against the store, or a burst of impatient callers would open the
// breaker for everyone.
func TestCallerDeadlineIsNotAStoreFailure(t *testing.T) {
	store := newFakeStore(nil)
	store.Block.Store(true) // the store answers only when the context ends
	g := New(store, Config{Timeout: time.Second, Breaker: BreakerConfig{Failures: 1}})
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
	g2 := New(store, Config{Timeout: 5 * time.Millisecond, Breaker: BreakerConfig{Failures: 1}})
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := g2.Take(cctx, "k", l, 1); err == nil || g2.Failures() != 1 || g2.State() != BreakerOpen {
		t.Fatalf("store timeout: err %v, %d failures, breaker %v; want 1 failure and open", err, g2.Failures(), g2.State())
	}
}

// TestGuardTrustsStoreTimeout: a store that ends every call by its own
// timeout, no longer than the guard's, gets no timer from the guard (a
// timer costs every call); one with a longer timeout still does.
func TestGuardTrustsStoreTimeout(t *testing.T) {
	for _, tc := range []struct {
		store time.Duration
		want  bool
	}{{50 * time.Millisecond, false}, {10 * time.Millisecond, false}, {time.Second, true}} {
		st := timedStore{newFakeStore(nil), tc.store}
		g := New(st, Config{Timeout: 50 * time.Millisecond, StoreTimeout: st.Timeout()})
		if _, err := g.Take(context.Background(), "k", weir.Limit{Rate: 1, Period: time.Minute}, 1); err != nil {
			t.Fatal(err)
		}
		if got := st.SawDeadline.Load(); got != tc.want {
			t.Errorf("store timeout %v under a 50ms guard: the store saw a deadline %v, want %v", tc.store, got, tc.want)
		}
	}
}

// timedStore is a fakeStore that ends its calls by a timeout of its own,
// as redisstore.Store does.
type timedStore struct {
	*fakeStore
	timeout time.Duration
}

func (s timedStore) Timeout() time.Duration { return s.timeout }

// newClock returns a stepped clock at storetest.Epoch.
func newClock() *storetest.Clock { return storetest.NewClock(storetest.Epoch) }

// fakeStore wraps a memstore, counts calls, and fails on demand.
type fakeStore = storefake.Store

func newFakeStore(clock *storetest.Clock) *fakeStore {
	if clock == nil {
		return storefake.New(nil)
	}
	return storefake.New(clock.Now)
}

var errDown = storefake.ErrDown

// countingHandler counts slog records whose message is msg.
type countingHandler = storefake.LogCounter

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestGuardStampsReservations: Reserve through a guard dates its take by
// the store's clock (weir.StampStore through the breaker), so that a late
// settlement refunds nothing the limit has recovered.
func TestGuardStampsReservations(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch.Add(59 * time.Second))
	g := New(memstore.New(memstore.WithClock(clock.Now)), Config{})
	lim := weir.NewLimiter(g)
	l := weir.PerMinute(weir.FixedWindow, 10)
	rv, res, err := lim.Reserve(ctx, "k", l, 10)
	if err != nil || rv == nil || rv.Stamp.At != clock.Now().UnixMicro() || rv.Stamp.Remaining != 0 {
		t.Fatalf("Reserve through a guard: %+v %+v %v, want a stamp at the store's clock", rv, res, err)
	}
	clock.Advance(2 * time.Second)
	if res, err := lim.AllowN(ctx, "k", l, 10); err != nil || !res.Allowed {
		t.Fatalf("the next window: %+v %v", res, err)
	}
	if res, err := rv.Settle(ctx, 0); err != nil || res.Remaining != 0 {
		t.Fatalf("a late settle through a guard: %+v %v, want 0 remaining", res, err)
	}
}

// TestGuardStampsBatches: a stamped batch through a guard dates its takes
// by the store's clock (weir.StampAllStore through the breaker), so that
// the late settlement of a batch's cost request refunds nothing the limit
// has recovered.
func TestGuardStampsBatches(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch.Add(59 * time.Second))
	g := New(memstore.New(memstore.WithClock(clock.Now)), Config{})
	l := weir.PerMinute(weir.FixedWindow, 10)
	reqs := []weir.Request{{Key: "k", Limit: weir.PerMinute(weir.GCRA, 60), N: 1}, {Key: "k", Limit: l, N: 10}}
	res := make([]weir.Result, 2)
	stamps := make([]weir.Stamp, 2)
	err := g.Do(ctx, reqs, res)
	for i := range reqs {
		stamps[i] = res[i].Stamp(reqs[i].N)
	}
	if err != nil || !res[1].Allowed {
		t.Fatalf("the batch: %+v %v", res, err)
	}
	if want := (weir.Stamp{At: clock.Now().UnixMicro(), Estimate: 10, Remaining: 0}); stamps[1] != want {
		t.Fatalf("the cost request's stamp through a guard: %+v, want %+v", stamps[1], want)
	}
	clock.Advance(2 * time.Second)
	lim := weir.NewLimiter(g)
	if res, err := lim.AllowN(ctx, "k", l, 10); err != nil || !res.Allowed {
		t.Fatalf("the next window: %+v %v", res, err)
	}
	if res, err := lim.SettleStamped(ctx, "k", l, stamps[1], 0); err != nil || res.Remaining != 0 {
		t.Fatalf("a late settle through a guard: %+v %v, want 0 remaining", res, err)
	}
}
