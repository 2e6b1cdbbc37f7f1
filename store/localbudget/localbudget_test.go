package localbudget_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/memstore"
)

// clock is a settable clock shared by the store and the tables.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// counting counts the calls that reach the store.
type counting struct {
	weir.Store
	calls atomic.Int64
}

func (c *counting) Do(ctx context.Context, reqs []weir.Request, out []weir.Result) error {
	c.calls.Add(1)
	return c.Store.Do(ctx, reqs, out)
}

func (c *counting) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	c.calls.Add(1)
	return c.Store.Take(ctx, key, l, n)
}

func newClock() *clock {
	// A minute boundary, so that a whole minute lies ahead in the window.
	return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// TestNeverOverAdmits: four tables (four instances) × 64 goroutines on one
// key of 1000 per minute with budget 100. They admit at most 1000 and, as
// every goroutine keeps asking until it is refused, at least 1000 − 4×100;
// the store saw one call per budget, not one per decision.
func TestNeverOverAdmits(t *testing.T) {
	for _, l := range []weir.Limit{
		{Algorithm: weir.FixedWindow, Rate: 1000, Period: time.Minute},
		{Algorithm: weir.SlidingWindow, Rate: 1000, Period: time.Minute},
		{Algorithm: weir.SlidingWindow, Rate: 1000, Period: time.Minute, Buckets: 6},
	} {
		c := newClock()
		st := &counting{Store: memstore.New(memstore.WithClock(c.now))}
		const instances, goroutines, size = 4, 64, 100
		var admitted atomic.Int64
		var wg sync.WaitGroup
		tables := make([]*localbudget.Table, instances)
		for i := range tables {
			tables[i] = localbudget.New(localbudget.Config{Now: c.now})
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						r, err := tables[i].Take(context.Background(), st, "k", l, 1, size)
						if err != nil {
							t.Error(err)
							return
						}
						if !r.Allowed {
							return
						}
						admitted.Add(r.Granted)
					}
				}()
			}
		}
		wg.Wait()
		got := admitted.Load()
		if got > l.Rate || got < l.Rate-instances*size {
			t.Errorf("%v: admitted %d, want %d..%d", l, got, l.Rate-instances*size, l.Rate)
		}
		var held int64
		for _, tb := range tables {
			s := tb.Stats()
			held += s.Taken - s.Spent
		}
		if got+held != l.Rate {
			t.Errorf("%v: admitted %d + held %d != %d debited", l, got, held, l.Rate)
		}
		// One call per budget, plus at most one refused call per instance
		// (the refusal is remembered) and the partial budgets at the end.
		if n := st.calls.Load(); n > l.Rate/size+2*instances {
			t.Errorf("%v: %d store calls for %d admitted", l, n, got)
		}
		t.Logf("%v: admitted %d, held back %d, %d store calls", l.Algorithm, got, held, st.calls.Load())
	}
}

// TestLapsesAtWindowEnd: unspent units lapse when their window ends, and
// the next request takes a new budget in the new window.
func TestLapsesAtWindowEnd(t *testing.T) {
	c := newClock()
	c.add(50 * time.Second) // 10s left in the minute
	st := &counting{Store: memstore.New(memstore.WithClock(c.now))}
	tb := localbudget.New(localbudget.Config{Now: c.now})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Minute}
	ctx := context.Background()
	r, err := tb.Take(ctx, st, "k", l, 1, 10)
	if err != nil || !r.Allowed {
		t.Fatal(r, err)
	}
	// Remaining: the store's 90 after the budget, plus the 9 still held.
	if r.Remaining != 99 || r.Limit != 100 || r.ResetAfter != 10*time.Second {
		t.Errorf("first: %+v, want remaining 99, limit 100, reset after 10s", r)
	}
	c.add(9999 * time.Millisecond)
	if r, _ = tb.Take(ctx, st, "k", l, 1, 10); !r.Allowed || st.calls.Load() != 1 || r.ResetAfter != time.Millisecond {
		t.Fatalf("inside the window: %+v after %d calls, want a local admission", r, st.calls.Load())
	}
	c.add(time.Millisecond) // the window ends: the 8 left lapse
	if r, _ = tb.Take(ctx, st, "k", l, 1, 10); !r.Allowed || st.calls.Load() != 2 {
		t.Fatalf("new window: %+v after %d calls, want a new lease", r, st.calls.Load())
	}
	if s := tb.Stats(); s.Lapsed != 8 || s.Taken != 20 || s.Spent != 3 {
		t.Errorf("stats %+v, want 8 lapsed, 20 taken, 3 spent", s)
	}
	// The store counts only the new window's budget.
	if p, _ := st.Store.Take(ctx, "k", l, 0); p.Remaining != 90 {
		t.Errorf("store remaining %d, want 90", p.Remaining)
	}
}

// TestBucketLifetime: a sliding window with buckets budgets for the rest
// of the current bucket only.
func TestBucketLifetime(t *testing.T) {
	c := newClock()
	c.add(3 * time.Second) // 7s left in the first 10s bucket
	st := &counting{Store: memstore.New(memstore.WithClock(c.now))}
	tb := localbudget.New(localbudget.Config{Now: c.now})
	l := weir.Limit{Algorithm: weir.SlidingWindow, Rate: 100, Period: time.Minute, Buckets: 6}
	ctx := context.Background()
	_, _ = tb.Take(ctx, st, "k", l, 1, 10)
	c.add(7*time.Second - time.Microsecond)
	_, _ = tb.Take(ctx, st, "k", l, 1, 10)
	if st.calls.Load() != 1 {
		t.Fatalf("%d calls inside the bucket, want 1", st.calls.Load())
	}
	c.add(time.Microsecond)
	_, _ = tb.Take(ctx, st, "k", l, 1, 10)
	if st.calls.Load() != 2 || tb.Stats().Lapsed != 8 {
		t.Errorf("next bucket: %d calls, stats %+v; want a new lease and 8 lapsed", st.calls.Load(), tb.Stats())
	}
}

// TestDenialRemembered: once the store has nothing left, the instance
// answers from memory until the store's RetryAfter, then asks again.
func TestDenialRemembered(t *testing.T) {
	c := newClock()
	st := &counting{Store: memstore.New(memstore.WithClock(c.now))}
	tb := localbudget.New(localbudget.Config{Now: c.now})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Minute}
	ctx := context.Background()
	for i := range 10 {
		if r, _ := tb.Take(ctx, st, "k", l, 1, 5); !r.Allowed {
			t.Fatalf("take %d refused", i)
		}
	}
	c.add(30 * time.Second)
	for range 100 {
		r, _ := tb.Take(ctx, st, "k", l, 1, 5)
		if r.Allowed || r.RetryAfter != 30*time.Second || r.Remaining != 0 {
			t.Fatalf("exhausted: %+v, want refused with retry 30s", r)
		}
	}
	if st.calls.Load() != 3 {
		t.Errorf("%d store calls, want 3 (two leases, one refusal)", st.calls.Load())
	}
	c.add(30 * time.Second)
	if r, _ := tb.Take(ctx, st, "k", l, 1, 5); !r.Allowed || st.calls.Load() != 4 {
		t.Errorf("next window: %+v after %d calls", r, st.calls.Load())
	}
	// Forget (a reset) drops the budget and the memory of denials.
	tb.Forget("k", l)
	if s := tb.Stats(); s.Lapsed != 4 || s.Entries != 0 {
		t.Errorf("after Forget: %+v, want 4 lapsed and no entries", s)
	}
}

// TestBounded: a full table decides new keys without a budget, and sweeps
// entries that hold nothing.
func TestBounded(t *testing.T) {
	c := newClock()
	st := &counting{Store: memstore.New(memstore.WithClock(c.now))}
	tb := localbudget.New(localbudget.Config{Now: c.now, MaxEntries: 2})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Second}
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if r, err := tb.Take(ctx, st, k, l, 1, 5); err != nil || !r.Allowed {
			t.Fatal(k, r, err)
		}
	}
	if s := tb.Stats(); s.Entries != 2 || s.Bypassed != 1 {
		t.Errorf("full: %+v, want 2 entries and 1 bypassed", s)
	}
	c.add(2 * time.Second) // a and b lapse; the next new key sweeps them
	if _, err := tb.Take(ctx, st, "d", l, 1, 5); err != nil {
		t.Fatal(err)
	}
	if s := tb.Stats(); s.Entries != 1 || s.Lapsed != 8 {
		t.Errorf("after the sweep: %+v, want 1 entry, 8 lapsed", s)
	}
}

// TestPassThrough: peeks, algorithms without budgets and impossible costs
// go to the store as they are.
func TestPassThrough(t *testing.T) {
	st := memstore.New()
	tb := localbudget.New(localbudget.Config{})
	ctx := context.Background()
	g := weir.Limit{Algorithm: weir.GCRA, Rate: 10, Period: time.Second}
	if r, err := tb.Take(ctx, st, "k", g, 1, 5); err != nil || !r.Allowed || r.Remaining != 9 {
		t.Errorf("gcra: %+v %v, want the store's own answer", r, err)
	}
	fw := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Second}
	if _, err := tb.Take(ctx, st, "k", fw, 11, 5); err == nil {
		t.Error("cost 11 of 10: no error")
	}
	if s := tb.Stats(); s.Entries != 0 {
		t.Errorf("%+v: pass-through made entries", s)
	}
	if localbudget.Supports(weir.GCRA) || !localbudget.Supports(weir.FixedWindow) || !localbudget.Supports(weir.SlidingWindow) {
		t.Error("Supports disagrees with the algorithm table")
	}
	if localbudget.Size(100, fw, 4) != 2 || localbudget.Size(100, weir.Limit{Rate: 1000}, 4) != 100 || localbudget.Size(5, weir.Limit{Rate: 3}, 10) != 1 {
		t.Error("Size")
	}
}

// TestGive: units given back are spent again in their own window, and
// lapse once it has ended.
func TestGive(t *testing.T) {
	c := newClock()
	st := &counting{Store: memstore.New(memstore.WithClock(c.now))}
	tb := localbudget.New(localbudget.Config{Now: c.now})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Minute}
	ctx := context.Background()
	var tks []localbudget.Ticket
	for range 10 {
		r, tk, err := tb.TakeTicket(ctx, st, "k", l, 1, 10)
		if err != nil || !r.Allowed {
			t.Fatal(r, err)
		}
		tks = append(tks, tk)
	}
	tb.Give(tks[0])
	if r, _ := tb.Take(ctx, st, "k", l, 1, 10); !r.Allowed || st.calls.Load() != 1 {
		t.Fatalf("a given-back unit: %+v after %d calls, want admitted from the lease", r, st.calls.Load())
	}
	c.add(time.Minute)
	tb.Give(tks[1]) // its window is over: it lapses
	if s := tb.Stats(); s.Spent != 9 || s.Lapsed != 1 {
		t.Errorf("stats %+v, want 9 spent and 1 lapsed", s)
	}
	tb.Give(localbudget.Ticket{}) // the zero Ticket gives nothing
}

// slow advances the clock while a call is out, once.
type slow struct {
	weir.Store
	c     *clock
	delay time.Duration
	calls atomic.Int64
}

func (s *slow) Do(ctx context.Context, reqs []weir.Request, out []weir.Result) error {
	err := s.Store.Do(ctx, reqs, out)
	if s.calls.Add(1) == 1 {
		s.c.add(s.delay)
	}
	return err
}

// TestLateLease: when the window ends while the budget call is out, the
// units lapse at once and the request asks again in the new window,
// instead of being refused under a limit that was never reached.
func TestLateLease(t *testing.T) {
	c := newClock()
	c.add(time.Minute - time.Millisecond)
	st := &slow{Store: memstore.New(memstore.WithClock(c.now)), c: c, delay: 2 * time.Millisecond}
	tb := localbudget.New(localbudget.Config{Now: c.now})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Minute}
	r, err := tb.Take(context.Background(), st, "k", l, 1, 10)
	if err != nil || !r.Allowed || st.calls.Load() != 2 {
		t.Fatalf("%+v %v after %d calls, want admitted from a second lease", r, err, st.calls.Load())
	}
	if s := tb.Stats(); s.Lapsed != 10 || s.Taken != 20 || s.Spent != 1 {
		t.Errorf("stats %+v, want the late 10 lapsed, 20 taken, 1 spent", s)
	}
}
