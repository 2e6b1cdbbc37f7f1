package redisstore

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// TestClusterFailover fails a Cluster primary over to its replica and back
// while 32 goroutines decide on keys of every node, through the node
// batches, single-rule and all-or-nothing batches alike. A coordinated
// failover loses no write, so the store must stay exact: never more than
// the limit admitted, and the state must account for every admission. The
// demoted primary refuses the node batches it still gets (READONLY: they
// declare no keys, so Redis does not redirect them); the store must send
// them again to the new primary, and no decision may fail.
func TestClusterFailover(t *testing.T) {
	c := redistest.Cluster(t)
	replica := c.AddReplica(t, c.Nodes[0])
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "fo", Timeout: 20 * time.Second})
	ctx := context.Background()
	var keys []string
	for i, n := range c.Nodes {
		keys = append(keys, keysOnNode(c, n, "fo"+string(rune('a'+i)), 4, -1)...)
	}
	const limit = 400
	limits := []weir.Limit{
		{Algorithm: weir.FixedWindow, Rate: limit, Period: 24 * time.Hour},
		{Algorithm: weir.SlidingLog, Rate: limit, Period: time.Hour},
		{Algorithm: weir.GCRA, Rate: limit, Period: 24 * time.Hour},
		{Algorithm: weir.TokenBucket, Rate: limit, Period: 24 * time.Hour},
	}
	lim := func(k int) weir.Limit { return limits[k%len(limits)] }
	admitted := make([]atomic.Int64, len(keys))
	var made, failures atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res [2]weir.Result
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (g*7 + i) % len(keys)
				var err error
				if g%4 == 0 {
					// Two keys of (mostly) different nodes, all or nothing.
					k2 := (k + 5) % len(keys)
					err = s.TakeAll(ctx, []weir.Request{{Key: keys[k], Limit: lim(k), N: 1}, {Key: keys[k2], Limit: lim(k2), N: 1}}, res[:])
					if err == nil && res[0].Allowed && res[1].Allowed {
						admitted[k].Add(1)
						admitted[k2].Add(1)
					}
				} else {
					res[0], err = s.Take(ctx, keys[k], lim(k), 1)
					admitted[k].Add(res[0].Granted)
				}
				made.Add(1)
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	waitMade := func(n int64) {
		deadline := time.Now().Add(30 * time.Second)
		for made.Load() < n && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
	}
	promoted := replica
	for i := range 2 {
		waitMade(int64(400 * (i + 1)))
		if err := c.Failover(promoted); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("failover %d: %v", i, err)
		}
		promoted = c.Replicas[0] // the demoted primary, promoted back next
	}
	waitMade(made.Load() + 400)
	close(stop)
	wg.Wait()
	batches, decisions := s.batchStats()
	t.Logf("2 failovers: %d decisions in %d node batches, %d sent again alone, %d retried after a refusal, %d failed (first: %v)",
		decisions, batches, s.nodes.resent.Load(), s.notRunRetries.Load(), failures.Load(), firstErr.Load())
	if failures.Load() != 0 {
		t.Errorf("%d decisions failed (first: %v)", failures.Load(), firstErr.Load())
	}
	for i, k := range keys {
		got := admitted[i].Load()
		if got > limit {
			t.Errorf("%s (%s): %d admitted, limit %d", k, lim(i).Algorithm, got, limit)
		}
		r, err := s.Take(ctx, k, lim(i), 0)
		if err != nil {
			t.Fatal(err)
		}
		if used := limit - r.Remaining; used != got {
			t.Errorf("%s (%s): %d used per the state, %d reported admitted", k, lim(i).Algorithm, used, got)
		}
	}
}
