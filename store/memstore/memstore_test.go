package memstore_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		s := memstore.New(memstore.WithClock(clock.Now))
		return storetest.Harness{Store: s, Clock: clock, TTL: s.TTL}
	})
}

// TestBounded drives a million distinct keys through a store bounded at
// 10k and checks that it never holds more than the bound.
func TestBounded(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	const bound = 10_000
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithMaxKeys(bound), memstore.WithShards(16))
	l := weir.Limit{Algorithm: weir.GCRA, Rate: 10, Period: time.Second}
	ctx := context.Background()
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	for i := 0; i < n; i++ {
		if _, err := s.Take(ctx, fmt.Sprint("k", i), l, 1); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			clock.Advance(time.Millisecond)
		}
	}
	if got := s.Len(); got > bound {
		t.Fatalf("holds %d keys, bound %d", got, bound)
	}
}

// TestIdleKeysSwept checks that keys whose state no longer matters are
// dropped as new keys arrive, without any eviction pressure.
func TestIdleKeysSwept(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithShards(1))
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Second}
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		s.Take(ctx, fmt.Sprint("old", i), l, 1)
	}
	clock.Advance(time.Second) // every window has ended
	for i := 0; i < 1000; i++ {
		s.Take(ctx, fmt.Sprint("new", i), l, 1)
	}
	if got := s.Len(); got > 1100 {
		t.Fatalf("%d keys held after 1000 idle keys expired and 1000 new arrived; expired keys are not swept", got)
	}
}

// TestLimitChangeKeepsState checks that changing a key's limit (a config
// reload) keeps its counters.
func TestLimitChangeKeepsState(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now))
	ctx := context.Background()
	s.Take(ctx, "k", weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Minute}, 8)
	r, err := s.Take(ctx, "k", weir.Limit{Algorithm: weir.FixedWindow, Rate: 20, Period: time.Minute}, 1)
	if err != nil || !r.Allowed || r.Remaining != 11 {
		t.Fatalf("after raising the limit: %+v %v, want 11 remaining", r, err)
	}
}

// TestTakeAllSweepKeepsBatch: a batch with a new key and an expired one
// must not lose the expired key's new state to the sweep that makes room
// for the new key (found by redisstore's differential test).
func TestTakeAllSweepKeepsBatch(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithShards(1))
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 4, Period: time.Minute}
	s.Take(ctx, "a", l, 1)
	clock.Advance(time.Minute) // a's state has expired
	res := make([]weir.Result, 2)
	if err := s.Do(ctx, []weir.Request{{Key: "b", Limit: l, N: 1}, {Key: "a", Limit: l, N: 1}}, res); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Take(ctx, "a", l, 4); r.Allowed {
		t.Fatal("a admitted 1 + 4 = 5 events in one window of a 4/m limit")
	}
}

// TestGCRAIdleAtHighRate: a key idle for hours at a billion per second
// must not overflow (ahead × B).
func TestGCRAIdleAtHighRate(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now))
	l := weir.Limit{Algorithm: weir.GCRA, Rate: 1_000_000_007, Period: time.Second, Burst: 1}
	s.Take(context.Background(), "k", l, 1)
	clock.Advance(3 * time.Hour)
	if r, _ := s.Take(context.Background(), "k", l, 1); !r.Allowed || r.RetryAfter != 0 {
		t.Fatalf("idle key: %+v", r)
	}
}

// TestDefaultClockIsWallTime: the default clock (a wall base plus
// monotonic time) reports epoch time, as penalty boxes and windows need.
func TestDefaultClockIsWallTime(t *testing.T) {
	s := memstore.New()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute, Block: time.Hour}
	s.Take(context.Background(), "k", l, 1)
	before := time.Now()
	r, _ := s.Take(context.Background(), "k", l, 1)
	after := time.Now()
	lo, hi := before.Add(time.Hour-time.Second), after.Add(time.Hour+time.Second)
	if r.BlockedUntil.Before(lo) || r.BlockedUntil.After(hi) {
		t.Fatalf("blocked until %v, want about %v", r.BlockedUntil, before.Add(time.Hour))
	}
}

// TestMaxKeysExact checks that a small MaxKeys is honoured exactly: a store
// bounded at 10 keys never holds more than 10, through single takes and
// batches, and does hold 10 live keys when asked to.
func TestMaxKeysExact(t *testing.T) {
	for _, bound := range []int{1, 3, 10, 100, 300} {
		clock := storetest.NewClock(storetest.Epoch)
		s := memstore.New(memstore.WithClock(clock.Now), memstore.WithMaxKeys(bound))
		l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
		ctx := context.Background()
		for i := range 5 * bound {
			if _, err := s.Take(ctx, fmt.Sprint("k", i), l, 1); err != nil {
				t.Fatal(err)
			}
			if got := s.Len(); got > bound {
				t.Fatalf("max_keys %d: holds %d keys after %d takes", bound, got, i+1)
			}
		}
		if got := s.Len(); got != bound {
			t.Fatalf("max_keys %d: holds %d live keys, want %d", bound, got, bound)
		}
		reqs := make([]weir.Request, 3)
		res := make([]weir.Result, 3)
		for i := range 5 * bound {
			for j := range reqs {
				reqs[j] = weir.Request{Key: fmt.Sprint("b", i, "-", j), Limit: l, N: 1}
			}
			if err := s.Do(ctx, reqs, res); err != nil {
				t.Fatal(err)
			}
			if got := s.Len(); got > bound {
				t.Fatalf("max_keys %d: holds %d keys after batch %d", bound, got, i)
			}
		}
	}
}

// TestSlidingLogMemory checks that a sliding log's memory follows the
// calls, not their cost: 20 calls of cost 50000 under 1000000/h once
// kept a million timestamps (8 MB; 153 MB for 20 keys' worth).
func TestSlidingLogMemory(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithShards(1))
	l := weir.Limit{Algorithm: weir.SlidingLog, Rate: 1_000_000, Period: time.Hour}
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 20 {
		clock.Advance(time.Microsecond)
		r, err := s.Take(ctx, "k", l, 50_000)
		if err != nil || !r.Allowed {
			t.Fatalf("call %d: %+v %v", i, r, err)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Fatalf("20 calls of cost 50000 allocated %d bytes; want at most 64 KiB", grew)
	}
	r, err := s.Take(ctx, "k", l, 1)
	if err != nil || r.Allowed || r.RetryAfter != time.Hour-19*time.Microsecond {
		t.Fatalf("the next event: %+v %v; want a rejection until the first call leaves", r, err)
	}
}

// TestOneKeyUnderSeveralLimits checks the lookup of a held key: each
// algorithm under one key keeps its own state whichever entry of the key's
// chain is found first, a changed limit keeps the state of its algorithm,
// and the default algorithm ("") is the same state as gcra.
func TestOneKeyUnderSeveralLimits(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := memstore.New(memstore.WithClock(clock.Now), memstore.WithShards(1))
	ctx := context.Background()
	fw := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Minute}
	tb := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute}
	gc := weir.Limit{Algorithm: weir.GCRA, Rate: 10, Period: time.Minute}
	def := weir.Limit{Rate: 10, Period: time.Minute}
	take := func(l weir.Limit, n, wantRemaining int64) {
		t.Helper()
		r, err := s.Take(ctx, "k", l, n)
		if err != nil || !r.Allowed || r.Remaining != wantRemaining {
			t.Fatalf("%s take %d: %+v %v, want allowed with %d remaining", l.Algorithm, n, r, err, wantRemaining)
		}
	}
	take(fw, 3, 7)
	take(tb, 2, 8)
	take(gc, 1, 9)
	take(fw, 1, 6) // the fixed window's entry is now last in the chain
	take(tb, 1, 7)
	take(def, 1, 8) // "" is gcra: the same state
	take(gc, 1, 7)
	fw.Rate = 20 // a reload raises the fixed window's rate: its count stays
	take(fw, 1, 15)
	take(tb, 1, 6)
	if n := s.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1 key", n)
	}
}
