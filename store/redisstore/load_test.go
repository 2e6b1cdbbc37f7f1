package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
)

// clusterLoad is goroutines deciding on keys until halted, each key under
// one of five algorithms with the same limit, counting what each key was
// reported to admit, so that a test can move the cluster under it
// (nodeMigrationUnderLoad, TestClusterFailover) and then check that the
// store stayed exact.
type clusterLoad struct {
	s        *Store
	keys     []string
	limit    int64
	admitted []atomic.Int64
	made     atomic.Int64
	failures atomic.Int64
	firstErr atomic.Value
	stop     chan struct{}
	wg       sync.WaitGroup
}

// startLoad starts n goroutines on keys under limit. With batches, every
// fourth goroutine sends all-or-nothing batches of two keys instead of
// single decisions.
func startLoad(s *Store, keys []string, limit int64, n int, batches bool) *clusterLoad {
	l := &clusterLoad{s: s, keys: keys, limit: limit, admitted: make([]atomic.Int64, len(keys)), stop: make(chan struct{})}
	ctx := context.Background()
	for g := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var res [2]weir.Result
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				k := (g + i) % len(keys)
				var err error
				if batches && g%4 == 0 {
					k2 := (k + 5) % len(keys)
					err = s.Do(ctx, []weir.Request{{Key: keys[k], Limit: l.lim(k), N: 1}, {Key: keys[k2], Limit: l.lim(k2), N: 1}}, res[:])
					if err == nil && res[0].Allowed && res[1].Allowed {
						l.admitted[k].Add(1)
						l.admitted[k2].Add(1)
					}
				} else {
					res[0], err = s.Take(ctx, keys[k], l.lim(k), 1)
					l.admitted[k].Add(res[0].Granted)
				}
				l.made.Add(1)
				if err != nil {
					l.failures.Add(1)
					l.firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	return l
}

// lim is key k's limit.
func (l *clusterLoad) lim(k int) weir.Limit {
	switch k % 5 {
	case 0:
		return weir.Limit{Algorithm: weir.SlidingLog, Rate: l.limit, Period: time.Hour}
	case 1:
		return weir.Limit{Algorithm: weir.GCRA, Rate: l.limit, Period: 24 * time.Hour}
	case 2:
		return weir.Limit{Algorithm: weir.TokenBucket, Rate: l.limit, Period: 24 * time.Hour}
	case 3:
		return weir.Limit{Algorithm: weir.Concurrency, Rate: l.limit, Period: 24 * time.Hour}
	}
	return weir.Limit{Algorithm: weir.FixedWindow, Rate: l.limit, Period: 24 * time.Hour}
}

// waitMade lets the load build: it returns once n decisions were made (or
// after 30 s).
func (l *clusterLoad) waitMade(n int64) {
	deadline := time.Now().Add(30 * time.Second)
	for l.made.Load() < n && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
}

// halt stops the goroutines and waits for them.
func (l *clusterLoad) halt() {
	close(l.stop)
	l.wg.Wait()
}

// check halts the load, logs what happened during what, and fails the test
// if a decision failed, a key admitted more than its limit, or a key's state
// does not hold exactly what was reported admitted (a decision ran twice or
// was lost).
func (l *clusterLoad) check(t *testing.T, what string) {
	t.Helper()
	l.halt()
	batches, decisions := l.s.batchStats()
	t.Logf("%s: %d decisions in %d node batches, %d sent again alone, %d retried after a refusal, %d failed (first: %v)",
		what, decisions, batches, l.s.nodes.resent.Load(), l.s.notRunRetries.Load(), l.failures.Load(), l.firstErr.Load())
	if l.failures.Load() != 0 {
		t.Errorf("%d decisions failed (first: %v)", l.failures.Load(), l.firstErr.Load())
	}
	for i, k := range l.keys {
		got := l.admitted[i].Load()
		if got > l.limit {
			t.Errorf("%s (%s): %d admitted, limit %d", k, l.lim(i).Algorithm, got, l.limit)
		}
		r, err := l.s.Take(context.Background(), k, l.lim(i), 0)
		if err != nil {
			t.Fatal(err)
		}
		if used := l.limit - r.Remaining; used != got {
			t.Errorf("%s (%s): %d used per the state, %d reported admitted", k, l.lim(i).Algorithm, used, got)
		}
	}
}
