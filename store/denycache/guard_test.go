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

// TestGuardBreakerSeesThroughHits: behind a guard, answers from the cache
// do not count as store successes, so a flood answered from memory cannot
// keep the breaker closed while every real call fails; and they are still
// given while it is open.
func TestGuardBreakerSeesThroughHits(t *testing.T) {
	t.Run("direct", func(t *testing.T) { guardBreakerSeesThroughHits(t, func(s weir.Store) weir.Store { return s }) })
	// A wrapper outside the cache (weir serve's tracing is one): the
	// guard finds the cache through Unwrap.
	t.Run("wrapped", func(t *testing.T) {
		guardBreakerSeesThroughHits(t, func(s weir.Store) weir.Store { return unwrapper{s} })
	})
}

// unwrapper wraps a store and offers Unwrap, as weirotel's does.
type unwrapper struct{ weir.Store }

func (u unwrapper) Unwrap() weir.Store { return u.Store }

func guardBreakerSeesThroughHits(t *testing.T, wrap func(weir.Store) weir.Store) {
	clock := storetest.NewClock(storetest.Epoch)
	inner := &failing{Store: memstore.New(memstore.WithClock(clock.Now))}
	c, err := New(inner, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(wrap(c), guard.Config{Timeout: time.Second, Now: clock.Now, Answer: c.Await,
		Breaker: guard.BreakerConfig{Failures: 5, FailureRatio: 2, Cooldown: time.Hour}})
	for range 4 {
		mustTake(t, g, "abuser", fw, 1) // the 4th is denied and cached
	}
	inner.down.Store(true)
	for i := range 5 {
		for range 10 {
			if r := mustTake(t, g, "abuser", fw, 1); r.Allowed {
				t.Fatal("admitted")
			}
		}
		if _, err := g.Take(ctx, fmt.Sprint("other", i), fw, 1); err == nil {
			t.Fatal("a failing store answered")
		}
	}
	if st := g.State(); st != guard.BreakerOpen {
		t.Fatalf("breaker %v after 5 failures among 50 cached answers, want open", st)
	}
	if r, err := g.Take(ctx, "abuser", fw, 1); err != nil || r.Allowed {
		t.Fatalf("with the breaker open, a certain denial: %+v %v", r, err)
	}
	if st := c.Stats(); st.Hits != 51 || st.Misses != 9 {
		t.Fatalf("hits %d misses %d, want 51 and 9 (4 + 5 failures: no miss counted twice)", st.Hits, st.Misses)
	}
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
// count as store successes either (the guard asks Await first): one
// success and four failures open a breaker of failure ratio 0.5, however
// large the herd was.
func TestGuardBreakerSeesThroughHerd(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	gate := &failingGate{herdGate: &herdGate{Store: ms}}
	c, err := New(gate, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	gate.cache.Store(c)
	g := guard.New(c, guard.Config{Timeout: time.Second, Now: clock.Now, Answer: c.Await,
		Breaker: guard.BreakerConfig{Failures: 100, FailureRatio: 0.5, MinRequests: 4, Window: time.Hour, Cooldown: time.Hour}})
	tb := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Second, Burst: 2}
	for range 2 {
		mustTake(t, g, "k", tb, 1)
	}
	den := mustTake(t, g, "k", tb, 1)
	clock.Advance(den.RetryAfter)
	mustTake(t, ms, "k", tb, 1) // another instance takes the token back
	// A new window of the breaker's counts: the calls above are in it, so
	// start from a breaker that has seen only what follows.
	g = guard.New(c, guard.Config{Timeout: time.Second, Now: clock.Now, Answer: c.Await,
		Breaker: guard.BreakerConfig{Failures: 100, FailureRatio: 0.5, MinRequests: 4, Window: time.Hour, Cooldown: time.Hour}})
	const k = 16
	gate.want.Store(k - 1)
	h0 := c.Stats().Herd
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() {
			if r, err := g.Take(ctx, "k", tb, 1); err != nil || r.Allowed {
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
		if _, err := g.Take(ctx, fmt.Sprint("other", i), tb, 1); err == nil {
			t.Fatal("a failing store answered")
		}
	}
	if st := g.State(); st != guard.BreakerOpen {
		t.Fatalf("breaker %v after 1 success and 4 failures (and %d herd answers), want open", st, k-1)
	}
}
