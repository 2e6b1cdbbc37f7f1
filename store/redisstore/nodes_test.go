package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/storetest"
)

// TestClusterNodeBatches: on a Redis Cluster the store coalesces decisions
// per node, across slots, and never makes a decision twice when a slot
// moves.
func TestClusterNodeBatches(t *testing.T) {
	c := redistest.Cluster(t)
	t.Run("SlotTable", func(t *testing.T) { nodeSlotTable(t, c) })
	t.Run("CrossSlotCall", func(t *testing.T) { nodeCrossSlotCall(t, c) })
	t.Run("Exact", func(t *testing.T) { nodeExact(t, c) })
	t.Run("StaleTable", func(t *testing.T) { nodeStaleTable(t, c) })
	t.Run("EvalFallback", func(t *testing.T) { nodeEvalFallback(t, c) })
	t.Run("ProbeInMigratingSlot", func(t *testing.T) { nodeProbe(t, c) })
	t.Run("GuardedInMigratingSlot", func(t *testing.T) { nodeGuarded(t, c) })
	t.Run("MigratingSlot", func(t *testing.T) { nodeMigratingSlot(t, c) })
	t.Run("MigrationUnderLoad", func(t *testing.T) { nodeMigrationUnderLoad(t, c) })
}

// keysOnNode returns n keys (weir keys, before escaping) whose slots the
// node owns, each in a slot of its own, none in slot avoid.
func keysOnNode(c *redistest.ClusterGroup, node *redistest.Server, prefix string, n int, avoid int) []string {
	var keys []string
	seen := map[uint16]bool{}
	for i := 0; len(keys) < n; i++ {
		k := prefix + "-" + strconv.Itoa(i)
		sl := slot(tagOf(k))
		if seen[sl] || int(sl) == avoid || c.NodeForSlot(int(sl)) != node {
			continue
		}
		seen[sl] = true
		keys = append(keys, k)
	}
	return keys
}

// nodeSlotTable: the store's slot table names, for every slot, the node
// that CLUSTER SLOTS names, under the address its client knows the node by.
func nodeSlotTable(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "table"})
	tab := s.nodes.table.Load()
	if tab == nil {
		t.Fatal("no slot table after New")
	}
	nodes := s.client.Nodes()
	for _, sl := range []int{0, 5460, 5461, 10922, 10923, 16383} {
		i := tab.owner[sl]
		if i == 0 {
			t.Fatalf("slot %d: no owner", sl)
		}
		addr := tab.addrs[i-1]
		if want := c.NodeForSlot(sl).Addr; addr != want {
			t.Errorf("slot %d: table says %s, CLUSTER SLOTS %s", sl, addr, want)
		}
		if nodes[addr] == nil {
			t.Errorf("slot %d: the client has no node %s (it has %d)", sl, addr, len(nodes))
		}
	}
}

// nodeCrossSlotCall sends the node batch function by hand: one call makes
// the decisions of keys in several slots of its node, and refuses, having
// written nothing, the decision of a key another node serves. A call of 4
// decisions probes each slot first; one of 20, on a cluster with no
// migration, relies on each decision's first command being refused.
func nodeCrossSlotCall(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "cross"})
	ctx := context.Background()
	node := c.Nodes[0]
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}
	cl, err := s.compile(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{4, 20} {
		local := keysOnNode(c, node, fmt.Sprintf("local%d", size), size-1, -1)
		foreign := keysOnNode(c, c.Nodes[1], fmt.Sprintf("foreign%d", size), 1, -1)[0]
		all := append([]string{local[0], foreign}, local[1:]...)
		args := []string{strconv.Itoa(2 * len(all))}
		for _, k := range all {
			n := s.names(k, cl.algo)
			args = append(args, n.state, n.block)
		}
		args = append(args, "", "1")
		args = append(args, cl.arg)
		for i := range all {
			args = append(args, "1", "2", "0", "m"+strconv.Itoa(i))
		}
		arr, err := s.callNode(ctx, node.Addr, args)
		if err != nil {
			t.Fatal(err)
		}
		if len(arr) != 1+8*len(all) {
			t.Fatalf("%d values in the reply, want %d", len(arr), 1+8*len(all))
		}
		for i, k := range all {
			var vals [8]int64
			err := batchDecision(arr, i, vals[:])
			if k == foreign {
				if !notLocal(err) {
					t.Fatalf("size %d: foreign key: %v, want WEIRNOTLOCAL", size, err)
				}
				continue
			}
			if err != nil || vals[0] != 1 || vals[3] != 3 {
				t.Fatalf("size %d: key %s: %v %v, want admitted with 3 remaining", size, k, vals, err)
			}
		}
		// The foreign key was not touched, on any node.
		n := s.names(foreign, cl.algo)
		for _, nd := range c.Nodes {
			if got := countKeys(t, nd, n.state); got != 0 {
				t.Fatalf("size %d: the refused decision's state exists on %s", size, nd.Addr)
			}
		}
		r, err := s.Take(ctx, foreign, l, 0)
		if err != nil || r.Remaining != 5 {
			t.Fatalf("size %d: foreign key after the refusal: %+v %v, want 5 remaining", size, r, err)
		}
	}
}

// nodeExact: 64 goroutines over keys of all three nodes, each key's limit
// far below its demand: every key admits exactly its limit, no more and no
// less, and the decisions went out in per-node batches of several slots.
func nodeExact(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "exact"})
	ctx := context.Background()
	var keys []string
	for i, n := range c.Nodes {
		keys = append(keys, keysOnNode(c, n, "n"+strconv.Itoa(i), 8, -1)...)
	}
	const limit = 40
	l := weir.Limit{Algorithm: weir.GCRA, Rate: limit, Period: 24 * time.Hour}
	admitted := make([]atomic.Int64, len(keys))
	var wg sync.WaitGroup
	var failed atomic.Value
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 * limit * len(keys) / 64 {
				k := (g + i) % len(keys)
				r, err := s.Take(ctx, keys[k], l, 1)
				if err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				if r.Allowed {
					admitted[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if got := admitted[i].Load(); got != limit {
			t.Errorf("%s: %d admitted, want exactly %d", k, got, limit)
		}
	}
	batches, decisions := s.batchStats()
	t.Logf("%d decisions in %d calls, %d per-node queues", decisions, batches, len(*s.nodes.queues.Load()))
	if want := int64(3 * limit * len(keys) / 64 * 64); decisions != want {
		t.Errorf("%d decisions through the node queues, want all %d", decisions, want)
	}
	if got := len(*s.nodes.queues.Load()); got != 3 {
		t.Errorf("%d node queues, want 3", got)
	}
	if s.nodes.resent.Load() != 0 {
		t.Errorf("%d decisions resent on a stable cluster", s.nodes.resent.Load())
	}
}

// nodeStaleTable: a slot table that names the wrong node for two thirds
// of the slots, and an address the client does not know for the rest.
// Each decision is refused where the table sends it, having run nothing,
// is made once through the cluster client, and the table is read again.
func nodeStaleTable(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "stale"})
	ctx := context.Background()
	bad := &slotTable{addrs: []string{c.Nodes[0].Addr, "127.0.0.1:1"}}
	for i := range bad.owner {
		bad.owner[i] = 1
		if i >= 10923 {
			bad.owner[i] = 2 // node 2's slots: an address no client has
		}
	}
	s.nodes.table.Store(bad)
	s.nodes.lastRefresh.Store(time.Now().Add(time.Hour).UnixNano()) // no refresh until the test allows it
	var keys []string
	for i, n := range c.Nodes {
		keys = append(keys, keysOnNode(c, n, "st"+strconv.Itoa(i), 4, -1)...)
	}
	const limit = 5
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: limit, Period: time.Hour}
	var wg sync.WaitGroup
	admitted := make([]atomic.Int64, len(keys))
	var failed atomic.Value
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2 * limit * len(keys) / 16 {
				k := (g + i) % len(keys)
				r, err := s.Take(ctx, keys[k], l, 1)
				if err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				if r.Allowed {
					admitted[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if got := admitted[i].Load(); got != limit {
			t.Errorf("%s: %d admitted, want exactly %d", k, got, limit)
		}
		r, err := s.Take(ctx, k, l, 0)
		if err != nil || r.Remaining != 0 {
			t.Errorf("%s: %+v %v, want all %d used, each once", k, r, err, limit)
		}
	}
	if s.nodes.resent.Load() == 0 {
		t.Error("no decision was resent under a wrong slot table")
	}
	s.nodes.lastRefresh.Store(0)
	s.nodes.refresh()
	deadline := time.Now().Add(20 * time.Second)
	for s.nodes.table.Load() == bad {
		if time.Now().After(deadline) {
			t.Fatal("the slot table was never read again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if tab := s.nodes.table.Load(); tab.addrs[tab.owner[16383]-1] != c.Nodes[2].Addr {
		t.Errorf("slot 16383 now on %s, want %s", tab.addrs[tab.owner[16383]-1], c.Nodes[2].Addr)
	}
}

// nodeEvalFallback: without Functions there is no node batch; every
// decision is a call of its own, and counts stay exact.
func nodeEvalFallback(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "evalonly", evalOnly: true})
	ctx := context.Background()
	keys := append(keysOnNode(c, c.Nodes[0], "ev0", 3, -1), keysOnNode(c, c.Nodes[1], "ev1", 3, -1)...)
	const limit = 7
	l := weir.Limit{Algorithm: weir.GCRA, Rate: limit, Period: time.Hour}
	admitted := make([]atomic.Int64, len(keys))
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3 * limit {
				k := (g + i) % len(keys)
				if r, err := s.Take(ctx, keys[k], l, 1); err != nil {
					t.Error(err)
					return
				} else if r.Allowed {
					admitted[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for i, k := range keys {
		if got := admitted[i].Load(); got != limit {
			t.Errorf("%s: %d admitted, want exactly %d", k, got, limit)
		}
	}
	if _, decisions := s.batchStats(); decisions != 0 {
		t.Errorf("%d decisions in node batches without Functions", decisions)
	}
}

// nodeMigratingSlot: a decision whose slot is being migrated is refused
// by the node batch before it runs, sent again alone (TRYAGAIN from the
// importing node while the slot's keys are split, retried), and made
// exactly once, on the new owner, when the migration ends. Meanwhile it
// does not hold the node's only call (MaxInFlight 1): decisions on the
// node's other slots go on.
func nodeMigratingSlot(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "moving", Timeout: 30 * time.Second, MaxInFlight: 1})
	ctx := context.Background()
	from, to := c.Nodes[0], c.Nodes[1]
	key := keysOnNode(c, from, "mig", 1, -1)[0]
	sl := strconv.Itoa(int(slot(tagOf(key))))
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Hour}
	if _, err := s.Take(ctx, key, l, 2); err != nil { // state on from
		t.Fatal(err)
	}
	fromID, err := from.Do("CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	toID, err := to.Do("CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{
		{"CLUSTER", "SETSLOT", sl, "IMPORTING", fromID.(string)},
	} {
		if _, err := to.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := from.Do("CLUSTER", "SETSLOT", sl, "MIGRATING", toID.(string)); err != nil {
		t.Fatal(err)
	}
	// Move the state key only: the penalty-box key does not exist, so the
	// decision's two keys are split and the importing node says TRYAGAIN.
	n := s.names(key, "token_bucket")
	host, port, _ := splitAddr(to.Addr)
	if _, err := from.Do("MIGRATE", host, port, n.state, "0", "10000"); err != nil {
		t.Fatal(err)
	}
	resent0 := s.nodes.resent.Load()
	type res struct {
		r   weir.Result
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := s.Take(ctx, key, l, 3)
		done <- res{r, err}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for s.nodes.resent.Load() == resent0 {
		if time.Now().After(deadline) {
			t.Fatal("the decision was never refused by the node batch")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// While it waits out the migration, the node's queue (one call at a
	// time) is free: decisions on other slots of the node are made.
	for _, k := range keysOnNode(c, from, "other", 8, int(slot(tagOf(key)))) {
		if r, err := s.Take(ctx, k, l, 1); err != nil || !r.Allowed {
			t.Fatalf("another slot of the node during the migration: %+v %v", r, err)
		}
	}
	select {
	case got := <-done:
		t.Fatalf("the decision on the moving slot ended before the migration did: %+v %v", got.r, got.err)
	default:
	}
	for _, nd := range []*redistest.Server{to, from, c.Nodes[2]} {
		if _, err := nd.Do("CLUSTER", "SETSLOT", sl, "NODE", toID.(string)); err != nil {
			t.Fatal(err)
		}
	}
	got := <-done
	if got.err != nil {
		t.Fatal(got.err)
	}
	if !got.r.Allowed || got.r.Remaining != 5 {
		t.Fatalf("after the move: %+v, want 3 taken once, 5 remaining", got.r)
	}
	r, err := s.Take(ctx, key, l, 0)
	if err != nil || r.Remaining != 5 {
		t.Fatalf("peek: %+v %v, want 5 remaining (each decision made once)", r, err)
	}
	// The slot table follows the move.
	deadline = time.Now().Add(20 * time.Second)
	for {
		tab := s.nodes.table.Load()
		if i := tab.owner[slot(tagOf(key))]; i != 0 && tab.addrs[i-1] == to.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot table never learnt the new owner")
		}
		s.nodes.refresh()
		time.Sleep(10 * time.Millisecond)
	}
}

// nodeProbe: while a slot migrates, a decision of an algorithm outside
// batch.lua's GUARDED is refused before its first write. Every algorithm
// is in the table today, so the test loads a copy of the library without
// sliding_log and concurrency in it (as they were before they learnt to
// keep their ZSET from emptying mid-decision) and calls its nbatch. A
// decision whose key exists on the migrating node with only events
// (leases) that have ended is then refused, and changes nothing. Both ways
// of knowing are checked: a call of 1 decision (which probes every slot)
// and one of 20 (which asks CLUSTER NODES first).
func nodeProbe(t *testing.T, c *redistest.ClusterGroup) {
	clock := storetest.NewClock(storetest.Epoch)
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "probe", Clock: clock.Now})
	ctx := context.Background()
	from, to := c.Nodes[0], c.Nodes[1]
	const guarded = "sliding_window = true, sliding_log = true,\n  concurrency = true,\n"
	if !strings.Contains(lib.src, guarded) {
		t.Fatalf("batch.lua's GUARDED table is not as this test expects (%q)", guarded)
	}
	src := strings.ReplaceAll(lib.src, lib.name, "weirprobe")
	src = strings.Replace(src, guarded, "sliding_window = true,\n", 1)
	if _, err := from.Do("FUNCTION", "LOAD", "REPLACE", src); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = from.Do("FUNCTION", "DELETE", "weirprobe") })
	node := s.client.Nodes()[from.Addr]
	for _, tc := range []struct {
		a    weir.Algorithm
		size int
	}{{weir.SlidingLog, 1}, {weir.SlidingLog, 20}, {weir.Concurrency, 1}, {weir.Concurrency, 20}} {
		size := tc.size
		l := weir.Limit{Algorithm: tc.a, Rate: 5, Period: time.Minute}
		cl, err := s.compile(l)
		if err != nil {
			t.Fatal(err)
		}
		keys := keysOnNode(c, from, fmt.Sprintf("probe-%s-%d", tc.a, size), size, -1)
		moving := keys[0]
		sl := strconv.Itoa(int(slot(tagOf(moving))))
		if _, err := s.Take(ctx, moving, l, 1); err != nil {
			t.Fatal(err)
		}
		state := s.names(moving, cl.algo).state
		before, err := from.Do("DUMP", state)
		if err != nil {
			t.Fatal(err)
		}
		fromID, _ := from.Do("CLUSTER", "MYID")
		toID, _ := to.Do("CLUSTER", "MYID")
		t.Cleanup(func() { // also when the test fails: later subtests need a stable slot
			for _, nd := range []*redistest.Server{from, to} {
				_, _ = nd.Do("CLUSTER", "SETSLOT", sl, "STABLE")
			}
		})
		if _, err := to.Do("CLUSTER", "SETSLOT", sl, "IMPORTING", fromID.(string)); err != nil {
			t.Fatal(err)
		}
		if _, err := from.Do("CLUSTER", "SETSLOT", sl, "MIGRATING", toID.(string)); err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Minute) // the event has left the window, the lease has expired
		args := []string{strconv.Itoa(2 * len(keys))}
		for _, k := range keys {
			n := s.names(k, cl.algo)
			args = append(args, n.state, n.block)
		}
		args = append(args, s.nowArg(), "1")
		args = append(args, cl.arg)
		for i := range keys {
			args = append(args, "1", "1", "0", fmt.Sprintf("p%d-%d", size, i))
		}
		arr, err := node.Do(ctx, node.B().Fcall().Function("weirprobe_nbatch").Numkeys(0).Arg(args...).Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		var vals [8]int64
		if err := batchDecision(arr, 0, vals[:]); !notLocal(err) {
			t.Fatalf("%s, size %d: decision on the migrating slot: %v %v, want WEIRNOTLOCAL", tc.a, size, vals, err)
		}
		for i := 1; i < len(keys); i++ {
			if err := batchDecision(arr, i, vals[:]); err != nil || vals[0] != 1 {
				t.Fatalf("%s, size %d: decision %d on a stable slot: %v %v, want admitted", tc.a, size, i, vals, err)
			}
		}
		if after, err := from.Do("DUMP", state); err != nil || after != before {
			t.Fatalf("%s, size %d: the refused decision changed its state (%v)", tc.a, size, err)
		}
		for _, nd := range []*redistest.Server{from, to} {
			if _, err := nd.Do("CLUSTER", "SETSLOT", sl, "STABLE"); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// nodeGuarded: the decisions of a guarded algorithm (batch.lua's GUARDED:
// all seven) need no migration check, and get none: in a call of 20
// decisions (which would ask CLUSTER NODES for an unguarded algorithm) the
// node sends neither CLUSTER NODES nor a probe. In a migrating slot, on
// the node it migrates from, a decision whose keys all exist runs there,
// whole; one whose state is missing, or whose limit has a penalty box that
// does not exist, is refused at its first command and changes nothing. So
// are a sliding_log's or concurrency's decisions where every event left
// the window (every lease expired: their pruning would empty the key
// before the decision adds its own member), a peek there (the pruning
// comes last and takes the key), and a credit of a log's only member (the
// key goes with save's DEL, not before). On the importing node (no ASKING)
// every decision of the slot is refused and changes nothing, on either
// node.
func nodeGuarded(t *testing.T, c *redistest.ClusterGroup) {
	clock := storetest.NewClock(storetest.Epoch)
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "guarded", Clock: clock.Now})
	ctx := context.Background()
	from, to := c.Nodes[0], c.Nodes[1]
	fromID, _ := from.Do("CLUSTER", "MYID")
	toID, _ := to.Do("CLUSTER", "MYID")
	calls := func(nd *redistest.Server, cmd string) int64 {
		v, err := nd.Do("INFO", "commandstats")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(v.(string), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	for _, a := range []weir.Algorithm{weir.FixedWindow, weir.GCRA, weir.TokenBucket, weir.LeakyBucket, weir.SlidingWindow, weir.SlidingLog, weir.Concurrency} {
		t.Run(string(a), func(t *testing.T) {
			clock.Set(storetest.Epoch)
			zset := a == weir.SlidingLog || a == weir.Concurrency
			plain := weir.Limit{Algorithm: a, Rate: 5, Period: time.Minute}
			boxed := weir.Limit{Algorithm: a, Rate: 5, Period: time.Minute, Block: time.Minute}
			cp, err := s.compile(plain)
			if err != nil {
				t.Fatal(err)
			}
			cb, err := s.compile(boxed)
			if err != nil {
				t.Fatal(err)
			}
			keys := keysOnNode(c, from, "guarded-"+string(a), 20, -1)
			// The first six keys' slots migrate. keys[0]: state on the node;
			// keys[1]: no state; keys[2]: state (an event that left the
			// window, one that has not), but its limit's penalty box does
			// not exist; keys[3]: state whose events all left the window;
			// keys[4]: the same, for a peek; keys[5]: one event, for a
			// credit of it (a take for concurrency, which has no debt).
			// The others are stable.
			take := func(k string, l weir.Limit) {
				t.Helper()
				if _, err := s.Take(ctx, k, l, 1); err != nil {
					t.Fatal(err)
				}
			}
			take(keys[2], boxed)
			take(keys[3], plain)
			take(keys[4], plain)
			clock.Advance(plain.Period + time.Second)
			take(keys[0], plain)
			take(keys[2], boxed)
			take(keys[5], plain)
			const moving = 6
			state := func(i int) string {
				if i == 2 {
					return s.names(keys[i], cb.algo).state
				}
				return s.names(keys[i], cp.algo).state
			}
			dump := func(nd *redistest.Server) []any {
				var d []any
				for i := range moving {
					v, err := nd.Do("DUMP", state(i))
					if err != nil && strings.HasPrefix(err.Error(), "ASK") {
						v, err = "missing", nil // the slot migrates: its key is not on the node
					}
					if err != nil {
						t.Fatal(err)
					}
					d = append(d, v)
				}
				return d
			}
			for _, k := range keys[:moving] {
				sl := strconv.Itoa(int(slot(tagOf(k))))
				t.Cleanup(func() {
					for _, nd := range []*redistest.Server{from, to} {
						_, _ = nd.Do("CLUSTER", "SETSLOT", sl, "STABLE")
					}
				})
				if _, err := to.Do("CLUSTER", "SETSLOT", sl, "IMPORTING", fromID.(string)); err != nil {
					t.Fatal(err)
				}
				if _, err := from.Do("CLUSTER", "SETSLOT", sl, "MIGRATING", toID.(string)); err != nil {
					t.Fatal(err)
				}
			}
			before := dump(from)
			mode := func(i int) (n, m string) {
				switch {
				case i == 4:
					return "0", "0" // a peek
				case i == 5 && a != weir.Concurrency:
					return "1", "3" // a credit
				}
				return "1", "0"
			}
			args := func(ks []string) []string {
				args := []string{strconv.Itoa(2 * len(ks))}
				for i, k := range ks {
					n := s.names(k, cp.algo)
					if i == 2 {
						n = s.names(k, cb.algo)
					}
					args = append(args, n.state, n.block)
				}
				args = append(args, s.nowArg(), "2")
				args = append(args, cp.arg)
				args = append(args, cb.arg)
				for i := range ks {
					l := "1"
					if i == 2 {
						l = "2"
					}
					n, m := mode(i)
					args = append(args, l, n, m, fmt.Sprintf("g-%d", i))
				}
				return args
			}
			keysIn := func(nd *redistest.Server, i int) int64 {
				v, err := nd.Do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(int(slot(tagOf(keys[i])))))
				if err != nil {
					t.Fatal(err)
				}
				return v.(int64)
			}

			// The importing node: every decision of the moving slots refused.
			toNodes0, toExists0 := calls(to, "cluster|nodes"), calls(to, "exists")
			arr, err := s.callNode(ctx, to.Addr, args(keys[:moving]))
			if err != nil {
				t.Fatal(err)
			}
			if n, e := calls(to, "cluster|nodes")-toNodes0, calls(to, "exists")-toExists0; n != 0 || e != 0 {
				t.Errorf("the importing node sent CLUSTER NODES %d times and %d probes for guarded decisions, want none", n, e)
			}
			var vals [8]int64
			for i := 1; i <= (len(arr)-1)/8; i++ {
				if err := batchDecision(arr, i-1, vals[:]); !notLocal(err) {
					t.Errorf("decision %d on the importing node: %v %v, want WEIRNOTLOCAL", i-1, vals, err)
				}
				if n := keysIn(to, i-1); n != 0 {
					t.Errorf("decision %d created %d keys on the importing node", i-1, n)
				}
			}
			if after := dump(from); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("decisions refused on the importing node changed the state on the other: %q, was %q", after, before)
			}

			// The node the slots migrate from.
			count1 := keysIn(from, 1)
			nodes0, exists0 := calls(from, "cluster|nodes"), calls(from, "exists")
			arr, err = s.callNode(ctx, from.Addr, args(keys))
			if err != nil {
				t.Fatal(err)
			}
			if n, e := calls(from, "cluster|nodes")-nodes0, calls(from, "exists")-exists0; n != 0 || e != 0 {
				t.Errorf("the node sent CLUSTER NODES %d times and %d probes for guarded decisions, want none", n, e)
			}
			after := dump(from)
			if err := batchDecision(arr, 0, vals[:]); err != nil || vals[0] != 1 || vals[3] != 3 {
				t.Errorf("existing state in a migrating slot: %v %v, want admitted with 3 remaining (run on the node, once)", vals, err)
			}
			if err := batchDecision(arr, 1, vals[:]); !notLocal(err) {
				t.Errorf("missing state in a migrating slot: %v %v, want WEIRNOTLOCAL", vals, err)
			}
			if n := keysIn(from, 1); n != count1 {
				t.Errorf("the refused decision created a key on the migrating node: %v keys in its slot, want %d", n, count1)
			}
			if err := batchDecision(arr, 2, vals[:]); !notLocal(err) {
				t.Errorf("missing penalty box in a migrating slot: %v %v, want WEIRNOTLOCAL", vals, err)
			}
			if after[2] != before[2] {
				t.Errorf("the refused decision changed its state")
			}
			// (A sliding window still counts the last window's events in part.)
			if err := batchDecision(arr, 3, vals[:]); err != nil || vals[0] != 1 || zset && vals[3] != 4 {
				t.Errorf("state whose events all left the window, in a migrating slot: %v %v, want admitted (with 4 remaining) (run on the node, whole)", vals, err)
			}
			if err := batchDecision(arr, 4, vals[:]); err != nil || vals[0] != 1 || zset && vals[3] != 5 {
				t.Errorf("a peek on state whose events all left the window, in a migrating slot: %v %v, want (5 remaining) (run on the node, whole)", vals, err)
			}
			if err := batchDecision(arr, 5, vals[:]); err != nil || vals[0] != 1 {
				t.Errorf("decision %d in a migrating slot: %v %v, want run on the node", 5, vals, err)
			}
			if zset {
				members := func(i int) int64 {
					v, err := from.Do("ZCARD", state(i))
					if err != nil && strings.HasPrefix(err.Error(), "ASK") {
						return 0 // no key
					}
					if err != nil {
						t.Fatal(err)
					}
					return v.(int64)
				}
				want3, want5 := int64(1), int64(0) // a log: the new event; the credit emptied it
				if a == weir.Concurrency {
					want3, want5 = 2, 3 // the new lease and "#t"; two leases and "#t"
				}
				if n := members(3); n != want3 {
					t.Errorf("state whose events all left the window holds %d members after the take, want %d", n, want3)
				}
				if n := members(4); n != 0 {
					t.Errorf("state whose events all left the window holds %d members after a peek, want none (no key)", n)
				}
				if n := members(5); n != want5 {
					t.Errorf("decision 5 left %d members, want %d", n, want5)
				}
			}
			for i := moving + 1; i <= (len(arr)-1)/8; i++ {
				if err := batchDecision(arr, i-1, vals[:]); err != nil || vals[0] != 1 {
					t.Errorf("decision %d on a stable slot: %v %v, want admitted", i-1, vals, err)
				}
			}
		})
	}
}

func splitAddr(addr string) (string, string, error) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[:i], addr[i+1:], nil
		}
	}
	return "", "", fmt.Errorf("no port in %q", addr)
}

// nodeMigrationUnderLoad: 64 goroutines take on keys of one slot and on
// keys of other slots of the same nodes, so that batches mix a moving slot
// with stable ones, while the slot moves back and forth six times. No key
// admits more than its limit, and the state of every key holds exactly
// what was reported admitted: no decision ran twice, none was lost.
func nodeMigrationUnderLoad(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "load", Timeout: 20 * time.Second})
	hot, sl := sameSlotKeys("hot", 5) // one per algorithm of clusterLoad
	from := c.NodeForSlot(int(sl))
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	keys := append([]string{}, hot...)
	keys = append(keys, keysOnNode(c, from, "calm-a", 6, int(sl))...)
	keys = append(keys, keysOnNode(c, to, "calm-b", 6, int(sl))...)
	l := startLoad(s, keys, 300, 64, false)
	// Let the load build before the first move, and between moves.
	for i := range 6 {
		l.waitMade(int64(500 * (i + 1)))
		if err := c.MigrateSlot(int(sl), from, to); err != nil {
			l.halt()
			t.Fatalf("migration %d: %v", i, err)
		}
		from, to = to, from
	}
	l.check(t, fmt.Sprintf("slot %d moved 6 times", sl))
	if s.nodes.resent.Load() == 0 {
		t.Error("no decision was refused by a node during six migrations under load")
	}
}
