package guard

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// gateStore holds every call until its gate opens, then fails it: one
// slow call to Redis failing every decision coalesced into it.
type gateStore struct {
	gate     chan struct{}
	inFlight atomic.Int64
}

func (s *gateStore) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	s.inFlight.Add(1)
	<-s.gate
	return weir.Result{}, errDown
}

func (s *gateStore) Do(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	_, err := s.Take(ctx, "", weir.Limit{}, 0)
	return err
}

// TestBreakerCountsAnIncidentOnce: 64 calls in flight together that fail
// together (a coalesced batch whose one call to Redis failed) are one
// failure, not 64: the breaker stays closed. Failures one after another
// still open it: the incident and four more are the five of
// Breaker.Failures.
func TestBreakerCountsAnIncidentOnce(t *testing.T) {
	st := &gateStore{gate: make(chan struct{})}
	g := New(st, Config{Timeout: time.Minute, Breaker: BreakerConfig{Failures: 5, FailureRatio: 2}, Logger: slog.New(&countingHandler{})})
	l := weir.PerMinute(weir.GCRA, 100)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 64 {
		wg.Go(func() {
			if _, err := g.Take(context.Background(), "k", l, 1); errors.Is(err, errDown) {
				failed.Add(1)
			}
		})
	}
	waitFor(t, 10*time.Second, "64 calls in the store", func() bool { return st.inFlight.Load() == 64 })
	close(st.gate)
	wg.Wait()
	if failed.Load() != 64 || g.Failures() != 64 {
		t.Fatalf("%d calls failed, %d failures counted in all; want 64 and 64", failed.Load(), g.Failures())
	}
	if g.State() != BreakerClosed {
		t.Fatalf("one incident of 64 calls in flight together opened the breaker (Failures: 5): %v", g.State())
	}
	// The incident counted once; four more failures, one after another,
	// make the five that open it.
	for i := 1; i <= 4; i++ {
		if _, err := g.Take(context.Background(), "k", l, 1); !errors.Is(err, errDown) {
			t.Fatalf("sequential failure %d: %v", i, err)
		}
		want := BreakerClosed
		if i == 4 {
			want = BreakerOpen
		}
		if g.State() != want {
			t.Fatalf("after the incident and %d failures one after another: %v, want %v", i, g.State(), want)
		}
	}
}
