package denycache

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/redisstore"
	"github.com/weir-dev/weir/storetest"
)

// fleet is several weir instances on one Redis deployment, each a
// redisstore behind its own deny cache, sharing one invalidation channel.
type fleet struct {
	caches []*Store
	stores []*redisstore.Store
	gates  []*herdGate // between each cache and its store (herd_test.go)
}

func newFleet(t *testing.T, n int, cfg redisstore.Config, clock func() time.Time) *fleet {
	t.Helper()
	f := &fleet{}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second // the race detector on 2 loaded cores
	}
	cfg.Clock = clock
	for range n {
		rs, err := redisstore.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		quiet := slog.New(slog.DiscardHandler)
		bus := NewRedisBus(rs.Client(), RedisBusConfig{Channel: cfg.Prefix + ":denycache", Logger: quiet})
		g := &herdGate{Store: rs}
		c, err := New(g, Config{Bus: bus, Clock: clock, Logger: quiet, Timeout: rs.Timeout(), OnRefund: rs.OnRefund})
		if err != nil {
			t.Fatal(err)
		}
		g.cache.Store(c)
		f.gates = append(f.gates, g)
		t.Cleanup(func() { c.Close(); rs.Close() })
		f.caches = append(f.caches, c)
		f.stores = append(f.stores, rs)
	}
	f.waitLive(t)
	return f
}

// waitFor polls cond until it holds, for at most a generous minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (f *fleet) waitLive(t *testing.T) {
	t.Helper()
	for i, c := range f.caches {
		waitFor(t, fmt.Sprintf("instance %d's cache is live", i), c.Live)
	}
}

// resets returns every instance's count of key invalidations.
func (f *fleet) resets() []int64 {
	out := make([]int64, len(f.caches))
	for i, c := range f.caches {
		out[i] = c.t.invalidations[reasonReset].Load()
	}
	return out
}

// reset resets key under l through instance i and waits until every other
// instance has heard of it.
func (f *fleet) reset(t *testing.T, i int, key string, l weir.Limit) {
	t.Helper()
	before := f.resets()
	if err := weir.NewLimiter(f.caches[i]).Reset(context.Background(), key, l); err != nil {
		t.Fatal(err)
	}
	for j, c := range f.caches {
		waitFor(t, fmt.Sprintf("instance %d heard of a reset", j), func() bool {
			return c.t.invalidations[reasonReset].Load() > before[j]
		})
	}
}

var diffLimits = []weir.Limit{
	{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Minute},
	{Algorithm: weir.FixedWindow, Rate: 4, Period: time.Minute, Block: 90 * time.Second},
	{Algorithm: weir.SlidingWindow, Rate: 6, Period: time.Minute},
	{Algorithm: weir.SlidingLog, Rate: 5, Period: time.Minute, Block: 30 * time.Second},
	{Algorithm: weir.TokenBucket, Rate: 5, Period: time.Minute, Burst: 3},
	{Algorithm: weir.LeakyBucket, Rate: 5, Period: time.Minute, Burst: 4},
	{Algorithm: weir.GCRA, Rate: 5, Period: time.Minute, Burst: 3},
	{Algorithm: weir.LeakyBucket, Rate: 5, Period: time.Minute, Burst: 4, MaxDelay: 20 * time.Second},
	{Algorithm: weir.SlidingWindow, Rate: 6, Period: time.Minute, Buckets: 4},
	{Algorithm: weir.TokenBucket, Rate: 5, Period: time.Minute, Burst: 3, Block: 5 * time.Minute},
}

// TestDifferential runs one random workload on three instances with deny
// caches and on a store without one, step for step, on one Redis: every
// decision must agree, so no cached answer is one the store would have
// admitted, and the admitted counts are identical. Resets and unblocks
// (resets of boxed keys) come from random instances in between.
// WEIR_DENYCACHE_SEED and WEIR_DENYCACHE_STEPS (per limit) vary it.
func TestDifferential(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	f := newFleet(t, 3, redisstore.Config{Addrs: []string{srv.Addr}, Prefix: "dc"}, clock.Now)
	plain, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{srv.Addr}, Prefix: "plain", Clock: clock.Now, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	ctx := context.Background()
	seed, steps := uint64(14), 400
	if v, err := strconv.ParseUint(os.Getenv("WEIR_DENYCACHE_SEED"), 10, 64); err == nil {
		seed = v
	}
	if v, err := strconv.Atoi(os.Getenv("WEIR_DENYCACHE_STEPS")); err == nil && v > 0 {
		steps = v
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	keys := []string{"a", "b", "c{x}", ""}
	var admitted, admittedPlain, hits, resets, herds int
	for _, l := range diffLimits {
		p, err := l.Compile()
		if err != nil {
			t.Fatal(err)
		}
		maxCost := min(3, p.MaxCost())
		for step := range steps {
			k := keys[rng.IntN(len(keys))]
			switch r := rng.IntN(100); {
			case r < 20:
				clock.Advance(time.Duration(rng.IntN(20_000_000)) * time.Microsecond)
			case r < 24:
				f.reset(t, rng.IntN(len(f.caches)), k, l)
				if err := weir.NewLimiter(plain).Reset(ctx, k, l); err != nil {
					t.Fatal(err)
				}
				resets++
			case r < 32:
				// A herd: several requests of one cost at once on one
				// instance. If its entry for the key has lapsed, the
				// gate holds the first at the store until the others
				// wait for it (Store.join). They must admit exactly
				// what the same requests one after another admit.
				i := rng.IntN(len(f.caches))
				c, g := f.caches[i], f.gates[i]
				kn := 2 + rng.IntN(5)
				n := rng.Int64N(maxCost) + 1
				h0 := c.Stats().Herd
				g.want.Store(int32(kn - 1))
				got := herd(t, c, kn, k, l, n)
				g.want.Store(0)
				herds += int(c.Stats().Herd - h0)
				var gotAdm, wantAdm int
				var maxRetry time.Duration
				for range kn {
					w, err := plain.Take(ctx, k, l, n)
					if err != nil {
						t.Fatal(err)
					}
					if w.Allowed {
						wantAdm++
					}
					maxRetry = max(maxRetry, w.RetryAfter)
				}
				for _, r := range got {
					if r.Allowed {
						gotAdm++
					} else if r.RetryAfter <= 0 || r.RetryAfter > maxRetry {
						t.Fatalf("%s step %d herd of %d on key %q cost %d: a denial %+v, the store's longest RetryAfter %v", l, step, kn, k, n, r, maxRetry)
					}
				}
				if gotAdm != wantAdm {
					t.Fatalf("%s step %d herd of %d on key %q cost %d: %d admitted, the store one by one %d", l, step, kn, k, n, gotAdm, wantAdm)
				}
				admitted += gotAdm
				admittedPlain += wantAdm
			default:
				c := f.caches[rng.IntN(len(f.caches))]
				n := rng.Int64N(maxCost) + 1
				if r < 27 {
					n = 0
				}
				h0 := c.hits()
				// Half the decisions go as a batch of one, as policy sends
				// them, some granting at most n.
				batch, atMost := rng.IntN(2) == 0, rng.IntN(4) == 0
				var got, want weir.Result
				if batch {
					req := []weir.Request{{Key: k, Limit: l, N: n}}
					if atMost && n > 0 {
						req[0].Mode = weir.ModeAtMost
					}
					var res [1]weir.Result
					if err := c.Do(ctx, req, res[:]); err != nil {
						t.Fatal(err)
					}
					got = res[0]
					if err := plain.Do(ctx, req, res[:]); err != nil {
						t.Fatal(err)
					}
					want = res[0]
				} else {
					var err error
					if got, err = c.Take(ctx, k, l, n); err != nil {
						t.Fatal(err)
					}
					if want, err = plain.Take(ctx, k, l, n); err != nil {
						t.Fatal(err)
					}
				}
				hit := c.hits() > h0
				if hit {
					hits++
				}
				if got.Allowed != want.Allowed || got.Granted != want.Granted {
					t.Fatalf("%s step %d key %q cost %d (cached answer %v): deny cache says %+v, store %+v", l, step, k, n, hit, got, want)
				}
				if hit && !atMost && (got.Remaining < 0 || got.Remaining >= n || want.Remaining >= n) {
					t.Fatalf("%s step %d key %q cost %d: cached Remaining %d, store's %d: not both in 0..%d", l, step, k, n, got.Remaining, want.Remaining, n-1)
				}
				if got.Allowed && n > 0 {
					admitted++
				}
				if want.Allowed && n > 0 {
					admittedPlain++
				}
				if !got.Allowed && (got.RetryAfter > want.RetryAfter || got.RetryAfter <= 0 || got.ResetAfter > want.ResetAfter ||
					!got.BlockedUntil.Equal(want.BlockedUntil) || got.Limit != want.Limit) {
					t.Fatalf("%s step %d key %q cost %d (cached answer %v): denial %+v, store's %+v", l, step, k, n, hit, got, want)
				}
			}
		}
	}
	if admitted != admittedPlain || hits < 100 || resets < 50 || herds < 10 {
		t.Fatalf("admitted %d vs %d, %d cached answers, %d resets, %d herd answers: the workload did not exercise the cache", admitted, admittedPlain, hits, resets, herds)
	}
	t.Logf("%d admitted, %d answered from a cache, %d of them waiting for a herd's leader, %d resets", admitted, hits, herds, resets)
	for i, g := range f.gates {
		if n := g.late.Load(); n > 0 {
			t.Logf("instance %d: %d herds' leaders went ahead before their waiters joined (%d subscription flushes)", i, n, f.caches[i].Stats().Invalidations["subscription"])
		}
	}
}

// TestFloodExact: many goroutines on three instances flood one key with a
// frozen clock; exactly the limit is admitted, as without the cache, and
// most denials come from memory.
func TestFloodExact(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	f := newFleet(t, 3, redisstore.Config{Addrs: []string{srv.Addr}, Prefix: "flood"}, clock.Now)
	flood(t, f, weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Hour})
	f.reset(t, 1, "flood", weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Hour})
	flood(t, f, weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Hour})
}

func flood(t *testing.T, f *fleet, l weir.Limit) {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var h0 int64
	for _, c := range f.caches {
		h0 += c.hits()
	}
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := f.caches[g%len(f.caches)]
			for range 100 {
				r, err := c.Take(context.Background(), "flood", l, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	var hits int64
	for _, c := range f.caches {
		hits += c.hits()
	}
	if got := admitted.Load(); got != l.Rate {
		t.Fatalf("admitted %d of 2400 under a limit of %d", got, l.Rate)
	}
	if hits-h0 < 1000 {
		t.Fatalf("only %d of 2300 denials answered from memory", hits-h0)
	}
}

// TestSubscriptionLost kills the cache's subscriber connection: the cache
// is emptied and bypassed, and comes back once subscribed again.
func TestSubscriptionLost(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	f := newFleet(t, 1, redisstore.Config{Addrs: []string{srv.Addr}, Prefix: "lost"}, clock.Now)
	c := f.caches[0]
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	for range 3 {
		if _, err := c.Take(context.Background(), "k", l, 1); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.Entries != 1 || st.Hits != 1 {
		t.Fatalf("before: %+v", st)
	}
	before := c.Stats().Invalidations["subscription"]
	if _, err := srv.Do("CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
		t.Fatal(err)
	}
	// Down (emptied), then up again (emptied once more).
	waitFor(t, "the cache saw its subscription lost and back", func() bool {
		return c.Stats().Invalidations["subscription"] >= before+2 && c.Live()
	})
	if st := c.Stats(); st.Entries != 0 {
		t.Fatalf("entries survived a lost subscription: %+v", st)
	}
	if r, _ := c.Take(context.Background(), "k", l, 1); r.Allowed {
		t.Fatal("admitted over the limit")
	}
}

// crossInstance: a denial cached on one instance is answered from memory,
// and a reset on another instance reaches it through pub/sub.
func crossInstance(t *testing.T, f *fleet, prefix string) {
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.GCRA, Rate: 2, Period: time.Hour, Block: time.Hour}
	a, b := f.caches[0], f.caches[1]
	for _, key := range []string{prefix + "tenant-1", prefix + "tenant-2"} { // two slots on a cluster
		for range 2 {
			if r, err := a.Take(ctx, key, l, 1); err != nil || !r.Allowed {
				t.Fatalf("%+v %v", r, err)
			}
		}
		den, err := a.Take(ctx, key, l, 1)
		if err != nil || den.Allowed || den.BlockedUntil.IsZero() {
			t.Fatalf("want a boxed denial, got %+v %v", den, err)
		}
		h := a.Stats().Hits
		if r, _ := a.Take(ctx, key, l, 1); r.Allowed || a.Stats().Hits != h+1 {
			t.Fatal("the denial was not answered from memory")
		}
		f.reset(t, 1, key, l) // an unblock on the other instance
		if r, err := a.Take(ctx, key, l, 1); err != nil || !r.Allowed {
			t.Fatalf("after an unblock elsewhere: %+v %v", r, err)
		}
		if r, err := b.Take(ctx, key, l, 1); err != nil || !r.Allowed {
			t.Fatalf("after an unblock: %+v %v", r, err)
		}
	}
}

func TestCluster(t *testing.T) {
	c := redistest.Cluster(t)
	clock := storetest.NewClock(storetest.Epoch)
	f := newFleet(t, 2, redisstore.Config{Addrs: c.Addrs, Prefix: "cl"}, clock.Now)
	crossInstance(t, f, "")
	clusterMigration(t, c, f)
	crossSlotRefund(t, c, f)
}

// crossSlotRefund: a batch of two rules whose keys lie on two Cluster
// nodes, one of which rejects, takes from the other key and then gives it
// back. Another instance denied on that key in between must not keep the
// denial once the refund is done: the slow node is paused so that the
// denial lands in that gap every time. Without redisstore's OnRefund
// reaching the caches, instance 1 would deny its last take from memory
// although Redis has room.
func crossSlotRefund(t *testing.T, c *redistest.ClusterGroup, f *fleet) {
	ctx := context.Background()
	la := weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Hour}
	lb := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	// Two keys (each its own hash tag) on two different nodes.
	keyA, keyB := "refund-a", ""
	slotOf := func(key string) int {
		v, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
		if err != nil {
			t.Fatal(err)
		}
		return int(v.(int64))
	}
	nodeA := c.NodeForSlot(slotOf(keyA))
	var nodeB *redistest.Server
	for i := range 100 {
		k := "refund-b" + strconv.Itoa(i)
		if n := c.NodeForSlot(slotOf(k)); n != nodeA {
			keyB, nodeB = k, n
			break
		}
	}
	if nodeB == nil {
		t.Fatal("no key on another node")
	}
	a, b := f.caches[0], f.caches[1]
	// keyA: one unit left; keyB: none.
	for _, tk := range []struct {
		key string
		l   weir.Limit
	}{{keyA, la}, {keyB, lb}} {
		if r, err := a.Take(ctx, tk.key, tk.l, 1); err != nil || !r.Allowed {
			t.Fatalf("setting up %s: %+v %v", tk.key, r, err)
		}
	}
	// Pause keyB's node: the batch's take on keyA runs, its take on keyB
	// waits, and so does the refund.
	if _, err := nodeB.Do("CLIENT", "PAUSE", "1500", "WRITE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var res [2]weir.Result
	go func() {
		done <- a.Do(ctx, []weir.Request{{Key: keyA, Limit: la, N: 1}, {Key: keyB, Limit: lb, N: 1}}, res[:])
	}()
	// Once the batch's take has spent keyA's last unit (a peek on the
	// store itself, past the caches, says so), instance 1 asks for it and
	// is denied: that denial is cached.
	waitFor(t, "the batch's take on keyA", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the batch ended before its take on keyA was seen (%v): the pause did not hold it", err)
		default:
		}
		r, err := f.stores[1].Take(ctx, keyA, la, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r.Remaining == 0
	})
	if r, err := b.Take(ctx, keyA, la, 1); err != nil || r.Allowed {
		t.Fatalf("instance 1 during the batch: %+v %v", r, err)
	}
	if h := b.Stats().Hits; func() bool { r, err := b.Take(ctx, keyA, la, 1); return err != nil || r.Allowed }() || b.Stats().Hits != h+1 {
		t.Fatal("instance 1 did not cache its denial of keyA")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res[1].Allowed {
		t.Fatalf("keyB admitted although it had no room: %+v", res)
	}
	// The refund gave keyA's unit back: instance 1 must take it.
	waitFor(t, "instance 1 is admitted on keyA after the refund", func() bool {
		r, err := b.Take(ctx, keyA, la, 1)
		if err != nil {
			t.Fatal(err)
		}
		return r.Allowed
	})
	if r, err := b.Take(ctx, keyA, la, 1); err != nil || r.Allowed {
		t.Fatalf("keyA admitted beyond its limit: %+v %v", r, err)
	}
}

// clusterMigration floods one key from two instances while its slot moves
// between nodes four times: never more than the limit is admitted, and
// the denials keep coming from memory.
func clusterMigration(t *testing.T, c *redistest.ClusterGroup, f *fleet) {
	const key = "migrating"
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Hour}
	v, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key) // the hash tag is the key itself
	if err != nil {
		t.Fatal(err)
	}
	slot := int(v.(int64))
	hits := func() int64 { return f.caches[0].hits() + f.caches[1].hits() }
	before := hits() // crossInstance's own denials from memory
	var admitted, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := f.caches[g%2].Take(context.Background(), key, l, 1)
				switch {
				case err != nil:
					failed.Add(1)
				case r.Allowed:
					admitted.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	from := c.NodeForSlot(slot)
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	for i := range 4 {
		time.Sleep(100 * time.Millisecond)
		if err := c.MigrateSlot(slot, from, to); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("migration %d: %v", i, err)
		}
		from, to = to, from
	}
	// The flood goes on until the key's denials come from memory: on a
	// loaded machine the migrations may end before it has spent the limit.
	waitFor(t, "denials of the migrated key answered from memory", func() bool { return hits() > before })
	close(stop)
	wg.Wait()
	// A failed call may or may not have consumed; none may admit more.
	if got := admitted.Load(); got > l.Rate || got < l.Rate-failed.Load() {
		t.Fatalf("%d admitted under a limit of %d (%d failed calls)", got, l.Rate, failed.Load())
	}
	f.reset(t, 1, key, l)
	if r, err := f.caches[0].Take(context.Background(), key, l, 1); err != nil || !r.Allowed {
		t.Fatalf("after a reset: %+v %v", r, err)
	}
}

// TestSentinel: the caches work under Sentinel, and after a failover they
// come back subscribed to the new master and still hear resets.
func TestSentinel(t *testing.T) {
	g := redistest.Sentinel(t)
	clock := storetest.NewClock(storetest.Epoch)
	f := newFleet(t, 2, redisstore.Config{Addrs: g.SentinelAddrs, MasterName: g.MasterName, Prefix: "se"}, clock.Now)
	crossInstance(t, f, "before-")
	before := []int64{f.caches[0].t.invalidations[reasonBypass].Load(), f.caches[1].t.invalidations[reasonBypass].Load()}
	if err := g.Failover(); err != nil {
		t.Fatal(err)
	}
	for i, c := range f.caches {
		waitFor(t, fmt.Sprintf("instance %d resubscribed after the failover", i), func() bool {
			return c.t.invalidations[reasonBypass].Load() >= before[i]+2 && c.Live()
		})
	}
	// The stores follow the new master on their own; give them the time.
	waitFor(t, "the stores write to the new master", func() bool {
		_, err := f.caches[0].Take(context.Background(), "probe", weir.Limit{Algorithm: weir.FixedWindow, Rate: 1000, Period: time.Hour}, 1)
		return err == nil
	})
	crossInstance(t, f, "after-")
}
