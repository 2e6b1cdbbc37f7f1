package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/override"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// diffLimits are the limits the differential test draws from for a: small
// and large rates, fractional emission intervals, odd periods, bursts,
// penalty boxes and shaping.
func diffLimits(a weir.Algorithm) []weir.Limit {
	ls := []weir.Limit{
		{Rate: 4, Period: time.Minute},
		{Rate: 7, Period: 3 * time.Second},
		{Rate: 3, Period: 10 * time.Second, Block: 20 * time.Second},
		{Rate: 5, Period: 1234567 * time.Microsecond},
		{Rate: 1000, Period: 7 * time.Second},
		{Rate: 999_983, Period: 86400 * time.Second},
		// An escalating penalty, with boxes shorter and longer than the state.
		{Rate: 3, Period: 10 * time.Second, Block: 2 * time.Second, Escalate: [7]time.Duration{5 * time.Second, 30 * time.Second}, ForgetAfter: 40 * time.Second},
	}
	switch a {
	case weir.TokenBucket, weir.GCRA, weir.LeakyBucket:
		ls = append(ls,
			weir.Limit{Rate: 3, Period: 10 * time.Second, Burst: 5},
			weir.Limit{Rate: 1000, Period: 7 * time.Second, Burst: 9, Block: 5 * time.Second},
			weir.Limit{Rate: 1_000_000_007, Period: time.Second, Burst: 3},
			weir.Limit{Rate: 1, Period: 97 * time.Second, Burst: 4},
		)
	}
	if a == weir.TokenBucket || a == weir.GCRA {
		ls = append(ls, // warm-ups: steps of 2s and of 300ms
			weir.Limit{Rate: 3, Period: 10 * time.Second, Burst: 5, Warmup: 20 * time.Second},
			weir.Limit{Rate: 1000, Period: 7 * time.Second, Burst: 9, Warmup: 3 * time.Second, Block: 2 * time.Second},
		)
	}
	if a == weir.LeakyBucket {
		ls = append(ls,
			weir.Limit{Rate: 4, Period: time.Minute, MaxDelay: 30 * time.Second},
			weir.Limit{Rate: 4, Period: time.Minute, Burst: 6, DelayAfter: 3, MaxDelay: time.Hour},
			weir.Limit{Rate: 3, Period: 10 * time.Second, Burst: 8, MaxDelay: 7 * time.Second},
			weir.Limit{Rate: 1000, Period: 7 * time.Second, Burst: 50, DelayAfter: 10, MaxDelay: 100 * time.Millisecond},
		)
	}
	var ok []weir.Limit
	for _, l := range ls {
		l.Algorithm = a
		if l.Validate() == nil { // some are too large to track exactly as buckets
			ok = append(ok, l)
		}
	}
	return ok
}

// bucketLimits are the bucketed sliding windows the differential test
// draws from: bucket counts from 2 to 60, buckets of whole seconds and of
// odd microseconds (7s/7, 3s/3, 10s/5), a penalty box, and a rate whose
// tick is not 1µs.
func bucketLimits() []weir.Limit {
	ls := []weir.Limit{
		{Rate: 4, Period: time.Minute, Buckets: 2},
		{Rate: 7, Period: 3 * time.Second, Buckets: 3},
		{Rate: 3, Period: 10 * time.Second, Block: 20 * time.Second, Buckets: 5},
		{Rate: 1000, Period: 7 * time.Second, Buckets: 7},
		{Rate: 10, Period: time.Minute, Buckets: 60},
		{Rate: 999_983, Period: 86400 * time.Second, Buckets: 24},
	}
	for i := range ls {
		ls[i].Algorithm = weir.SlidingWindow
	}
	return ls
}

// lowered returns l with a smaller quota and the same period: the one kind
// of change to a live key's limit that both stores must handle alike. (A
// raised limit or a new period is not: state written under the old limit
// carries a TTL for the old limit, which Redis honours and memstore may or
// may not, depending on its sweeps.)
func lowered(l weir.Limit) (weir.Limit, bool) {
	switch l.Algorithm {
	case weir.TokenBucket, weir.GCRA, weir.LeakyBucket:
		b := l.Burst
		if b == 0 {
			b = l.Rate
		}
		if b < 2 {
			return l, false
		}
		l.Burst = b / 2
	default:
		if l.Rate < 2 {
			return l, false
		}
		l.Rate /= 2
	}
	return l, l.Validate() == nil
}

// respanned returns a bucket's l in half its period with twice its burst:
// twice the rate in the same units and the same span (burst × interval),
// an override's change of period that carries the level as refill time
// (docs/algorithms.md, "Overrides") alike on both stores.
func respanned(l weir.Limit) (weir.Limit, bool) {
	switch l.Algorithm {
	case weir.TokenBucket, weir.GCRA, weir.LeakyBucket:
	default:
		return l, false
	}
	if l.Period%(2*time.Microsecond) != 0 || l.Warmup != 0 || l.MaxDelay != 0 {
		return l, false
	}
	b := l.Burst
	if b == 0 {
		b = l.Rate
	}
	r := l
	r.Period, r.Burst = l.Period/2, 2*b
	p, err1 := l.Compile()
	q, err2 := r.Compile()
	return r, err1 == nil && err2 == nil && r.Validate() == nil && p.B == q.B && p.Burst*p.A == q.Burst*q.A
}

// TestSameAsMemstore drives memstore and redisstore with one clock through
// the same random workload (takes, peeks, partial grants, batches, resets,
// leases, limit changes on a live key, time jumps) and requires identical
// Results and identical errors at every step: the Lua mirrors the Go math
// to the microsecond.
func TestSameAsMemstore(t *testing.T) {
	srv := redistest.Standalone(t)
	sameAsMemstore(t, []string{srv.Addr}, sameSteps(t, 1500))
}

// TestSameAsMemstoreAlone is TestSameAsMemstore with a MaxBatch of 1: every
// decision in a call of its own (take.lua, whose plain takes run the
// algorithms' fast paths as batch.lua's do).
func TestSameAsMemstoreAlone(t *testing.T) {
	srv := redistest.Standalone(t)
	sameAsMemstoreWith(t, Config{Addrs: []string{srv.Addr}, MaxBatch: 1}, sameSteps(t, 1500))
}

// TestSameAsMemstoreOverrides is TestSameAsMemstore with overrides set
// and removed on live keys (Config.Overrides), through batch.lua and,
// with a MaxBatch of 1, take.lua.
func TestSameAsMemstoreOverrides(t *testing.T) {
	srv := redistest.Standalone(t)
	t.Run("Coalesced", func(t *testing.T) {
		sameAsMemstoreWith(t, Config{Addrs: []string{srv.Addr}, Overrides: true}, sameSteps(t, 1500))
	})
	t.Run("Alone", func(t *testing.T) {
		sameAsMemstoreWith(t, Config{Addrs: []string{srv.Addr}, MaxBatch: 1, Overrides: true}, sameSteps(t, 1500))
	})
}

// sameStepsEnv names the environment variable that sets the number of steps
// of every differential run, for deeper runs than make test affords (say
// WEIR_SAME_STEPS=20000 go test -run 'TestSameAsMemstore|TestCluster/SameAsMemstore'
// ./store/redisstore; WEIR_SAME_SEED picks another workload). A failure
// names the seed and the step.
const sameStepsEnv = "WEIR_SAME_STEPS"

// sameSeedEnv names the environment variable that picks another random
// workload for the differential runs (a number; 99 by default).
const sameSeedEnv = "WEIR_SAME_SEED"

// sameSeed returns the differential runs' seed: 99 or $WEIR_SAME_SEED.
func sameSeed(t *testing.T) uint64 {
	v := os.Getenv(sameSeedEnv)
	if v == "" {
		return 99
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a non-negative integer", sameSeedEnv, v)
	}
	return n
}

// sameSteps returns the steps a differential run takes: def, or what
// $WEIR_SAME_STEPS asks.
func sameSteps(t *testing.T, def int) int {
	v := os.Getenv(sameStepsEnv)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number of steps", sameStepsEnv, v)
	}
	return n
}

// sameAsMemstore runs the differential workload against the Redis at addrs.
// On a cluster the batches' keys span slots, so the cross-slot path with
// its refunds must give memstore's results too.
func sameAsMemstore(t *testing.T, addrs []string, steps int) {
	sameAsMemstoreWith(t, Config{Addrs: addrs}, steps)
}

// sameAsMemstoreWith is sameAsMemstore with the store's Config (its Clock
// and Prefix set here).
func sameAsMemstoreWith(t *testing.T, cfg Config, steps int) {
	ctx := context.Background()
	type group struct {
		name   string
		a      weir.Algorithm
		limits []weir.Limit
	}
	var groups []group
	for _, a := range weir.Algorithms() {
		groups = append(groups, group{string(a), a, diffLimits(a)})
	}
	groups = append(groups, group{"sliding_window_buckets", weir.SlidingWindow, append(bucketLimits(), diffLimits(weir.SlidingWindow)[0])})
	for ai, gr := range groups {
		a := gr.a
		t.Run(gr.name, func(t *testing.T) {
			clock := storetest.NewClock(storetest.Epoch)
			cfg := cfg
			cfg.Clock, cfg.Prefix = clock.Now, fmt.Sprintf("same%d", prefixSeq.Add(1))
			rs := newTestStore(t, cfg)
			ms := memstore.New(memstore.WithClock(clock.Now), memstore.WithShards(1<<14)) // see the TakeAll note below
			// Redis first, right after the clock moves (see advance).
			stores := [2]weir.Store{rs, ms}
			lims := [2]*weir.Limiter{weir.NewLimiter(rs), weir.NewLimiter(ms)}
			limits := gr.limits
			keys := []string{"k0", "k1", "k2", "k3"}
			// Each key keeps one limit for a while and sometimes switches,
			// so live state meets a changed limit (a lowered rate) too.
			keyLimit := map[string]weir.Limit{}
			for _, k := range keys {
				keyLimit[k] = limits[0]
			}
			type lease struct{ l [2]*weir.Lease }
			var leases []lease
			var resvs [][2]*weir.Reservation // open reservations, Redis's and memstore's
			// Takes of stamped batches (TakeAllStamped) to settle later; the
			// two stores' stamps are the same.
			type batchTake struct {
				key   string
				limit weir.Limit
				st    weir.Stamp
			}
			var bts []batchTake
			seed := sameSeed(t)
			rng := rand.New(rand.NewPCG(uint64(ai), seed))
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("replay with %s=%d %s=%d (the steps also add real time, so a failure may move by a few steps)", sameSeedEnv, seed, sameStepsEnv, steps)
				}
			})
			// Test time never runs slower than real time, so Redis (which
			// expires keys by its real clock) never forgets state that the
			// test clock still considers live: every step adds the real
			// time since the last one, plus a margin for the time between
			// a step's clock read and its script running.
			last := time.Now()
			advance := func(d time.Duration) {
				now := time.Now()
				clock.Advance(d + now.Sub(last).Truncate(time.Microsecond) + 20*time.Millisecond)
				last = now
			}
			var history []string // for the failure message
			same := func(step int, what string, r [2]weir.Result, e [2]error) {
				t.Helper()
				history = append(history, fmt.Sprintf("step %d t=%v %s → %+v %v", step, clock.Now().Sub(storetest.Epoch), what, r[0], e[0]))
				defer func() {
					if t.Failed() {
						for _, h := range history[max(0, len(history)-25):] {
							t.Log(h)
						}
					}
				}()
				if (e[0] == nil) != (e[1] == nil) || (e[0] != nil && (errors.Is(e[0], weir.ErrInvalidCost) != errors.Is(e[1], weir.ErrInvalidCost))) {
					t.Fatalf("step %d %s: redisstore error %v, memstore error %v", step, what, e[0], e[1])
				}
				if r[0] != r[1] {
					t.Fatalf("step %d %s:\n redisstore %+v\n memstore   %+v", step, what, r[0], r[1])
				}
			}
			for step := range steps {
				k := keys[rng.IntN(len(keys))]
				switch rng.IntN(60) {
				case 0: // a new limit, on a fresh state
					var errs [2]error
					for i, s := range stores {
						errs[i] = weir.NewLimiter(s).Reset(ctx, k, keyLimit[k])
					}
					same(step, "Reset before a new limit", [2]weir.Result{}, errs)
					keyLimit[k] = limits[rng.IntN(len(limits))]
				case 1: // a lowered limit on live state
					if lo, ok := lowered(keyLimit[k]); ok {
						keyLimit[k] = lo
					}
				case 2, 3, 4: // an override on live state: lowered, or gone
					if !cfg.Overrides {
						break
					}
					var errs [2]error
					lo, ok := lowered(keyLimit[k])
					if rs, rok := respanned(keyLimit[k]); rok && rng.IntN(2) == 0 {
						lo, ok = rs, true
					}
					set := ok && rng.IntN(3) > 0
					for i, s := range stores {
						os := s.(override.Store)
						if set {
							errs[i] = os.SetOverride(ctx, override.Override{Key: k, Limit: lo})
						} else {
							_, errs[i] = os.DeleteOverride(ctx, k)
						}
					}
					same(step, fmt.Sprintf("override of %s: %v (%v)", k, lo, ok), [2]weir.Result{}, errs)
				}
				l := keyLimit[k]
				p, err := l.Compile()
				if err != nil {
					t.Fatal(err)
				}
				maxCost := p.MaxCost()
				interval := l.Period / time.Duration(l.Rate)
				switch r := rng.IntN(100); {
				case r < 70:
					advance(time.Duration(rng.Int64N(int64(interval)+1)) + time.Duration(rng.IntN(3))*time.Microsecond)
				case r < 75:
					advance(l.Period + time.Duration(rng.Int64N(int64(l.Period))))
				case r < 78:
					advance(time.Duration(rng.Int64N(int64(l.Period)*3 + 1)))
				default:
					advance(0)
				}
				var res [2]weir.Result
				var errs [2]error
				switch op := rng.IntN(100); {
				case op < 55: // Take, with peeks and the odd bad cost
					n := rng.Int64N(min(maxCost, 4) + 1)
					switch rng.IntN(20) {
					case 0:
						n = maxCost
					case 1:
						n = maxCost + 1
					case 2:
						n = -1
					}
					for i, s := range stores {
						res[i], errs[i] = s.Take(ctx, k, l, n)
					}
					same(step, fmt.Sprintf("Take(%s, %v %+v, %d)", k, l, l, n), res, errs)
				case op < 65: // AllowAtMost, possibly over capacity
					n := 1 + rng.Int64N(min(maxCost, 6)+2)
					for i, lim := range lims {
						res[i], errs[i] = lim.AllowAtMost(ctx, k, l, n)
					}
					same(step, fmt.Sprintf("AllowAtMost(%s, %+v, %d)", k, l, n), res, errs)
				case op < 85: // a batch over two or three keys
					m := 2 + rng.IntN(2)
					perm := rng.Perm(len(keys))[:m]
					reqs := make([]weir.Request, m)
					for j, ki := range perm {
						bk := keys[ki]
						bp, _ := keyLimit[bk].Compile()
						reqs[j] = weir.Request{Key: bk, Limit: keyLimit[bk], N: rng.Int64N(min(bp.MaxCost(), 3) + 1)}
						if rng.IntN(4) == 0 {
							reqs[j].Mode = weir.ModeAtMost
						}
					}
					var out [2][]weir.Result
					var stamps [2][]weir.Stamp
					dated := rng.IntN(2) == 0 // TakeAllStamped: stamps to settle later
					for i, s := range stores {
						out[i] = make([]weir.Result, m)
						if dated {
							stamps[i] = make([]weir.Stamp, m)
							errs[i] = s.Do(ctx, reqs, out[i])
							for k := range reqs {
								stamps[i][k] = out[i][k].Stamp(reqs[k].N)
							}
						} else {
							errs[i] = s.Do(ctx, reqs, out[i])
						}
					}
					for j := range reqs {
						same(step, fmt.Sprintf("TakeAll %+v, result %d", reqs, j), [2]weir.Result{out[0][j], out[1][j]}, errs)
						if !dated || errs[0] != nil {
							continue
						}
						if stamps[0][j] != stamps[1][j] {
							t.Fatalf("step %d: TakeAllStamped %+v, stamp %d: %+v vs %+v", step, reqs, j, stamps[0][j], stamps[1][j])
						}
						if bp, _ := reqs[j].Limit.Compile(); !stamps[0][j].IsZero() && bp.Debts() {
							bts = append(bts, batchTake{reqs[j].Key, reqs[j].Limit, stamps[0][j]})
						}
					}
					// memstore.TakeAll can lose an update: saving a new key
					// sweeps its shard, which may drop another key of the
					// same batch whose old state had expired, after that key
					// was looked up; its new state then goes to an orphaned
					// entry. When memstore lost a key it just wrote, the
					// stores part ways through no fault of redisstore.
					for j, r := range reqs {
						if res := out[1][j]; errs[1] == nil && (res.Granted > 0 || !res.BlockedUntil.IsZero()) {
							if _, ok := ms.TTL(r.Key, r.Limit); !ok {
								t.Logf("step %d: memstore.TakeAll lost the state of %q it had just written (a memstore bug); stopping this run", step, r.Key)
								return
							}
						}
					}
				case op < 88 && len(bts) > 0 && rng.IntN(3) == 0:
					// Settle a stamped batch's take, made steps ago.
					j := rng.IntN(len(bts))
					bt := bts[j]
					bts = append(bts[:j], bts[j+1:]...)
					if bt.limit != keyLimit[bt.key] {
						break // as for a reservation below
					}
					actual := rng.Int64N(2*bt.st.Estimate + 1)
					for i, lim := range lims {
						res[i], errs[i] = lim.SettleStamped(ctx, bt.key, bt.limit, bt.st, actual)
					}
					same(step, fmt.Sprintf("SettleStamped(%s, %+v, %+v, %d)", bt.key, bt.limit, bt.st, actual), res, errs)
				case op < 88 && a != weir.Concurrency && len(resvs) > 0 && rng.IntN(2) == 0:
					// Settle an open reservation, taken steps ago: its
					// stamped refund, bounded by the time since.
					j := rng.IntN(len(resvs))
					if rk := resvs[j][0].Key; resvs[j][0].Limit != keyLimit[rk] {
						// The key's limit changed since: a settlement under
						// the old one writes a state the new one reads
						// differently in each store (as a Refund would).
						resvs = append(resvs[:j], resvs[j+1:]...)
						break
					}
					actual := rng.Int64N(2*resvs[j][0].Estimate + 1)
					for i := range stores {
						res[i], errs[i] = resvs[j][i].Settle(ctx, actual)
					}
					same(step, fmt.Sprintf("Settle(%s, %+v, %d of %d)", resvs[j][0].Key, resvs[j][0].Limit, actual, resvs[j][0].Estimate), res, errs)
					resvs = append(resvs[:j], resvs[j+1:]...)
				case op < 88 && a != weir.Concurrency: // Reserve
					n := 1 + rng.Int64N(min(maxCost, 4))
					var rv [2]*weir.Reservation
					for i, lim := range lims {
						rv[i], res[i], errs[i] = lim.Reserve(ctx, k, l, n)
					}
					same(step, fmt.Sprintf("Reserve(%s, %+v, %d)", k, l, n), res, errs)
					if (rv[0] == nil) != (rv[1] == nil) {
						t.Fatalf("step %d: reservations %v vs %v", step, rv[0], rv[1])
					}
					if rv[0] != nil {
						if rv[0].Stamp != rv[1].Stamp {
							t.Fatalf("step %d: stamps %+v vs %+v", step, rv[0].Stamp, rv[1].Stamp)
						}
						resvs = append(resvs, rv)
					}
				case op < 90 && a != weir.Concurrency: // Debit and Refund: debt
					n := rng.Int64N(3*maxCost + 2)
					switch rng.IntN(20) {
					case 0:
						n = 1 << 50 // saturates at the debt's bound
					case 1:
						n = -1
					}
					name := "Debit"
					if rng.IntN(3) == 0 {
						name = "Refund"
					}
					for i, lim := range lims {
						f := lim.Debit
						if name == "Refund" {
							f = lim.Refund
						}
						res[i], errs[i] = f(ctx, k, l, n)
					}
					same(step, fmt.Sprintf("%s(%s, %+v, %d)", name, k, l, n), res, errs)
				case op < 90 && a == weir.Concurrency: // Acquire and Release
					if len(leases) > 0 && rng.IntN(2) == 0 {
						j := rng.IntN(len(leases))
						for i := range stores {
							errs[i] = leases[j].l[i].Release(ctx)
						}
						same(step, "Release", res, errs)
						leases = append(leases[:j], leases[j+1:]...)
						break
					}
					n := 1 + rng.Int64N(min(maxCost, 3))
					var ls lease
					for i, lim := range lims {
						ls.l[i], res[i], errs[i] = lim.AcquireN(ctx, k, l, n)
					}
					same(step, fmt.Sprintf("AcquireN(%s, %+v, %d)", k, l, n), res, errs)
					if (ls.l[0] == nil) != (ls.l[1] == nil) {
						t.Fatalf("step %d: leases %v vs %v", step, ls.l[0], ls.l[1])
					}
					if ls.l[0] != nil {
						leases = append(leases, ls)
						for i := range ls.l {
							ls.l[i].Key = k // Release keys by the key, not the limit's params
						}
					}
				case op < 92: // Reset
					for i, s := range stores {
						errs[i] = weir.NewLimiter(s).Reset(ctx, k, l)
					}
					same(step, "Reset", res, errs)
				default: // Peek under another key's limit: more limit changes
					for i, s := range stores {
						res[i], errs[i] = s.Take(ctx, k, l, 0)
					}
					same(step, "Peek", res, errs)
				}
			}
		})
	}
}
