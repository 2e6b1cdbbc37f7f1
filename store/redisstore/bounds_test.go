package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// zcard returns the number of members of the state key of key under a.
func zcard(t *testing.T, s *Store, key string, a weir.Algorithm) int64 {
	t.Helper()
	n, err := s.client.Do(context.Background(), s.client.B().Zcard().Key(s.names(key, string(a)).state).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// redis runs a raw command against the store's Redis.
func redisDo(t *testing.T, s *Store, args ...string) {
	t.Helper()
	if err := s.client.Do(context.Background(), s.client.B().Arbitrary(args[0]).Args(args[1:]...).Build()).Error(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// TestHeavyCallsO1 checks that a call of cost n costs Redis O(1) members,
// not n: one Take of cost 10^6 under concurrency once wrote a million ZSET
// members and stalled Redis for seconds. The decisions stay exactly
// memstore's.
func TestHeavyCallsO1(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	for _, l := range []weir.Limit{
		{Algorithm: weir.Concurrency, Rate: 2_000_000, Period: time.Minute},
		{Algorithm: weir.SlidingLog, Rate: 1_000_000, Period: time.Hour},
	} {
		t.Run(string(l.Algorithm), func(t *testing.T) {
			clock := storetest.NewClock(storetest.Epoch)
			rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("heavy%d", prefixSeq.Add(1))})
			ms := memstore.New(memstore.WithClock(clock.Now))
			stores := [2]weir.Store{rs, ms}
			same := func(what string, f func(s weir.Store) (weir.Result, error)) weir.Result {
				t.Helper()
				var r [2]weir.Result
				for i, s := range stores {
					var err error
					if r[i], err = f(s); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
				}
				if r[0] != r[1] {
					t.Fatalf("%s:\n redisstore %+v\n memstore   %+v", what, r[0], r[1])
				}
				return r[0]
			}
			take := func(n int64) func(s weir.Store) (weir.Result, error) {
				return func(s weir.Store) (weir.Result, error) { return s.Take(ctx, "k", l, n) }
			}
			if r, err := rs.Take(ctx, "big", l, 1_000_000); err != nil || !r.Allowed {
				t.Fatalf("Take 10^6: %+v %v", r, err)
			}
			if n := zcard(t, rs, "big", l.Algorithm); n > 3 {
				t.Fatalf("one Take of cost 10^6 left %d members", n)
			}
			// Two heavy calls fill the limit: first, second, then one over.
			first := l.Rate * 3 / 5
			second := l.Rate - first
			if r := same("Take first", take(first)); !r.Allowed {
				t.Fatalf("Take %d rejected: %+v", first, r)
			}
			clock.Advance(time.Second)
			var leases [2]*weir.Lease
			if l.Algorithm == weir.Concurrency {
				same("AcquireN 10^6", func(s weir.Store) (weir.Result, error) {
					i := 0
					if s == weir.Store(ms) {
						i = 1
					}
					ls, r, err := weir.NewLimiter(s).AcquireN(ctx, "k", l, second)
					leases[i] = ls
					return r, err
				})
			} else {
				same("Take second", take(second))
			}
			if n := zcard(t, rs, "k", l.Algorithm); n > 5 {
				t.Fatalf("two heavy calls left %d members", n)
			}
			clock.Advance(time.Second)
			// Full: the next event waits for the first call to leave, and a
			// heavier one for the second call.
			if r := same("Take 1", take(1)); r.Allowed || r.RetryAfter != l.Period-2*time.Second {
				t.Fatalf("Take 1: %+v", r)
			}
			if r := same("Take first+1", take(first+1)); r.Allowed || r.RetryAfter != l.Period-time.Second {
				t.Fatalf("Take %d on a full key: %+v", first+1, r)
			}
			if l.Algorithm == weir.Concurrency {
				for i := range leases {
					if err := leases[i].Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if r := same("Peek after Release", take(0)); r.Remaining != second {
					t.Fatalf("Release gave back %d slots, want %d", r.Remaining, second)
				}
			}
			clock.Advance(l.Period)
			if r := same("Peek after the period", take(0)); r.Remaining != l.Rate {
				t.Fatalf("after the period: %+v", r)
			}
		})
	}
}

// TestOldLayoutKeys checks that state written by a weir that kept one
// member per event or slot is read correctly: each old member counts one,
// old leases are released whole, and an older weir that keeps writing the
// key during a rolling upgrade (removing the running total) is caught up.
func TestOldLayoutKeys(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Epoch)
	rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("old%d", prefixSeq.Add(1))})
	ms := memstore.New(memstore.WithClock(clock.Now))
	us := func(d time.Duration) string { return fmt.Sprint(clock.Now().Add(d).UnixMicro()) }

	t.Run("sliding_log", func(t *testing.T) {
		l := weir.Limit{Algorithm: weir.SlidingLog, Rate: 10, Period: time.Minute}
		key := rs.names("log", string(l.Algorithm)).state
		// What the old layout wrote for a take of 5, then one of 3 a
		// second later; memstore is given the same history.
		start := clock.Now()
		redisDo(t, rs, "ZADD", key, us(0), "oldA#1", us(0), "oldA#2", us(0), "oldA#3", us(0), "oldA#4", us(0), "oldA#5")
		ms.Take(ctx, "log", l, 5)
		clock.Advance(time.Second)
		redisDo(t, rs, "ZADD", key, us(0), "oldB#1", us(0), "oldB#2", us(0), "oldB#3")
		redisDo(t, rs, "PEXPIRE", key, "60000")
		ms.Take(ctx, "log", l, 3)
		clock.Advance(time.Second)
		for _, n := range []int64{0, 3, 2, 1} {
			r1, err1 := rs.Take(ctx, "log", l, n)
			r2, err2 := ms.Take(ctx, "log", l, n)
			if err1 != nil || err2 != nil || r1 != r2 {
				t.Fatalf("Take %d:\n redisstore %+v %v\n memstore   %+v %v", n, r1, err1, r2, err2)
			}
		}
		if r, _ := rs.Take(ctx, "log", l, 1); r.Allowed || r.RetryAfter != time.Minute-clock.Now().Sub(start) {
			t.Fatalf("the 11th event: %+v", r)
		}
		// An older weir adds one event at the newest end.
		clock.Advance(time.Second)
		redisDo(t, rs, "ZADD", key, us(0), "oldC#1")
		if n := zcard(t, rs, "log", l.Algorithm); n != 4 {
			t.Fatalf("%d members after the old write, want 4 (3 calls and the old member)", n)
		}
		clock.Advance(57*time.Second + 500*time.Millisecond) // the first take (5) has left
		r, err := rs.Take(ctx, "log", l, 0)
		if err != nil || r.Remaining != 10-3-2-1 {
			t.Fatalf("after the old write: %+v %v; want 4 remaining (old 3, new 2, old 1)", r, err)
		}
	})

	t.Run("concurrency", func(t *testing.T) {
		l := weir.Limit{Algorithm: weir.Concurrency, Rate: 10, Period: time.Minute}
		key := rs.names("conc", string(l.Algorithm)).state
		// An old lease "L" of weight 4 and an anonymous one of weight 2.
		redisDo(t, rs, "ZADD", key, us(time.Minute), "L#1", us(time.Minute), "L#2", us(time.Minute), "L#3", us(time.Minute), "L#4",
			us(time.Minute), "anon#1", us(time.Minute), "anon#2")
		redisDo(t, rs, "PEXPIRE", key, "60000")
		peek := func(want int64) {
			t.Helper()
			r, err := rs.Take(ctx, "conc", l, 0)
			if err != nil || r.Remaining != want {
				t.Fatalf("peek: %+v %v; want %d remaining", r, err, want)
			}
		}
		peek(4)
		if err := rs.Do(ctx, []weir.Request{{Key: "conc", Limit: l, Mode: weir.ModeRelease, Lease: "L"}}, make([]weir.Result, 1)); err != nil {
			t.Fatal(err)
		}
		peek(8)
		lease, r, err := weir.NewLimiter(rs).AcquireN(ctx, "conc", l, 3)
		if err != nil || !r.Allowed {
			t.Fatalf("AcquireN 3: %+v %v", r, err)
		}
		peek(5)
		// An older weir takes one slot: it drops every expired member
		// (with them the negative ones) and adds one member.
		redisDo(t, rs, "ZREMRANGEBYSCORE", key, "-inf", us(0))
		redisDo(t, rs, "ZADD", key, us(time.Minute), "old#1")
		peek(4)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		peek(7)
		clock.Advance(time.Minute)
		peek(10)
	})
}

// TestSlidingLogClockBack checks that both stores keep a sliding log
// ordered the same way when the clock steps back (Redis TIME after an NTP
// step or a failover): the event is recorded at the newest entry's time.
func TestSlidingLogClockBack(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Epoch.Add(time.Hour))
	rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("back%d", prefixSeq.Add(1))})
	ms := memstore.New(memstore.WithClock(clock.Now))
	rng := rand.New(rand.NewPCG(1, 2))
	l := weir.Limit{Algorithm: weir.SlidingLog, Rate: 20, Period: 10 * time.Second}
	for step := range 3000 {
		if rng.IntN(10) == 0 {
			clock.Advance(-time.Duration(rng.Int64N(int64(3 * time.Second))))
		} else {
			clock.Advance(time.Duration(rng.Int64N(int64(time.Second))))
		}
		n := rng.Int64N(8)
		k := fmt.Sprint("k", rng.IntN(3))
		r1, e1 := rs.Take(ctx, k, l, n)
		r2, e2 := ms.Take(ctx, k, l, n)
		if r1 != r2 || e1 != nil || e2 != nil {
			t.Fatalf("step %d, Take(%s, %d):\n redisstore %+v %v\n memstore   %+v %v", step, k, n, r1, e1, r2, e2)
		}
	}
}

// TestSlidingLogCommands checks the commands a sliding_log decision sends:
// a log of fewer than four members is read with one ZRANGE, and pruned only
// when its oldest member has left the window, so a decision on a key
// missing or of up to three members sends three commands (ZRANGE, ZADD,
// PEXPIRE), and one more when it prunes. A log whose every member has left
// is pruned after the new member is in (or, by a peek, last), so that the
// key never empties before a later command (GUARDED in batch.lua). The
// decisions stay memstore's.
func TestSlidingLogCommands(t *testing.T) {
	l := weir.Limit{Algorithm: weir.SlidingLog, Rate: 10, Period: time.Minute}
	commandSteps(t, "slcmd", l, func(c string) bool { return strings.HasPrefix(c, "z") || c == "pexpire" }, []commandStep{
		{0, 1, map[string]int64{"zrange": 1, "zadd": 1, "pexpire": 1}},                                             // no key
		{0, 1, map[string]int64{"zrange": 1, "zadd": 1, "pexpire": 1}},                                             // one member
		{0, 1, map[string]int64{"zrange": 1, "zadd": 1, "pexpire": 1}},                                             // two
		{0, 1, map[string]int64{"zrange": 1, "zadd": 1, "pexpire": 1}},                                             // three
		{0, 1, map[string]int64{"zrange": 1, "zcard": 1, "zadd": 1, "pexpire": 1}},                                 // four: ZCARD
		{0, 1, map[string]int64{"zrange": 2, "zcard": 1, "zadd": 1, "pexpire": 1}},                                 // five: and the newest
		{l.Period, 1, map[string]int64{"zrange": 2, "zadd": 1, "zremrangebyscore": 1, "pexpire": 1}},               // all six left: the newest read, pruned after the ZADD
		{time.Second, 1, map[string]int64{"zrange": 1, "zadd": 1, "pexpire": 1}},                                   // two members
		{l.Period - time.Second, 1, map[string]int64{"zrange": 1, "zremrangebyscore": 1, "zadd": 1, "pexpire": 1}}, // the oldest left, the newest stays
		{l.Period, 1, map[string]int64{"zrange": 1, "zadd": 1, "zremrangebyscore": 1, "pexpire": 1}},               // both left
		{l.Period, 0, map[string]int64{"zrange": 1, "zremrangebyscore": 1}},                                        // a peek: the pruning, last, deletes the key
		{0, 1, map[string]int64{"zrange": 1, "zadd": 1, "pexpire": 1}},                                             // no key
	})
}

// TestConcurrencyCommands checks the commands a concurrency decision sends
// (a missing key: no expiry read, no reset read; expired leases dropped
// after the new lease is in, or last), and that its decisions stay
// memstore's.
func TestConcurrencyCommands(t *testing.T) {
	l := weir.Limit{Algorithm: weir.Concurrency, Rate: 10, Period: time.Minute}
	keyed := map[string]bool{"zscore": true, "zcard": true, "zadd": true, "zrem": true, "zrange": true,
		"zrangebyscore": true, "zrevrangebyscore": true, "zremrangebyscore": true, "exists": true, "pexpire": true, "del": true}
	commandSteps(t, "cccmd", l, func(c string) bool { return keyed[c] }, []commandStep{
		{0, 1, map[string]int64{"zscore": 1, "zcard": 1, "zadd": 2, "pexpire": 1}},                                                      // no key
		{0, 2, map[string]int64{"zscore": 1, "zrangebyscore": 1, "zadd": 3, "zrange": 1, "pexpire": 1}},                                 // a lease of weight 2: its weight member too
		{time.Second, 1, map[string]int64{"zscore": 1, "zrangebyscore": 1, "zadd": 2, "zrange": 1, "pexpire": 1}},                       // nothing expired
		{l.Period - time.Second, 1, map[string]int64{"zscore": 1, "zrangebyscore": 1, "zrem": 2, "zadd": 3, "zrange": 1, "pexpire": 1}}, // the first two expired: dropped in load ("#t" stays)
		{l.Period, 1, map[string]int64{"zscore": 1, "zrangebyscore": 1, "zadd": 2, "zrem": 1, "zrange": 1, "pexpire": 1}},               // all expired: dropped after the new lease is in
		{l.Period, 0, map[string]int64{"zscore": 1, "zrangebyscore": 1, "zrange": 1, "zrem": 2}},                                        // a peek, all expired: dropped last, "#t" (and the key) at the end
		{0, 1, map[string]int64{"zscore": 1, "zcard": 1, "zadd": 2, "pexpire": 1}},                                                      // no key
	})
}

// A commandStep is one decision of commandSteps: the clock moves by
// advance, then a take of n is made; want counts the commands it must send.
type commandStep struct {
	advance time.Duration
	n       int64
	want    map[string]int64
}

// commandSteps makes each step's decision on one key under l, on a
// standalone Redis and on memstore at the same clock: the decisions must
// agree, and Redis must see exactly the step's commands among those count
// keeps (by INFO commandstats, in lower case).
func commandSteps(t *testing.T, prefix string, l weir.Limit, count func(cmd string) bool, steps []commandStep) {
	t.Helper()
	srv := redistest.Standalone(t)
	ctx := context.Background()
	clock := storetest.NewClock(storetest.Epoch)
	rs := newTestStore(t, Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("%s%d", prefix, prefixSeq.Add(1))})
	ms := memstore.New(memstore.WithClock(clock.Now))
	stats := func() map[string]int64 {
		v, err := srv.Do("INFO", "commandstats")
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for _, line := range strings.Split(v.(string), "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if c, found := strings.CutPrefix(name, "cmdstat_"); ok && found && count(c) {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				m[c] = n
			}
		}
		return m
	}
	for i, step := range steps {
		clock.Advance(step.advance) // the key itself lives on (Redis's clock)
		before := stats()
		var r [2]weir.Result
		for j, s := range []weir.Store{rs, ms} {
			var err error
			if r[j], err = s.Take(ctx, "k", l, step.n); err != nil {
				t.Fatal(err)
			}
		}
		if r[0] != r[1] {
			t.Fatalf("decision %d:\n redisstore %+v\n memstore   %+v", i, r[0], r[1])
		}
		got := map[string]int64{}
		for c, n := range stats() {
			if d := n - before[c]; d != 0 {
				got[c] = d
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(step.want) {
			t.Errorf("decision %d sent %v, want %v", i, got, step.want)
		}
	}
}
