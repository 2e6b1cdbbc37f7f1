package memstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
	"unsafe"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/storetest"
)

// TestPackKnowsEveryField: pack must say no to any State with a field set
// outside the layout's, or a state would lose that field in its slot. The
// test sets each field of algorithm.State in turn, so a field added to
// State later fails here until pack (and this list) know it.
func TestPackKnowsEveryField(t *testing.T) {
	packed := map[layout][]string{
		layoutNone:   nil,
		layoutWindow: {"Window", "Count", "Prev"},
		layoutBucket: {"Level", "TS", "WarmStart"},
		layoutGCRA:   {"TAT", "Frac"},
	}
	known := map[string]bool{"Window": true, "Count": true, "Prev": true, "Level": true, "TS": true, "TAT": true, "Frac": true,
		"Log": true, "Leases": true, "Held": true, "BlockedUntil": true, "Strikes": true, "LastBox": true, "WarmStart": true, "Debt": true}
	typ := reflect.TypeFor[algorithm.State]()
	for i := range typ.NumField() {
		if !known[typ.Field(i).Name] {
			t.Fatalf("algorithm.State has a field memstore's pack does not know: %s", typ.Field(i).Name)
		}
	}
	// A used Log and a lease, from the algorithms themselves.
	var logged, leased algorithm.State
	pl, _ := weir.Limit{Algorithm: weir.SlidingLog, Rate: 5, Period: time.Second}.Compile()
	algorithm.Take(&pl, &logged, 1, 1, algorithm.Exact)
	pc, _ := weir.Limit{Algorithm: weir.Concurrency, Rate: 5, Period: time.Second}.Compile()
	algorithm.Take(&pc, &leased, 1, 1, algorithm.Exact)
	for lay, fields := range packed {
		for i := range typ.NumField() {
			f := typ.Field(i)
			var st algorithm.State
			v := reflect.ValueOf(&st).Elem().Field(i)
			switch f.Name {
			case "Log":
				st.Log = logged.Log
			case "Leases":
				st.Leases = leased.Leases
			default:
				if v.Kind() == reflect.Bool {
					v.SetBool(true)
				} else {
					v.SetInt(-7)
				}
			}
			inLayout := false
			for _, name := range fields {
				inLayout = inLayout || name == f.Name
			}
			var w [3]int64
			if got := pack(lay, &st, &w); got != inLayout {
				t.Fatalf("layout %d, %s set: pack = %v, want %v", lay, f.Name, got, inLayout)
			}
			if !inLayout {
				continue
			}
			var back algorithm.State
			unpack(lay, &w, &back)
			if !reflect.DeepEqual(back, st) {
				t.Fatalf("layout %d, %s: unpacked %+v, want %+v", lay, f.Name, back, st)
			}
		}
	}
}

// ref is the model memstore is checked against: every key's state under
// each algorithm in a map, decided by package algorithm directly, never
// packed, never swept.
type ref struct {
	m map[string]*refEntry
}

type refEntry struct {
	l  weir.Limit
	p  algorithm.Params
	st algorithm.State
}

func refKey(key string, k algorithm.Kind) string { return fmt.Sprint(key, "/", k) }

// entry returns key's entry under l (fresh if absent, not yet inserted).
func (r *ref) entry(key string, l weir.Limit) (*refEntry, string, bool) {
	k, _ := l.Algorithm.Kind()
	rk := refKey(key, k)
	e := r.m[rk]
	p, err := l.Compile()
	if err != nil {
		panic(err)
	}
	if e == nil {
		return &refEntry{l: l, p: p}, rk, true
	}
	if e.l.Warmup != l.Warmup {
		e.st = algorithm.State{}
	}
	e.l, e.p = l, p
	return e, rk, false
}

func (r *ref) take(key string, l weir.Limit, n int64, mode algorithm.Mode, lease string, now int64) weir.Result {
	e, rk, fresh := r.entry(key, l)
	if mode == algorithm.AtMost {
		n = min(n, e.p.MaxCost())
	}
	d := algorithm.Take(&e.p, &e.st, now, n, mode)
	if d.Granted > 0 && lease != "" {
		algorithm.SetLeaseID(&e.st, lease)
	}
	if fresh && d.TTL > 0 {
		r.m[rk] = e
	}
	return weir.ResultOf(d)
}

func (r *ref) takeAll(reqs []weir.Request, now int64) []weir.Result {
	es := make([]*refEntry, len(reqs))
	rks := make([]string, len(reqs))
	fresh := make([]bool, len(reqs))
	ns := make([]int64, len(reqs))
	res := make([]weir.Result, len(reqs))
	all := true
	for i, q := range reqs {
		es[i], rks[i], fresh[i] = r.entry(q.Key, q.Limit)
		ns[i] = q.N
		if q.Mode == weir.ModeAtMost {
			ns[i] = min(q.N, es[i].p.MaxCost())
		}
	}
	for i, q := range reqs {
		d := algorithm.Check(&es[i].p, &es[i].st, now, ns[i], q.AlgorithmMode())
		res[i] = weir.ResultOf(d)
		all = all && d.Allowed
	}
	for i, q := range reqs {
		if !all && res[i].Allowed {
			res[i].Granted, res[i].Delay = 0, 0
			continue
		}
		d := algorithm.Take(&es[i].p, &es[i].st, now, ns[i], q.AlgorithmMode())
		if all && d.Granted > 0 && q.Lease != "" {
			algorithm.SetLeaseID(&es[i].st, q.Lease)
		}
		res[i] = weir.ResultOf(d)
		if fresh[i] && d.TTL > 0 {
			r.m[rks[i]] = es[i]
		}
	}
	return res
}

// TestSameAsUnpacked runs random workloads on every algorithm, with
// penalty boxes, escalation, warm-up, debts, leases, limit changes,
// resets and batches, on keys that share one shard, and requires every
// result to be the one package algorithm gives on unpacked states, and
// the table to stay well formed.
func TestSameAsUnpacked(t *testing.T) {
	ctx := context.Background()
	var limits []weir.Limit
	for _, a := range weir.Algorithms() {
		base := weir.Limit{Algorithm: a, Rate: 5, Period: time.Second}
		limits = append(limits, base)
		raised := base
		raised.Rate = 8
		limits = append(limits, raised)
		boxed := base
		boxed.Block = 3 * time.Second
		if a != weir.Concurrency {
			boxed.Escalate[0] = 7 * time.Second
			boxed.ForgetAfter = time.Minute
		}
		if _, err := boxed.Compile(); err == nil {
			limits = append(limits, boxed)
		}
		if a == weir.TokenBucket || a == weir.GCRA {
			w := base
			w.Burst, w.Warmup = 5, 20*time.Second
			limits = append(limits, w)
		}
		if a == weir.SlidingWindow {
			b := base
			b.Buckets = 4
			limits = append(limits, b)
		}
	}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		clock := storetest.NewClock(storetest.Epoch)
		s := New(WithClock(clock.Now), WithShards(1))
		model := &ref{m: map[string]*refEntry{}}
		keys := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}
		for op := range 4000 {
			now := clock.Now().UnixMicro()
			key := keys[rng.IntN(len(keys))]
			l := limits[rng.IntN(len(limits))]
			if l.Buckets > 0 {
				// A bucketed window counts its Window in other units: a
				// key switched between the two forms is not compared.
				key += "#b"
			}
			n := int64(rng.IntN(4))
			where := fmt.Sprintf("seed %d op %d: %s %s n=%d", seed, op, key, l.Algorithm, n)
			switch x := rng.IntN(100); {
			case x < 10:
				clock.Advance(time.Duration(rng.IntN(3_000_000)) * time.Microsecond)
			case x < 13:
				weir.NewLimiter(s).Reset(ctx, key, l)
				k, _ := l.Algorithm.Kind()
				delete(model.m, refKey(key, k))
			case x < 18 && l.Algorithm == weir.Concurrency:
				lease := fmt.Sprint("L", rng.IntN(4))
				s.Do(ctx, []weir.Request{{Key: key, Limit: l, Mode: weir.ModeRelease, Lease: lease}}, make([]weir.Result, 1))
				k, _ := l.Algorithm.Kind()
				if e := model.m[refKey(key, k)]; e != nil {
					algorithm.Release(&e.st, lease)
				}
			case x < 25:
				q := weir.Request{Key: key, Limit: l, N: n}
				p, _ := l.Compile()
				if p.Kind == algorithm.Concurrency {
					q.Lease = fmt.Sprint("L", rng.IntN(4))
				} else if weir.CheckDebt(key, n, &p, algorithm.Debit) == nil {
					q.Mode = weir.Mode(1 + rng.IntN(2))
				}
				if q.Mode == weir.ModeTake && rng.IntN(2) == 0 {
					q.Mode = weir.ModeAtMost
				}
				var got [1]weir.Result
				if err := s.Do(ctx, []weir.Request{q}, got[:]); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				got[0].At = 0 // the model dates nothing
				if want := model.take(key, l, n, q.AlgorithmMode(), q.Lease, now); got[0] != want {
					t.Fatalf("%s, %s: got %+v, want %+v", where, q.Mode, got[0], want)
				}
			case x < 35:
				// A batch of up to three distinct keys.
				var reqs []weir.Request
				for _, k := range rng.Perm(len(keys))[:1+rng.IntN(3)] {
					q := weir.Request{Key: keys[k], Limit: limits[rng.IntN(len(limits))], N: int64(1 + rng.IntN(2))}
					if q.Limit.Buckets > 0 {
						q.Key += "#b"
					}
					reqs = append(reqs, q)
				}
				got := make([]weir.Result, len(reqs))
				if err := s.Do(ctx, reqs, got); err != nil {
					t.Fatalf("%s batch: %v", where, err)
				}
				for i := range got {
					got[i].At = 0 // the model dates nothing
				}
				var before []string
				for _, q := range reqs {
					k, _ := q.Limit.Algorithm.Kind()
					e := model.m[refKey(q.Key, k)]
					ttl, ok := s.TTL(q.Key, q.Limit)
					if e != nil {
						before = append(before, fmt.Sprintf("%s %s %+v ttl %v %v", q.Key, q.Limit.Algorithm, e.st, ttl, ok))
					}
				}
				want := model.takeAll(reqs, now)
				if !reflect.DeepEqual(got, want) {
					t.Log(before)
					t.Fatalf("%s batch %+v:\ngot  %+v\nwant %+v", where, reqs, got, want)
				}
			default:
				ttl, ok := s.TTL(key, l)
				k, _ := l.Algorithm.Kind()
				var before algorithm.State
				if e := model.m[refKey(key, k)]; e != nil {
					before = e.st
				}
				got, err := s.Take(ctx, key, l, n)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if want := model.take(key, l, n, algorithm.Exact, "", now); got != want {
					t.Logf("before: model %+v, store ttl %v %v, now %d", before, ttl, ok, now)
					t.Fatalf("%s: got %+v, want %+v", where, got, want)
				}
			}
			checkTable(t, s)
		}
	}
}

// checkTable requires every shard's table to be well formed: each full
// slot found from its home index through full slots only, the counts
// right, and the scratch holding nothing beyond packed fields.
func checkTable(t *testing.T, s *Store) {
	t.Helper()
	for si := range s.shards {
		sh := &s.shards[si]
		used, keys := 0, map[string]bool{}
		m := sh.mask()
		for i := range sh.slots {
			sl := &sh.slots[i]
			if sl.c == nil {
				continue
			}
			used++
			keys[sl.keyString()] = true
			for j := int(sl.tag) & m; j != i; j = (j + 1) & m {
				if sh.slots[j].c == nil {
					t.Fatalf("shard %d: slot %d (%q) is past an empty slot %d from its home", si, i, sl.keyString(), j)
				}
			}
			if sl.x == nil && sl.c.lay == layoutNone && sl.v != [3]int64{} {
				t.Fatalf("slot %q packs a state its layout has no room for", sl.keyString())
			}
		}
		if used != sh.used || len(keys) != sh.keys {
			t.Fatalf("shard %d: %d slots and %d keys counted as %d and %d", si, used, len(keys), sh.used, sh.keys)
		}
		sc := sh.scratch
		sc.Window, sc.Count, sc.Prev, sc.Level, sc.TS, sc.WarmStart, sc.TAT, sc.Frac = 0, 0, 0, 0, 0, 0, 0, 0
		var w [3]int64
		if !pack(layoutNone, &sc, &w) {
			t.Fatalf("shard %d: the scratch kept unpacked fields: %+v", si, sh.scratch)
		}
	}
}

// TestTableChurn inserts and deletes many keys in one small shard, under
// several algorithms each, checking the table after each step and the key
// count against a plain set.
func TestTableChurn(t *testing.T) {
	clock := storetest.NewClock(storetest.Epoch)
	s := New(WithClock(clock.Now), WithShards(1))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	held := map[string]map[weir.Algorithm]bool{}
	algs := []weir.Algorithm{weir.FixedWindow, weir.GCRA, weir.TokenBucket}
	for op := range 20000 {
		key := fmt.Sprint("k", rng.IntN(300))
		a := algs[rng.IntN(len(algs))]
		l := weir.Limit{Algorithm: a, Rate: 10, Period: time.Hour}
		if rng.IntN(3) == 0 {
			weir.NewLimiter(s).Reset(ctx, key, l)
			delete(held[key], a)
			if len(held[key]) == 0 {
				delete(held, key)
			}
		} else {
			if _, err := s.Take(ctx, key, l, 1); err != nil {
				t.Fatal(err)
			}
			if held[key] == nil {
				held[key] = map[weir.Algorithm]bool{}
			}
			held[key][a] = true
		}
		if op%97 == 0 {
			checkTable(t, s)
		}
		if got := s.Len(); got != len(held) {
			t.Fatalf("op %d: Len %d, want %d", op, got, len(held))
		}
	}
	checkTable(t, s)
}

// TestTableShrinks: a shard whose keys have gone gives its table back
// (down to a table at least 1/16 full), and the keys left stay found.
func TestTableShrinks(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 && unsafe.Sizeof(slot{}) != 64 {
		t.Fatalf("a slot is %d bytes, want 64 (one cache line)", unsafe.Sizeof(slot{}))
	}
	clock := storetest.NewClock(storetest.Epoch)
	s := New(WithClock(clock.Now), WithShards(1))
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
	for i := range 4000 {
		s.Take(ctx, fmt.Sprint("k", i), l, 3)
	}
	grown := len(s.shards[0].slots)
	for i := range 3990 {
		weir.NewLimiter(s).Reset(ctx, fmt.Sprint("k", i), l)
	}
	checkTable(t, s)
	sh := &s.shards[0]
	if len(sh.slots) >= grown || sh.used*16 < len(sh.slots) {
		t.Fatalf("10 keys left in a table of %d slots (it had grown to %d)", len(sh.slots), grown)
	}
	for i := 3990; i < 4000; i++ {
		if r, _ := s.Take(ctx, fmt.Sprint("k", i), l, 8); r.Allowed {
			t.Fatalf("k%d admitted 3 + 8 events under 10/h after the table shrank", i)
		}
	}
}
