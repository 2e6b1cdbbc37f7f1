package denycache

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

var _ guard.Answerer = (*Store)(nil)

// failing is a store that fails every call while down is set.
type failing struct {
	weir.MultiStore
	down atomic.Bool
}

func (f *failing) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if f.down.Load() {
		return weir.Result{}, fmt.Errorf("%w: down", weir.ErrStore)
	}
	return f.MultiStore.Take(ctx, key, l, n)
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
		guardBreakerSeesThroughHits(t, func(s weir.Store) weir.Store { return unwrapper{s.(weir.MultiStore)} })
	})
}

// unwrapper wraps a store and offers Unwrap, as weirotel's does.
type unwrapper struct{ weir.MultiStore }

func (u unwrapper) Unwrap() weir.Store { return u.MultiStore }

func guardBreakerSeesThroughHits(t *testing.T, wrap func(weir.Store) weir.Store) {
	clock := storetest.NewClock(storetest.Epoch)
	inner := &failing{MultiStore: memstore.New(memstore.WithClock(clock.Now))}
	c, err := New(inner, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(wrap(c), guard.Config{Timeout: time.Second, Now: clock.Now,
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
