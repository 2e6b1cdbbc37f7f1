package denycache

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// failing is a store that fails every call while down is set.
type failing struct {
	weir.Store
	down atomic.Bool
}

func (f *failing) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if f.down.Load() {
		return weir.Result{}, fmt.Errorf("%w: down", weir.ErrStore)
	}
	return f.Store.Take(ctx, key, l, n)
}

// TestGuardBreakerSeesThroughHits: in front of a guard (weir serve's
// order: deny cache, guard, store), answers from the cache never reach the
// guard, so a flood answered from memory cannot keep the breaker closed
// while every real call fails; and they are still given while it is open.
func TestGuardBreakerSeesThroughHits(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	inner := &failing{Store: memstore.New(memstore.WithClock(clock.Now))}
	g := guard.New(inner, guard.Config{Timeout: time.Second, Now: clock.Now,
		Breaker: guard.BreakerConfig{Failures: 5, FailureRatio: 2, Cooldown: time.Hour}})
	c, err := New(g, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		mustTake(t, c, "abuser", fw, 1) // the 4th is denied and cached
	}
	inner.down.Store(true)
	for i := range 5 {
		for range 10 {
			if r := mustTake(t, c, "abuser", fw, 1); r.Allowed {
				t.Fatal("admitted")
			}
		}
		if _, err := c.Take(ctx, fmt.Sprint("other", i), fw, 1); err == nil {
			t.Fatal("a failing store answered")
		}
	}
	if st := g.State(); st != guard.BreakerOpen {
		t.Fatalf("breaker %v after 5 failures among 50 cached answers, want open", st)
	}
	if r, err := c.Take(ctx, "abuser", fw, 1); err != nil || r.Allowed {
		t.Fatalf("with the breaker open, a certain denial: %+v %v", r, err)
	}
	if st := c.Stats(); st.Hits != 51 || st.Misses != 9 {
		t.Fatalf("hits %d misses %d, want 51 and 9 (4 + 5 failures: no miss counted twice)", st.Hits, st.Misses)
	}
}

// guardSlot is a store that passes every call to the guard it holds, so
// that a test can give the cache in front a fresh guard.
type guardSlot struct{ g atomic.Pointer[guard.Guard] }

func (s *guardSlot) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	return s.g.Load().Take(ctx, key, l, n)
}

func (s *guardSlot) Do(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	return s.g.Load().Do(ctx, reqs, res)
}

// failingGate is a herdGate whose store fails every call while down is set.
type failingGate struct {
	*herdGate
	down atomic.Bool
}

func (f *failingGate) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if f.down.Load() {
		return weir.Result{}, fmt.Errorf("%w: down", weir.ErrStore)
	}
	return f.herdGate.Take(ctx, key, l, n)
}

// TestGuardBreakerSeesThroughHerd: behind a guard, the requests of a herd
// at a lapsed denial that are answered by their leader's denial do not
// count as store successes either (they never reach the guard): one
// success and four failures open a breaker of failure ratio 0.5, however
// large the herd was.
func TestGuardBreakerSeesThroughHerd(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	gate := &failingGate{herdGate: &herdGate{Store: ms}}
	newGuard := func() *guard.Guard {
		return guard.New(gate, guard.Config{Timeout: time.Second, Now: clock.Now,
			Breaker: guard.BreakerConfig{Failures: 100, FailureRatio: 0.5, MinRequests: 4, Window: time.Hour, Cooldown: time.Hour}})
	}
	slot := &guardSlot{}
	g := newGuard()
	slot.g.Store(g)
	c, err := New(slot, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	gate.cache.Store(c)
	tb := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Second, Burst: 2}
	for range 2 {
		mustTake(t, c, "k", tb, 1)
	}
	den := mustTake(t, c, "k", tb, 1)
	clock.Advance(den.RetryAfter)
	mustTake(t, ms, "k", tb, 1) // another instance takes the token back
	// A new window of the breaker's counts: the calls above are in it, so
	// start from a breaker that has seen only what follows.
	g = newGuard()
	slot.g.Store(g)
	const k = 16
	gate.want.Store(k - 1)
	h0 := c.Stats().Herd
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() {
			if r, err := c.Take(ctx, "k", tb, 1); err != nil || r.Allowed {
				t.Errorf("a herd member: %+v %v", r, err)
			}
		})
	}
	wg.Wait()
	gate.want.Store(0)
	if n := c.Stats().Herd - h0; n != k-1 {
		t.Fatalf("%d herd answers, want %d", n, k-1)
	}
	gate.down.Store(true)
	for i := range 4 {
		if _, err := c.Take(ctx, fmt.Sprint("other", i), tb, 1); err == nil {
			t.Fatal("a failing store answered")
		}
	}
	if st := g.State(); st != guard.BreakerOpen {
		t.Fatalf("breaker %v after 1 success and 4 failures (and %d herd answers), want open", st, k-1)
	}
}
