package denycache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

var ctx = context.Background()

// newMem wraps a memstore on a stepped clock, without a bus.
func newMem(t testing.TB, size int) (*Store, *memstore.Store, *storetest.Clock) {
	t.Helper()
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	s, err := New(ms, Config{Size: size, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, ms, clock
}

func mustTake(t testing.TB, s weir.Store, key string, l weir.Limit, n int64) weir.Result {
	t.Helper()
	r, err := s.Take(ctx, key, l, n)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var fw = weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: time.Second}

func TestHitUntilRetryAfter(t *testing.T) {
	s, ms, clock := newMem(t, 0)
	for range 3 {
		if !mustTake(t, s, "a", fw, 1).Allowed {
			t.Fatal("rejected under the limit")
		}
	}
	den := mustTake(t, s, "a", fw, 1)
	if den.Allowed || den.RetryAfter <= 0 {
		t.Fatalf("want a denial, got %+v", den)
	}
	clock.Advance(den.RetryAfter / 2)
	hit := mustTake(t, s, "a", fw, 2) // larger cost: answered
	truth := mustTake(t, ms, "a", fw, 2)
	if st := s.Stats(); st.Hits != 1 {
		t.Fatalf("hits %d, want 1", st.Hits)
	}
	if hit.Allowed || hit.RetryAfter != truth.RetryAfter || hit.Limit != truth.Limit || hit.ResetAfter != truth.ResetAfter {
		t.Fatalf("cached %+v, store %+v", hit, truth)
	}
	clock.Advance(den.RetryAfter - den.RetryAfter/2 - time.Microsecond)
	if mustTake(t, s, "a", fw, 1).Allowed || s.Stats().Hits != 2 {
		t.Fatal("not answered from the cache a microsecond before RetryAfter")
	}
	clock.Advance(time.Microsecond)
	if !mustTake(t, s, "a", fw, 1).Allowed {
		t.Fatal("rejected at RetryAfter: the entry outlived the denial")
	}
}

func TestSmallerCostAndOtherLimitMiss(t *testing.T) {
	s, _, _ := newMem(t, 0)
	mustTake(t, s, "a", fw, 2)
	if r := mustTake(t, s, "a", fw, 3); r.Allowed { // 2 + 3 > 3: denied, cached for cost >= 3
		t.Fatal("admitted over the limit")
	}
	if !mustTake(t, s, "a", fw, 1).Allowed { // smaller cost: the store admits
		t.Fatal("a smaller cost was answered by a larger cost's denial")
	}
	other := fw
	other.Rate = 10
	if !mustTake(t, s, "a", other, 3).Allowed {
		t.Fatal("another limit on the key was answered by this limit's denial")
	}
	if !mustTake(t, s, "b", fw, 3).Allowed {
		t.Fatal("another key was answered by this key's denial (poisoned)")
	}
	if st := s.Stats(); st.Hits != 0 {
		t.Fatalf("hits %d, want 0", st.Hits)
	}
}

func TestResetInvalidates(t *testing.T) {
	s, _, _ := newMem(t, 0)
	for range 4 {
		mustTake(t, s, "a", fw, 1)
	}
	if s.Stats().Entries != 1 {
		t.Fatal("the denial was not kept")
	}
	if err := weir.NewLimiter(s).Reset(ctx, "a", fw); err != nil {
		t.Fatal(err)
	}
	if !mustTake(t, s, "a", fw, 1).Allowed {
		t.Fatal("rejected after a reset: a stale denial answered")
	}
	if st := s.Stats(); st.Invalidations["reset"] != 1 || st.Entries != 0 {
		t.Fatalf("stats after reset: %+v", st)
	}
}

func TestConcurrencyNotCached(t *testing.T) {
	s, _, _ := newMem(t, 0)
	lim := weir.NewLimiter(s)
	cl := weir.Limit{Algorithm: weir.Concurrency, Rate: 1, Period: time.Minute}
	lease, _, err := lim.Acquire(ctx, "c", cl)
	if err != nil || lease == nil {
		t.Fatal(lease, err)
	}
	if _, r, _ := lim.Acquire(ctx, "c", cl); r.Allowed {
		t.Fatal("second lease admitted")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l2, _, err := lim.Acquire(ctx, "c", cl); err != nil || l2 == nil {
		t.Fatal("a released slot was refused: a concurrency denial was cached")
	}
	if st := s.Stats(); st.Entries != 0 || st.Hits != 0 {
		t.Fatalf("concurrency cached: %+v", st)
	}
}

// TestBounded floods the cache with denied keys: it never holds more than
// its size, and the keys still denied are still answered correctly.
func TestBounded(t *testing.T) {
	s, ms, _ := newMem(t, 100)
	one := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	for i := range 5000 {
		k := fmt.Sprint("k", i)
		mustTake(t, s, k, one, 1)
		mustTake(t, s, k, one, 1)
		if n := s.Stats().Entries; n > 100 || n > len(s.t.buckets)*ways {
			t.Fatalf("%d entries in a cache of 100", n)
		}
	}
	if st := s.Stats(); st.Evictions < 4900 {
		t.Fatalf("evictions %d, want >= 4900", st.Evictions)
	}
	for i := range 5000 {
		k := fmt.Sprint("k", i)
		if mustTake(t, s, k, one, 1).Allowed != mustTake(t, ms, k, one, 1).Allowed {
			t.Fatalf("key %s: the cache and the store disagree", k)
		}
	}
}

// gate is a store that holds Take until released, to play a reply that
// comes back after an invalidation.
type gate struct {
	weir.Store
	in, out chan struct{}
}

func (g *gate) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	g.in <- struct{}{}
	<-g.out
	return g.Store.Take(ctx, key, l, n)
}

// TestReplyAfterInvalidation: a denial sent before an invalidation and
// answered after it is not kept (it may predate the reset).
func TestReplyAfterInvalidation(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	for range 3 {
		mustTake(t, ms, "a", fw, 1)
	}
	g := &gate{Store: ms, in: make(chan struct{}), out: make(chan struct{})}
	s, err := New(g, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if r, err := s.Take(ctx, "a", fw, 1); err != nil || r.Allowed {
			t.Errorf("want a denial, got %+v %v", r, err)
		}
	}()
	<-g.in
	s.t.invalidateKey("a") // as a message from the bus would
	close(g.out)
	wg.Wait()
	if n := s.Stats().Entries; n != 0 {
		t.Fatalf("%d entries: a denial that straddled an invalidation was kept", n)
	}
}

// fakeBus is an in-process Bus whose subscription the test turns on and off.
type fakeBus struct {
	state chan bool
}

func (b *fakeBus) Publish(context.Context, Message) error { return nil }
func (b *fakeBus) Run(ctx context.Context, _ func(Message), state func(bool)) {
	for {
		select {
		case <-ctx.Done():
			return
		case up := <-b.state:
			state(up)
		}
	}
}

func TestBypassedWhileBusDown(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	bus := &fakeBus{state: make(chan bool)}
	s, err := New(ms, Config{Clock: clock.Now, Bus: bus})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 5 {
		mustTake(t, s, "a", fw, 1)
	}
	if st := s.Stats(); st.Entries != 0 || st.Live {
		t.Fatalf("a cache whose bus never subscribed was used: %+v", st)
	}
	bus.state <- true
	bus.state <- true // a second send returns once the first was applied
	mustTake(t, s, "a", fw, 1)
	mustTake(t, s, "a", fw, 1)
	if st := s.Stats(); st.Entries != 1 || st.Hits != 1 {
		t.Fatalf("live cache: %+v", st)
	}
	bus.state <- false
	bus.state <- false
	if st := s.Stats(); st.Entries != 0 || st.Live {
		t.Fatalf("the bus went down but the cache kept its entries: %+v", st)
	}
	mustTake(t, s, "a", fw, 1)
	if st := s.Stats(); st.Entries != 0 || st.Hits != 1 {
		t.Fatalf("a bypassed cache answered or kept: %+v", st)
	}
}

func TestBadSize(t *testing.T) {
	for _, n := range []int{-1, MaxSize + 1} {
		if _, err := New(memstore.New(), Config{Size: n}); err == nil {
			t.Errorf("size %d accepted", n)
		}
	}
}

func BenchmarkHit(b *testing.B) {
	s, err := New(memstore.New(), Config{})
	if err != nil {
		b.Fatal(err)
	}
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("abusive-client-%d", i)
		mustTake(b, s, keys[i], l, 1)
		mustTake(b, s, keys[i], l, 1)
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		stop := threadCPU(b) // on a shared machine, the CPU time of the loop's own thread
		for i := 0; b.Loop(); i++ {
			if r, _ := s.Take(ctx, keys[i%len(keys)], l, 1); r.Allowed {
				b.Fatal("admitted")
			}
		}
		stop()
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if r, _ := s.Take(ctx, keys[i%len(keys)], l, 1); r.Allowed {
					b.Fatal("admitted")
				}
				i++
			}
		})
	})
}

// slowReply is a store whose replies take d to come back (on the stepped
// clock), after the store decided.
type slowReply struct {
	weir.Store
	clock *storetest.Clock
	d     time.Duration
}

func (s *slowReply) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	r, err := s.Store.Take(ctx, key, l, n)
	s.clock.Advance(s.d)
	return r, err
}

// TestMeasuredFromSend: an entry lapses RetryAfter after the denied request
// was sent, not after its reply came, so never later than the store's
// denial does.
func TestMeasuredFromSend(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	ms := memstore.New(memstore.WithClock(clock.Now))
	tb := weir.Limit{Algorithm: weir.TokenBucket, Rate: 1, Period: time.Second, Burst: 1}
	s, err := New(&slowReply{Store: ms, clock: clock, d: 300 * time.Millisecond}, Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	mustTake(t, s, "k", tb, 1)        // admitted at 0, reply at 0.3 s
	den := mustTake(t, s, "k", tb, 1) // sent at 0.3 s: RetryAfter 0.7 s, reply at 0.6 s
	if den.Allowed || den.RetryAfter != 700*time.Millisecond {
		t.Fatalf("want a denial with RetryAfter 700ms, got %+v", den)
	}
	clock.Advance(400 * time.Millisecond) // 1.0 s: the store admits again
	if r := mustTake(t, s, "k", tb, 1); !r.Allowed {
		t.Fatalf("the cache answered past the store's RetryAfter (measured from the reply?): %+v", r)
	}
}

// TestCostBeyondLimitIsAnError: a cost the limit can never admit gets the
// store's error, not a cached denial.
func TestCostBeyondLimitIsAnError(t *testing.T) {
	s, _, _ := newMem(t, 0)
	for range 4 {
		mustTake(t, s, "a", fw, 1)
	}
	if _, err := s.Take(ctx, "a", fw, 4); !errors.Is(err, weir.ErrInvalidCost) {
		t.Fatalf("cost 4 under a limit of 3: want ErrInvalidCost, got %v", err)
	}
}

// TestDebtPassesThrough: a debit always reaches the store (a cached denial
// must never swallow a charge), and a refund drops the key's cached denial,
// since the capacity it gives back can admit before the denial's
// RetryAfter.
func TestDebtPassesThrough(t *testing.T) {
	s, ms, _ := newMem(t, 0)
	for range 4 {
		mustTake(t, s, "a", fw, 1)
	}
	if s.Stats().Entries != 1 {
		t.Fatal("the denial was not kept")
	}
	out := make([]weir.Result, 1)
	if err := s.Do(ctx, []weir.Request{{Key: "a", Limit: fw, N: 2, Mode: weir.ModeDebit}}, out); err != nil {
		t.Fatal(err)
	}
	// The debit counted in the store: a refund of 2 still leaves the key full.
	if r, err := ms.Take(ctx, "a", fw, 0); err != nil || r.Remaining != 0 {
		t.Fatalf("after the debit the store says %+v %v", r, err)
	}
	if err := s.Do(ctx, []weir.Request{{Key: "a", Limit: fw, N: 3, Mode: weir.ModeRefund}}, out); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Entries != 0 {
		t.Fatalf("the cached denial outlived a refund: %+v", st)
	}
	if !mustTake(t, s, "a", fw, 1).Allowed {
		t.Fatal("rejected after a refund gave capacity back: a stale denial answered")
	}
}
