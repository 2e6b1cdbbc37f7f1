package denycache

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// herdGate is a store in front of the real one that holds a lapsed
// denial's first leader (a call for a key whose cache entry has its first
// flight under way) until want requests wait on that flight, so that a test can make a
// herd happen every time, and counts the calls that reach the store.
type herdGate struct {
	weir.Store
	cache atomic.Pointer[Store]
	want  atomic.Int32 // waiters to hold the leader for; 0: hold nothing
	calls atomic.Int64
	late  atomic.Int64 // holds that ended before the waiters joined
}

func (g *herdGate) hold(key string) {
	g.calls.Add(1)
	c, want := g.cache.Load(), g.want.Load()
	if c == nil || want == 0 {
		return
	}
	lc := c.t.locate(key)
	e := lc.find(key)
	if e == nil {
		return
	}
	f := e.flight.Load()
	if f == nil || f.ended() || f.gen != 1 {
		return // only a lapse's first leader is held
	}
	// Only the leader meets a flight under way here, unless the cache was
	// bypassed meanwhile (its bus lost on a loaded machine): then the
	// others come straight here and the wait ends with the cache's use.
	deadline := time.Now().Add(10 * time.Second)
	for f.waiters.Load() < want && c.Live() {
		if time.Now().After(deadline) {
			g.late.Add(1)
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func (g *herdGate) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	g.hold(key)
	return g.Store.Take(ctx, key, l, n)
}

// Unwrap lets weir.StoreAs see the real store (the deny cache finds
// redisstore's OnRefund through it).
func (g *herdGate) Unwrap() weir.Store { return g.Store }

func (g *herdGate) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(reqs) == 1 {
		g.hold(reqs[0].Key)
	}
	return g.Store.Do(ctx, reqs, results)
}

// twoInstances is two caches (no bus) on one memstore behind a herdGate,
// and the memstore, on a stepped clock.
func twoInstances(t *testing.T) (a, b *Store, g *herdGate, ms *memstore.Store, clock *storetest.Clock) {
	t.Helper()
	clock = storetest.NewClock(storetest.Epoch)
	ms = memstore.New(memstore.WithClock(clock.Now))
	g = &herdGate{Store: ms}
	var err error
	if a, err = New(g, Config{Clock: clock.Now}); err != nil {
		t.Fatal(err)
	}
	if b, err = New(ms, Config{Clock: clock.Now}); err != nil {
		t.Fatal(err)
	}
	g.cache.Store(a)
	return a, b, g, ms, clock
}

// herd sends k requests of cost n for key under l at once through c, half
// by Take and half by TakeAll, and returns their results.
func herd(t *testing.T, c *Store, k int, key string, l weir.Limit, n int64) []weir.Result {
	t.Helper()
	out := make([]weir.Result, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				out[i], err = c.Take(ctx, key, l, n)
			} else {
				var res [1]weir.Result
				err = c.Do(ctx, []weir.Request{{Key: key, Limit: l, N: n}}, res[:])
				out[i] = res[0]
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	return out
}

// TestHerdAnsweredByLeader: when a cached denial lapses but the key is
// still over its limit (another instance took the unit that came back),
// the requests that arrive while the first of them is at the store wait
// for it and are answered by its denial: one store call for the herd, and
// every answer the one the store gives.
func TestHerdAnsweredByLeader(t *testing.T) {
	a, b, g, ms, clock := twoInstances(t)
	tb := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Second, Burst: 2}
	for range 2 {
		mustTake(t, a, "k", tb, 1)
	}
	den := mustTake(t, a, "k", tb, 1)
	if den.Allowed || a.Stats().Entries != 1 {
		t.Fatalf("want a kept denial, got %+v", den)
	}
	clock.Advance(den.RetryAfter) // the entry lapses; one token is back
	if !mustTake(t, b, "k", tb, 1).Allowed {
		t.Fatal("the other instance was refused the token that came back")
	}
	const k = 8
	g.want.Store(k - 1)
	calls := g.calls.Load()
	st0 := a.Stats()
	got := herd(t, a, k, "k", tb, 1)
	truth := mustTake(t, ms, "k", tb, 1)
	if truth.Allowed {
		t.Fatal("the store admits: the test's premise is wrong")
	}
	for i, r := range got {
		if r.Allowed || r.RetryAfter != truth.RetryAfter || r.Limit != truth.Limit || r.Remaining != truth.Remaining {
			t.Errorf("request %d: %+v, the store says %+v", i, r, truth)
		}
	}
	st := a.Stats()
	if n := g.calls.Load() - calls; n != 1 {
		t.Errorf("%d store calls for a herd of %d, want 1 (the leader's)", n, k)
	}
	if st.Herd-st0.Herd != k-1 || st.Hits-st0.Hits != k-1 || st.Misses-st0.Misses != 1 {
		t.Errorf("herd %d, hits %d, misses %d; want %d, %d, 1", st.Herd-st0.Herd, st.Hits-st0.Hits, st.Misses-st0.Misses, k-1, k-1)
	}
}

// TestHerdAdmittedLeader: when the leader is admitted, its waiters go to
// the store themselves: exactly what the store admits is admitted.
func TestHerdAdmittedLeader(t *testing.T) {
	a, _, g, _, clock := twoInstances(t)
	fw3 := weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: time.Second}
	for range 3 {
		mustTake(t, a, "k", fw3, 1)
	}
	den := mustTake(t, a, "k", fw3, 1)
	clock.Advance(den.RetryAfter) // a new window: 3 to admit
	const k = 8
	g.want.Store(k - 1)
	calls := g.calls.Load()
	h0 := a.Stats().Hits
	got := herd(t, a, k, "k", fw3, 1)
	admitted := 0
	for _, r := range got {
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("%d of %d admitted in a window of 3", admitted, k)
	}
	// The leader and the waiters it released all asked the store, save
	// those answered by a denial one of them kept in the meantime.
	hits := a.Stats().Hits - h0
	if n := g.calls.Load() - calls; n+hits != k || n < 4 {
		t.Fatalf("%d store calls and %d answers from memory for %d requests of which 3 were admitted", n, hits, k)
	}
}

// TestHerdWaiterGivesUp: a waiter whose context ends while the leader is
// out returns at once, with an error that says its decision was not sent.
func TestHerdWaiterGivesUp(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	release := make(chan struct{})
	leaderIn := make(chan struct{}, 1)
	gs := &gatedMulti{Store: ms, in: leaderIn, out: release}
	s, err := New(gs, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		mustTake(t, s, "k", fw, 1)
	}
	if s.Stats().Entries != 1 {
		t.Fatal("the denial was not kept")
	}
	clock.Advance(time.Second) // lapsed; the window turned
	gs.on.Store(true)
	done := make(chan weir.Result)
	go func() { done <- mustTakeNoT(s, "k", fw, 1) }()
	<-leaderIn // the leader is at the store
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error)
	go func() {
		_, err := s.Take(cctx, "k", fw, 1)
		errc <- err
	}()
	lc := s.t.locate("k")
	for deadline := time.Now().Add(time.Minute); ; {
		if f := lc.find("k").flight.Load(); f != nil && f.waiters.Load() >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second request never waited for the first")
		}
		time.Sleep(20 * time.Microsecond)
	}
	cancel()
	if err := <-errc; !errors.Is(err, weir.ErrNotSent) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter that gave up: %v, want ErrNotSent and context.Canceled", err)
	}
	close(release)
	if r := <-done; !r.Allowed {
		t.Fatalf("the leader in a new window: %+v", r)
	}
}

func mustTakeNoT(s weir.Store, key string, l weir.Limit, n int64) weir.Result {
	r, err := s.Take(ctx, key, l, n)
	if err != nil {
		panic(err)
	}
	return r
}

// gatedMulti holds every Take while on, after saying so on in.
type gatedMulti struct {
	weir.Store
	on      atomic.Bool
	in, out chan struct{}
}

func (g *gatedMulti) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if g.on.Load() {
		g.in <- struct{}{}
		<-g.out
	}
	return g.Store.Take(ctx, key, l, n)
}

// TestHerdSecondLeader: when a bucket's lapsed denial gives back one unit,
// the first leader takes it; one of its waiters then leads a second flight,
// whose denial answers the rest: two store calls for the whole herd, and
// exactly one admission, as the store one by one would give.
func TestHerdSecondLeader(t *testing.T) {
	a, _, g, ms, clock := twoInstances(t)
	tb := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Second, Burst: 2}
	for range 2 {
		mustTake(t, a, "k", tb, 1)
	}
	den := mustTake(t, a, "k", tb, 1)
	clock.Advance(den.RetryAfter) // one token back
	const k = 8
	g.want.Store(k - 1)
	calls := g.calls.Load()
	st0 := a.Stats()
	got := herd(t, a, k, "k", tb, 1)
	truth := mustTake(t, ms, "k", tb, 1)
	admitted := 0
	for i, r := range got {
		switch {
		case r.Allowed:
			admitted++
		case r.RetryAfter <= 0 || r.RetryAfter > truth.RetryAfter:
			t.Errorf("request %d: denial %+v, the store's %+v", i, r, truth)
		}
	}
	if admitted != 1 || truth.Allowed {
		t.Fatalf("%d of %d admitted for one token (the store then says %+v)", admitted, k, truth)
	}
	st := a.Stats()
	if n := g.calls.Load() - calls; n != 2 {
		t.Errorf("%d store calls for a herd of %d, want 2 (the two leaders')", n, k)
	}
	if st.Herd-st0.Herd != k-2 || st.Misses-st0.Misses != 2 {
		t.Errorf("herd %d, misses %d; want %d and 2", st.Herd-st0.Herd, st.Misses-st0.Misses, k-2)
	}
}
