package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// TestCluster runs everything cluster-specific against one 3-primary
// Redis Cluster.
func TestCluster(t *testing.T) {
	c := redistest.Cluster(t)
	t.Run("Conformance", func(t *testing.T) { storetest.Run(t, harness(c.Addrs)) })
	t.Run("SameAsMemstore", func(t *testing.T) { sameAsMemstore(t, c.Addrs, sameSteps(t, 600)) })
	t.Run("KeySlots", func(t *testing.T) { clusterKeySlots(t, c) })
	t.Run("Spread", func(t *testing.T) { clusterSpread(t, c) })
	t.Run("SameSlotBatch", func(t *testing.T) { clusterSameSlotBatch(t, c) })
	t.Run("CrossSlotRefund", func(t *testing.T) { clusterCrossSlotRefund(t, c) })
	t.Run("StampedBatch", func(t *testing.T) { clusterStampedBatch(t, c) })
	t.Run("RefundThenLoweredLimit", func(t *testing.T) { clusterRefundThenLoweredLimit(t, c) })
	t.Run("WarmupRefund", func(t *testing.T) { clusterWarmupRefund(t, c) })
	t.Run("Library", func(t *testing.T) { clusterLibrary(t, c) })
	t.Run("Migration", func(t *testing.T) { clusterMigration(t, c) })
	t.Run("Linger", func(t *testing.T) { clusterLinger(t, c) })
}

// clusterLinger: with a linger, the node queues' calls carry several
// decisions each, and every key, on every node, admits exactly its limit.
func clusterLinger(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "linger", Linger: 2 * time.Millisecond})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 20, Period: time.Hour}
	const keys, per = 12, 50
	var admitted [keys]atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < keys*per; i = next.Add(1) - 1 {
				r, err := s.Take(context.Background(), fmt.Sprintf("user-%d", i%keys), l, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Allowed {
					admitted[i%keys].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for k := range admitted {
		if n := admitted[k].Load(); n != l.Rate {
			t.Errorf("key user-%d admitted %d, want %d", k, n, l.Rate)
		}
	}
	b, d := s.batchStats()
	if d == 0 || b >= d {
		t.Fatalf("%d decisions in %d node calls: nothing coalesced", d, b)
	}
	t.Logf("%d decisions in %d node calls", d, b)
}

func keyslot(t *testing.T, c *redistest.ClusterGroup, key string) int64 {
	t.Helper()
	v, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %q: %v", trunc(key), err)
	}
	return v.(int64)
}

// clusterKeySlots: every crafted identity's state and penalty-box keys land
// in the slot of its own hash tag, as Redis itself computes it, and the
// store's own CRC16 agrees with Redis.
func clusterKeySlots(t *testing.T, c *redistest.ClusterGroup) {
	s := &Store{prefix: "weir"}
	for _, k := range craftedKeys() {
		n := s.names(k, "sliding_log")
		want := keyslot(t, c, n.tag)
		if got := keyslot(t, c, n.state); got != want {
			t.Fatalf("key %q: state key %q in slot %d, its tag %q in %d", trunc(k), trunc(n.state), got, trunc(n.tag), want)
		}
		if got := keyslot(t, c, n.block); got != want {
			t.Fatalf("key %q: penalty-box key in slot %d, want %d", trunc(k), got, want)
		}
		if got := int64(slot(n.tag)); got != want {
			t.Fatalf("key %q: slot() says %d, Redis %d", trunc(k), got, want)
		}
	}
}

// countKeys counts the keys matching pattern on one node with SCAN.
func countKeys(t *testing.T, n *redistest.Server, pattern string) int64 {
	t.Helper()
	var count int64
	cursor := "0"
	for {
		v, err := n.Do("SCAN", cursor, "MATCH", pattern, "COUNT", "1000")
		if err != nil {
			t.Fatal(err)
		}
		page := v.([]any)
		cursor = page[0].(string)
		count += int64(len(page[1].([]any)))
		if cursor == "0" {
			return count
		}
	}
}

// clusterSpread: 300 keys spread over all three primaries (counted with
// SCAN on each node, since other subtests' keys expire meanwhile).
func clusterSpread(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "spread"})
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
	for i := range 300 {
		if _, err := s.Take(context.Background(), weir.Key("api", fmt.Sprintf("user-%d", i)), l, 1); err != nil {
			t.Fatal(err)
		}
	}
	var total int64
	for _, n := range c.Nodes {
		got := countKeys(t, n, "spread:*")
		t.Logf("node %s holds %d of the 300 keys", n.Addr, got)
		if got < 50 {
			t.Errorf("node %s holds only %d of 300 keys", n.Addr, got)
		}
		total += got
	}
	if total != 300 {
		t.Errorf("%d keys written for 300 limited keys", total)
	}
}

// sameSlotKeys returns n keys whose tags share one hash slot.
func sameSlotKeys(prefix string, n int) ([]string, uint16) {
	keys := []string{prefix + "-0"}
	want := slot(tagOf(keys[0]))
	for i := 1; len(keys) < n; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if slot(tagOf(k)) == want {
			keys = append(keys, k)
		}
	}
	return keys, want
}

// clusterSameSlotBatch: a batch whose keys share a slot is one script over
// many keys (no CROSSSLOT), under every algorithm at once, and all or
// nothing atomically: an exhausted key in the same slot holds back the rest.
func clusterSameSlotBatch(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "sameslot"})
	ctx := context.Background()
	algos := weir.Algorithms()
	keys, sl := sameSlotKeys("tenant", 2*len(algos)+1)
	reqs := make([]weir.Request, len(algos))
	items := make([]item, len(keys))
	for i, a := range algos {
		reqs[i] = weir.Request{Key: keys[i], Limit: weir.Limit{Algorithm: a, Rate: 3, Period: time.Hour}, N: 1}
		items[i].k = s.names(keys[i], string(a))
	}
	for i := len(algos); i < len(keys); i++ {
		items[i].k = s.names(keys[i], "gcra")
	}
	if g := s.groupBySlot(items); len(g) != 1 {
		t.Fatalf("keys of slot %d split into %d groups", sl, len(g))
	}
	res := make([]weir.Result, len(reqs)+1)
	for round := range 4 {
		if err := s.Do(ctx, reqs, res); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, r := range res[:len(reqs)] {
			if want := round < 3; r.Allowed != want || (want && (r.Granted != 1 || r.Remaining != int64(2-round))) {
				t.Fatalf("round %d, %s: %+v", round, reqs[i].Limit.Algorithm, r)
			}
		}
	}
	// Fresh keys of the slot, plus one exhausted key of the slot.
	narrow := weir.Limit{Algorithm: weir.GCRA, Rate: 1, Period: time.Hour}
	last := keys[len(keys)-1]
	if _, err := s.Take(ctx, last, narrow, 1); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		reqs[i].Key = keys[len(algos)+i]
	}
	reqs = append(reqs, weir.Request{Key: last, Limit: narrow, N: 1})
	if err := s.Do(ctx, reqs, res); err != nil {
		t.Fatal(err)
	}
	if res[len(algos)].Allowed {
		t.Fatalf("exhausted key admitted: %+v", res[len(algos)])
	}
	for i, r := range reqs[:len(algos)] {
		if res[i].Granted != 0 {
			t.Fatalf("%s granted %d in a rejected batch", r.Limit.Algorithm, res[i].Granted)
		}
		if p, err := s.Take(ctx, r.Key, r.Limit, 0); err != nil || p.Remaining != 3 {
			t.Fatalf("%s after a rejected batch: %+v %v, want 3 remaining", r.Limit.Algorithm, p, err)
		}
	}
}

// clusterCrossSlotRefund: a batch over keys in several slots admits all or
// nothing for every algorithm; a rejection refunds the slots that had
// admitted, so nothing stays consumed (checked with peeks).
func clusterCrossSlotRefund(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "refund"})
	ctx := context.Background()
	var refunded []string // OnRefund's calls
	s.OnRefund(func(_ context.Context, key string) { refunded = append(refunded, key) })
	for _, a := range weir.Algorithms() {
		wide := weir.Limit{Algorithm: a, Rate: 10, Period: time.Hour}
		narrow := weir.Limit{Algorithm: a, Rate: 2, Period: time.Hour}
		reqs := []weir.Request{
			{Key: "w1-" + string(a), Limit: wide, N: 2},
			{Key: "w2-" + string(a), Limit: wide, N: 3, Mode: weir.ModeAtMost},
			{Key: "n-" + string(a), Limit: narrow, N: 1},
		}
		slots := map[uint16]bool{}
		for _, r := range reqs {
			slots[slot(tagOf(r.Key))] = true
		}
		if len(slots) < 2 {
			t.Fatalf("%s: test keys share a slot", a)
		}
		res := make([]weir.Result, len(reqs))
		for round := range 2 {
			if err := s.Do(ctx, reqs, res); err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed || !res[1].Allowed || !res[2].Allowed || res[1].Granted != 3 {
				t.Fatalf("%s round %d: %+v", a, round, res)
			}
		}
		if len(refunded) != 0 {
			t.Fatalf("%s: OnRefund called for admitted batches: %q", a, refunded)
		}
		for range 3 {
			if err := s.Do(ctx, reqs, res); err != nil {
				t.Fatal(err)
			}
			// The two wide keys' takes came back: OnRefund hears of each
			// once, and not of the narrow key, which took nothing.
			if len(refunded) != 2 || refunded[0] == refunded[1] || refunded[0] == reqs[2].Key || refunded[1] == reqs[2].Key {
				t.Fatalf("%s: OnRefund got %q, want %s and %s once each", a, refunded, reqs[0].Key, reqs[1].Key)
			}
			refunded = refunded[:0]
			if res[2].Allowed || res[2].RetryAfter <= 0 {
				t.Fatalf("%s: narrow limit admitted a third time: %+v", a, res[2])
			}
			if !res[0].Allowed || res[0].Granted != 0 || res[0].Remaining != 6 || res[1].Granted != 0 || res[1].Remaining != 4 {
				t.Fatalf("%s: refunded requests: %+v %+v, want admissible with nothing granted", a, res[0], res[1])
			}
		}
		for i, want := range []int64{6, 4, 0} {
			if r, err := s.Take(ctx, reqs[i].Key, reqs[i].Limit, 0); err != nil || r.Remaining != want {
				t.Fatalf("%s: %s after refunds: %+v %v, want %d remaining", a, reqs[i].Key, r, err, want)
			}
		}
	}
}

// clusterRefundThenLoweredLimit: the refund of a cross-slot batch leaves a
// key as if the batch had never run, even for a limit lowered afterwards.
// Two keys take alike; one then joins a batch that another slot sinks, so
// its take is refunded (and its state rewritten); from then on, under the
// limit and under a lowered one, both keys must answer alike. The leaky
// bucket once capped its level at a lowered burst before draining it, so
// the rewritten state, which drains from a later instant, kept more.
func clusterRefundThenLoweredLimit(t *testing.T, c *redistest.ClusterGroup) {
	clock := storetest.NewClock(storetest.Epoch)
	s := newTestStore(t, Config{Addrs: c.Addrs, Clock: clock.Now, Prefix: fmt.Sprintf("relow%d", prefixSeq.Add(1))})
	ctx := context.Background()
	limits := []weir.Limit{
		{Rate: 4, Period: 10 * time.Second},
		{Rate: 3, Period: 10 * time.Second, Burst: 4},
		{Rate: 3, Period: 10 * time.Second, Burst: 8, MaxDelay: 7 * time.Second},
	}
	for _, a := range weir.Algorithms() {
		for li, l := range limits {
			l.Algorithm = a
			if l.Validate() != nil {
				continue
			}
			lo, ok := lowered(l)
			if !ok {
				t.Fatalf("%v: no lowered limit", l)
			}
			name := fmt.Sprintf("%s-%d", a, li)
			key, twin, sink := "x-"+name, "twin-"+name, "sink-"+name
			if slot(tagOf(key)) == slot(tagOf(sink)) {
				t.Fatalf("%s: %q and %q share a slot", name, key, sink)
			}
			narrow := weir.Limit{Algorithm: a, Rate: 1, Period: 10 * time.Second}
			clock.Set(storetest.Epoch)
			for _, k := range []string{key, twin} {
				if r, err := s.Take(ctx, k, l, 3); err != nil || !r.Allowed {
					t.Fatalf("%s: 3 on %s: %+v %v", name, k, r, err)
				}
			}
			if r, err := s.Take(ctx, sink, narrow, 1); err != nil || !r.Allowed {
				t.Fatalf("%s: the sink's one: %+v %v", name, r, err)
			}
			clock.Advance(3741 * time.Millisecond)
			reqs := []weir.Request{{Key: key, Limit: l, N: 1}, {Key: sink, Limit: narrow, N: 1}}
			res := make([]weir.Result, 2)
			if err := s.Do(ctx, reqs, res); err != nil {
				t.Fatal(err)
			}
			if !res[0].Allowed || res[0].Granted != 0 || res[1].Allowed {
				t.Fatalf("%s: the sunk batch: %+v, want the first admissible with nothing granted, the sink rejected", name, res)
			}
			// Peeks, under the limit and the lowered one, then takes.
			for _, step := range []struct {
				d time.Duration
				l weir.Limit
				n int64
			}{{0, l, 0}, {0, lo, 0}, {1259 * time.Millisecond, lo, 0}, {0, lo, 1}, {1666667 * time.Microsecond, lo, 1}, {2 * time.Second, lo, 2}, {time.Second, l, 2}} {
				clock.Advance(step.d)
				var got [2]weir.Result
				for i, k := range []string{key, twin} {
					r, err := s.Take(ctx, k, step.l, step.n)
					if err != nil {
						t.Fatal(err)
					}
					got[i] = r
				}
				if got[0] != got[1] {
					t.Fatalf("%s at +%v, %d under %+v:\n after the refund %+v\n never batched    %+v",
						name, clock.Now().Sub(storetest.Epoch), step.n, step.l, got[0], got[1])
				}
			}
		}
	}
}

// clusterWarmupRefund: a cross-slot batch whose take started a key's
// warm-up, then sunk by another slot, leaves the key cold, as if the batch
// had never run: its warm-up state is deleted, and from then on the key
// answers exactly as a twin that never joined the batch and as memstore
// (which decides a batch under one lock and never takes). The refund once
// kept the warm-up it had started, so the key later reached the full rate
// sooner (a smaller ResetAfter) and admitted what the twin refused
// (WEIR_SAME_SEED=13 of TestCluster/SameAsMemstore).
func clusterWarmupRefund(t *testing.T, c *redistest.ClusterGroup) {
	clock := storetest.NewClock(storetest.Epoch)
	s := newTestStore(t, Config{Addrs: c.Addrs, Clock: clock.Now, Prefix: fmt.Sprintf("warmref%d", prefixSeq.Add(1))})
	ms := memstore.New(memstore.WithClock(clock.Now))
	ctx := context.Background()
	for _, a := range []weir.Algorithm{weir.TokenBucket, weir.GCRA} {
		// 5/3 of an event at first; steps of 2s.
		l := weir.Limit{Algorithm: a, Rate: 3, Period: 10 * time.Second, Burst: 5, Warmup: 20 * time.Second}
		p, err := l.Compile()
		if err != nil {
			t.Fatal(err)
		}
		key, twin, sink := "warm-"+string(a), "twin-"+string(a), "sink-"+string(a)
		if slot(tagOf(key)) == slot(tagOf(sink)) {
			t.Fatalf("%s: %q and %q share a slot", a, key, sink)
		}
		narrow := weir.Limit{Algorithm: a, Rate: 1, Period: time.Hour}
		if r, err := s.Take(ctx, sink, narrow, 1); err != nil || !r.Allowed {
			t.Fatalf("%s: the sink's one: %+v %v", a, r, err)
		}
		clock.Advance(time.Second)
		reqs := []weir.Request{{Key: key, Limit: l, N: 1}, {Key: sink, Limit: narrow, N: 1}}
		res := make([]weir.Result, 2)
		if err := s.Do(ctx, reqs, res); err != nil {
			t.Fatal(err)
		}
		if !res[0].Allowed || res[0].Granted != 0 || res[1].Allowed {
			t.Fatalf("%s: the sunk batch: %+v, want the warm-up key admissible with nothing granted, the sink rejected", a, res)
		}
		state := s.names(key, stateAlgo(p.Kind, l)).state
		left := int64(0)
		for _, n := range c.Nodes {
			left += countKeys(t, n, state)
		}
		if left != 0 {
			t.Fatalf("%s: %d warm-up state key %q left after the refund, want none (the key is cold)", a, left, state)
		}
		// Later, at each step's start and within steps: takes of 2 (more
		// than a cold key's 5/3), peeks, and a partial grant.
		for i, step := range []struct {
			d      time.Duration
			n      int64
			atMost bool
		}{{7 * time.Second, 2, false}, {0, 0, false}, {1500 * time.Millisecond, 1, false}, {2 * time.Second, 0, false}, {3 * time.Second, 2, true}, {9 * time.Second, 3, true}, {0, 0, false}} {
			clock.Advance(step.d)
			var got [3]weir.Result
			for j, k := range []string{key, twin} {
				if step.atMost {
					got[j], err = weir.NewLimiter(s).AllowAtMost(ctx, k, l, step.n)
				} else {
					got[j], err = s.Take(ctx, k, l, step.n)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if step.atMost {
				got[2], err = weir.NewLimiter(ms).AllowAtMost(ctx, key, l, step.n)
			} else {
				got[2], err = ms.Take(ctx, key, l, step.n)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != got[1] || got[0] != got[2] {
				t.Fatalf("%s step %d at +%v, %d (at most: %v):\n after the refund %+v\n never batched    %+v\n memstore         %+v",
					a, i, clock.Now().Sub(storetest.Epoch), step.n, step.atMost, got[0], got[1], got[2])
			}
		}
	}
}

// clusterMigration moves a slot back and forth between primaries while
// goroutines keep taking on keys of that slot, and checks that no key ever
// admits more than its limit. During the move Redis answers ASK (rueidis
// follows it with ASKING), and TRYAGAIN while a script's two keys are split
// between the nodes (the penalty-box key usually does not exist, so a
// script names one existing and one missing key); the store retries
// TRYAGAIN, which Redis sends without running the script, until the call's
// deadline. Calls that still fail are counted and reported: a failed call
// admits nothing it reports, and the limit bounds what it may have consumed.
func clusterMigration(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "migrate", Timeout: 2 * time.Second})
	ctx := context.Background()
	keys, sl := sameSlotKeys("hot", 4)
	const rate = 150
	limits := []weir.Limit{
		{Algorithm: weir.SlidingLog, Rate: rate, Period: time.Hour},
		{Algorithm: weir.GCRA, Rate: rate, Period: 24 * time.Hour},
		{Algorithm: weir.TokenBucket, Rate: rate, Period: 24 * time.Hour},
		{Algorithm: weir.Concurrency, Rate: rate, Period: time.Hour},
	}
	var admitted [4]atomic.Int64
	var calls, failures atomic.Int64
	var errMu sync.Mutex
	errKinds := map[string]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (g + i) % len(keys)
				calls.Add(1)
				r, err := s.Take(ctx, keys[k], limits[k], 1)
				if err != nil {
					failures.Add(1)
					msg := err.Error()
					if i := strings.LastIndex(msg, ": "); i >= 0 {
						msg = msg[i+2:]
					}
					errMu.Lock()
					errKinds[msg]++
					errMu.Unlock()
					continue
				}
				admitted[k].Add(r.Granted)
				time.Sleep(time.Millisecond)
			}
		}()
	}
	from := c.NodeForSlot(int(sl))
	var to *redistest.Server
	for _, n := range c.Nodes {
		if n != from {
			to = n
			break
		}
	}
	time.Sleep(50 * time.Millisecond)
	for i := range 4 {
		if err := c.MigrateSlot(int(sl), from, to); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("migration %d: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
		from, to = to, from
	}
	close(stop)
	wg.Wait()
	t.Logf("slot %d moved 4 times under load: %d calls, %d retried after TRYAGAIN/CLUSTERDOWN (not run), %d failed %v",
		sl, calls.Load(), s.notRunRetries.Load(), failures.Load(), errKinds)
	for i, k := range keys {
		got := admitted[i].Load()
		if got > rate {
			t.Errorf("%s (%s): %d admitted, limit %d", k, limits[i].Algorithm, got, rate)
		}
		r, err := s.Take(ctx, k, limits[i], 0)
		if err != nil {
			t.Fatal(err)
		}
		// What the store holds agrees with what was reported admitted:
		// only failed calls may have consumed unreported.
		if used := rate - r.Remaining; used < got || used > got+failures.Load() {
			t.Errorf("%s: %d used per the state, %d reported admitted, %d failed calls", k, used, got, failures.Load())
		}
	}
	if owner := c.NodeForSlot(int(sl)); owner != from {
		t.Errorf("slot %d ended on %v, want %s", sl, owner, from.Addr)
	}
	if err := s.client.Do(ctx, s.client.B().Ping().Build()).Error(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
