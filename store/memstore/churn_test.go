package memstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/storetest"
)

// TestExactUnderChurn: decisions on a few hot keys stay exact while, in
// the same shard, other goroutines insert and delete keys, so that the
// table grows, shrinks and shifts slots back under them, and batches and
// releases take the shard's lock. The clock stands still, so under a
// limit of 1,000 each hot key and algorithm admits exactly 1,000 of its
// events (at least 2,400, until the churn has gone round 20 times): one
// more means a decision was lost or run on a moved or stale slot. Under
// -race, a path that reads or writes a slot outside the shard's lock (as
// an experiment with per-slot locks did) shows here too.
func TestExactUnderChurn(t *testing.T) {
	algs := [...]weir.Algorithm{weir.FixedWindow, weir.TokenBucket, weir.GCRA, weir.LeakyBucket, weir.SlidingWindow}
	const (
		rate     = 1000
		deciders = 6
		tries    = 400 // at least, per decider, hot key and algorithm
		rounds   = 20  // at least, of the churn, while the deciders decide
		hot      = 3
	)
	clock := storetest.NewClock(storetest.Epoch)
	s := New(WithClock(clock.Now), WithShards(1))
	ctx := context.Background()
	limit := func(a weir.Algorithm) weir.Limit {
		return weir.Limit{Algorithm: a, Rate: rate, Period: time.Hour}
	}
	var admitted, made [hot][len(algs)]atomic.Int64
	var churned atomic.Int64
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churnErr := make(chan error, 3)
	for g := range 2 {
		churn.Add(1)
		go func() {
			defer churn.Done()
			l := limit(weir.FixedWindow)
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Enough keys to double the table a few times, then all
				// gone again, so that it shrinks.
				for i := range 600 {
					if _, err := s.Take(ctx, fmt.Sprint("churn", g, "-", i), l, 1); err != nil {
						churnErr <- err
						return
					}
				}
				for i := range 600 {
					if err := weir.NewLimiter(s).Reset(ctx, fmt.Sprint("churn", g, "-", i), l); err != nil {
						churnErr <- err
						return
					}
				}
				churned.Add(1)
			}
		}()
	}
	churn.Add(1)
	go func() { // batches and releases: other paths under the shard's lock
		defer churn.Done()
		reqs := []weir.Request{{Key: "batch-a", Limit: limit(weir.GCRA), N: 1}, {Key: "batch-b", Limit: limit(weir.TokenBucket), N: 1}}
		res := make([]weir.Result, len(reqs))
		conc := weir.Limit{Algorithm: weir.Concurrency, Rate: 5, Period: time.Minute}
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.Do(ctx, reqs, res); err != nil {
				churnErr <- err
				return
			}
			if _, err := s.Take(ctx, "batch-c", conc, 1); err != nil {
				churnErr <- err
				return
			}
			if err := s.Do(ctx, []weir.Request{{Key: "batch-c", Limit: conc, Mode: weir.ModeRelease, Lease: ""}}, make([]weir.Result, 1)); err != nil {
				churnErr <- err
				return
			}
		}
	}()

	var deciding sync.WaitGroup
	for range deciders {
		deciding.Add(1)
		go func() {
			defer deciding.Done()
			// A churn goroutine that failed stops churning: stop too.
			for i := 0; i < tries || churned.Load() < rounds && len(churnErr) == 0; i++ {
				for k := range hot {
					for a, alg := range algs {
						r, err := s.Take(ctx, fmt.Sprint("hot", k), limit(alg), 1)
						if err != nil {
							t.Error(err)
							return
						}
						made[k][a].Add(1)
						if r.Allowed {
							admitted[k][a].Add(1)
						}
					}
				}
			}
		}()
	}
	deciding.Wait()
	close(stop)
	churn.Wait()
	select {
	case err := <-churnErr:
		t.Fatal(err)
	default:
	}
	for k := range hot {
		for a, alg := range algs {
			if got := admitted[k][a].Load(); got != rate {
				t.Errorf("hot%d under %s: %d of %d events admitted under a limit of %d", k, alg, got, made[k][a].Load(), rate)
			}
		}
	}
	checkTable(t, s)
}
