package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/storetest"
)

// libraries returns the names of the function libraries loaded on srv.
func libraries(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	v, err := srv.Do("FUNCTION", "LIST")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range v.([]any) {
		f := l.([]any) // library_name <name> engine LUA functions [...]
		for i := 0; i+1 < len(f); i += 2 {
			if f[i] == "library_name" {
				names = append(names, f[i+1].(string))
			}
		}
	}
	return names
}

// hammer sends calls decisions of cost 1 on key under l from 16 goroutines
// and returns how many were allowed; any error fails the test.
func hammer(t *testing.T, s *Store, key string, l weir.Limit, calls int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	next := atomic.Int64{}
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(calls) {
				r, err := s.Take(context.Background(), key, l, 1)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		t.Fatal(e)
	}
	return allowed.Load()
}

// TestFunctions: on Redis 7 the store loads its library once, calls it with
// FCALL and never sends a script; a second store finds the library there.
func TestFunctions(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}})
	if got := s.Scripting(); got != "functions" {
		t.Fatalf("Scripting() = %q on Redis 7, want functions", got)
	}
	if got := libraries(t, srv); len(got) != 1 || got[0] != lib.name {
		t.Fatalf("libraries on the server: %q, want [%s]", got, lib.name)
	}
	if !strings.HasPrefix(lib.name, "weir_") || len(lib.name) != len("weir_")+12 {
		t.Fatalf("library name %q: want weir_ and 12 hex digits", lib.name)
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	l := weir.Limit{Algorithm: weir.SlidingWindow, Rate: 10, Period: time.Minute}
	if got := hammer(t, s, "k", l, 25); got != 10 {
		t.Fatalf("%d of 25 allowed under %v, want 10", got, l)
	}
	// A batch and a lease release go through the library too.
	c := weir.Limit{Algorithm: weir.Concurrency, Rate: 2, Period: time.Minute}
	rs := make([]weir.Result, 2)
	err := s.Do(context.Background(), []weir.Request{{Key: "a", Limit: l, N: 1}, {Key: "b", Limit: c, N: 1, Lease: "L1"}}, rs)
	if err != nil || !rs[0].Allowed || !rs[1].Allowed {
		t.Fatalf("TakeAll: %+v %v", rs, err)
	}
	if err := s.Do(context.Background(), []weir.Request{{Key: "b", Limit: c, Mode: weir.ModeRelease, Lease: "L1"}}, make([]weir.Result, 1)); err != nil {
		t.Fatal(err)
	}
	// The 25 takes went out coalesced, in as many FCALLs as the store
	// sent batches; the batch and the release are one FCALL each.
	batches, decisions := s.coalesce.batches.Load(), s.coalesce.decisions.Load()
	calls := commandCalls(t, srv)
	if decisions != 25 || calls["fcall"] != int(batches)+2 || calls["evalsha"] != 0 || calls["eval"] != 0 || calls["function|load"] != 0 {
		t.Fatalf("command calls %v after %d decisions in %d batches: want %d FCALLs and no EVALSHA, EVAL or FUNCTION LOAD", calls, decisions, batches, batches+2)
	}

	s2 := newTestStore(t, Config{Addrs: []string{srv.Addr}})
	if s2.Scripting() != "functions" || s2.libLoads.Load() != 1 {
		t.Fatalf("second store: %s, %d loads; want functions, 1 (the library already there)", s2.Scripting(), s2.libLoads.Load())
	}
	if got := hammer(t, s2, "k", l, 5); got != 0 {
		t.Fatalf("second store admitted %d past the shared limit", got)
	}
}

// TestLibraryReload: a Redis that lost its functions (restarted without
// persistence; here FUNCTION FLUSH) makes the next calls fail with
// "Function not found", which ran nothing: the store loads the library
// once, whatever the number of calls that found it missing, and sends them
// again. Nothing is lost or counted twice.
func TestLibraryReload(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}})
	l := weir.Limit{Algorithm: weir.GCRA, Rate: 100, Period: time.Hour}
	if got := hammer(t, s, "k", l, 40); got != 40 {
		t.Fatalf("%d of the first 40 allowed, want 40", got)
	}
	for round := 1; round <= 3; round++ {
		if _, err := srv.Do("FUNCTION", "FLUSH"); err != nil {
			t.Fatal(err)
		}
		before := s.libLoads.Load()
		got := hammer(t, s, "k", l, 30)
		if want := int64(min(30, 100-40-30*(round-1))); got != want {
			t.Fatalf("round %d: %d of 30 allowed after FUNCTION FLUSH, want %d", round, got, want)
		}
		if n := s.libLoads.Load() - before; n != 1 {
			t.Fatalf("round %d: the library was loaded %d times by 16 callers that found it missing, want once", round, n)
		}
		if got := libraries(t, srv); len(got) != 1 || got[0] != lib.name {
			t.Fatalf("after reload: libraries %q", got)
		}
	}
}

// TestEvalFallback: where FUNCTION LOAD is refused (here by an ACL; on a
// Redis before 7.0 it is an unknown command) the store runs the same Lua as
// EVALSHA scripts: the conformance suite passes that way too, and a script
// flushed from the cache is sent again with EVAL.
func TestEvalFallback(t *testing.T) {
	srv := redistest.Standalone(t)
	if _, err := srv.Do("ACL", "SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function"); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Username: "nofn", Password: "pw"})
	if got := s.Scripting(); got != "eval" {
		t.Fatalf("Scripting() = %q for a user without FUNCTION, want eval", got)
	}
	if got := libraries(t, srv); len(got) != 0 {
		t.Fatalf("libraries %q loaded by a user without FUNCTION", got)
	}
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute}
	if got := hammer(t, s, "k", l, 15); got != 10 {
		t.Fatalf("%d of 15 allowed under %v, want 10", got, l)
	}
	if _, err := srv.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	if got := hammer(t, s, "k2", l, 12); got != 10 {
		t.Fatalf("after SCRIPT FLUSH: %d of 12 allowed, want 10", got)
	}
	if calls := commandCalls(t, srv); calls["fcall"] != 0 || calls["eval"] < 1 || calls["evalsha"] < 1 {
		t.Fatalf("command calls %v: want EVALSHA, EVAL after the flush, no FCALL", calls)
	}

	// A user who may load functions but not call them: the first FCALL is
	// refused before anything ran, and the store moves to EVALSHA.
	if _, err := srv.Do("ACL", "SETUSER", "nofcall", "on", ">pw", "~*", "&*", "+@all", "-fcall"); err != nil {
		t.Fatal(err)
	}
	nf := newTestStore(t, Config{Addrs: []string{srv.Addr}, Username: "nofcall", Password: "pw"})
	if got := hammer(t, nf, "k3", l, 12); got != 10 || nf.Scripting() != "eval" {
		t.Fatalf("user without FCALL: %d of 12 allowed, scripting %s; want 10, eval", got, nf.Scripting())
	}
	// A command refused inside the function is an error, not a reason to
	// change forms: the function may have run up to it.
	if _, err := srv.Do("ACL", "SETUSER", "notime", "on", ">pw", "~*", "&*", "+@all", "-time"); err != nil {
		t.Fatal(err)
	}
	nt := newTestStore(t, Config{Addrs: []string{srv.Addr}, Username: "notime", Password: "pw"})
	if _, err := nt.Take(context.Background(), "k4", l, 1); err == nil || nt.Scripting() != "functions" {
		t.Fatalf("user without TIME: err %v, scripting %s; want an error and functions", err, nt.Scripting())
	}

	// The conformance suite, uncoalesced: every decision its own EVAL
	// script (the standalone suite covers the batch function, and the
	// hammers above the batch script).
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Harness {
			clock := storetest.NewClock(storetest.Epoch)
			s := newTestStore(t, Config{
				Addrs: []string{srv.Addr}, Clock: clock.Now, evalOnly: true, MaxBatch: 1,
				Prefix: fmt.Sprintf("ev%d", prefixSeq.Add(1)),
			})
			if s.Scripting() != "eval" {
				t.Fatalf("evalOnly store runs %s", s.Scripting())
			}
			return storetest.Harness{Store: s, Clock: clock, TTL: s.TTL, TTLSlack: time.Millisecond}
		})
	})
}

// clusterLibrary: the library is on every primary, and a primary that lost
// it (FUNCTION FLUSH on one node) gets it back on the first call that
// misses it, while keys on the other primaries never notice.
func clusterLibrary(t *testing.T, c *redistest.ClusterGroup) {
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "lib"})
	if s.Scripting() != "functions" {
		t.Fatalf("Scripting() = %q on a cluster", s.Scripting())
	}
	for i, n := range c.Nodes {
		if got := libraries(t, n); len(got) != 1 || got[0] != lib.name {
			t.Fatalf("node %d: libraries %q, want [%s]", i, got, lib.name)
		}
	}
	if _, err := c.Nodes[1].Do("FUNCTION", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 3, Period: time.Hour}
	// 60 keys: about 20 on each primary, every one of them admitted exactly
	// Rate times.
	for i := 0; i < 60; i++ {
		key := fmt.Sprintf("spread-%d", i)
		if got := hammer(t, s, key, l, 5); got != 3 {
			t.Fatalf("key %s: %d of 5 allowed, want 3", key, got)
		}
	}
	if got := libraries(t, c.Nodes[1]); len(got) != 1 || got[0] != lib.name {
		t.Fatalf("flushed node after the calls: libraries %q, want [%s]", got, lib.name)
	}
}

// TestACLUser: the ACL user docs/operations.md recommends can run every
// algorithm, batches, leases and resets, with the library.
func TestACLUser(t *testing.T) {
	srv := redistest.Standalone(t)
	// The line in docs/operations.md, word for word.
	if _, err := srv.Do("ACL", "SETUSER", "weir", "on", ">secret", "~weir:*", "+@read", "+@write", "+@scripting", "+@connection", "+time", "+info"); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Username: "weir", Password: "secret"})
	if s.Scripting() != "functions" {
		t.Fatalf("Scripting() = %q for the documented ACL user, want functions", s.Scripting())
	}
	ctx := context.Background()
	for _, a := range weir.Algorithms() {
		l := weir.Limit{Algorithm: a, Rate: 3, Period: time.Minute, Block: time.Minute}
		if got := hammer(t, s, "acl-"+string(a), l, 5); got != 3 {
			t.Fatalf("%s: %d of 5 allowed, want 3", a, got)
		}
		if err := weir.NewLimiter(s).Reset(ctx, "acl-"+string(a), l); err != nil {
			t.Fatalf("%s: Reset: %v", a, err)
		}
		rs := make([]weir.Result, 2)
		if err := s.Do(ctx, []weir.Request{{Key: "acl-" + string(a), Limit: l, N: 1, Lease: "L"}, {Key: "acl2", Limit: l, N: 1, Lease: "L"}}, rs); err != nil || !rs[0].Allowed {
			t.Fatalf("%s: TakeAll after Reset: %+v %v", a, rs, err)
		}
		if err := s.Do(ctx, []weir.Request{{Key: "acl-" + string(a), Limit: l, Mode: weir.ModeRelease, Lease: "L"}}, make([]weir.Result, 1)); err != nil {
			t.Fatalf("%s: Release: %v", a, err)
		}
	}
}

// cachedLimits asks srv's weir library how many parsed limits it holds.
func cachedLimits(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	v, err := srv.Do("FCALL", lib.name+"_limits", "0")
	if err != nil {
		t.Fatal(err)
	}
	return v.(int64)
}

// TestLimitCache: the library keeps a limit's parse between calls (the
// same limit, called again, adds nothing), keeps at most 256 of them
// however many distinct limits come, and a limit that changes takes effect
// at its first call: batched, alone (MaxBatch 1) and all-or-nothing.
func TestLimitCache(t *testing.T) {
	ctx := context.Background()
	for _, maxBatch := range []int{0, 1} {
		srv := redistest.Standalone(t)
		s := newTestStore(t, Config{Addrs: []string{srv.Addr}, MaxBatch: maxBatch})
		l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
		for i := 0; i < 5; i++ {
			if _, err := s.Take(ctx, fmt.Sprintf("same%d", i), l, 1); err != nil {
				t.Fatal(err)
			}
		}
		if n := cachedLimits(t, srv); n != 1 {
			t.Fatalf("MaxBatch %d: %d cached limits after 5 calls of one limit, want 1", maxBatch, n)
		}
		for r := 1; r <= 600; r++ {
			d := weir.Limit{Algorithm: weir.TokenBucket, Rate: int64(r), Period: time.Hour}
			if _, err := s.Take(ctx, "many", d, 1); err != nil {
				t.Fatal(err)
			}
			if n := cachedLimits(t, srv); n < 1 || n > 256 {
				t.Fatalf("MaxBatch %d: %d cached limits after %d distinct limits, want 1..256", maxBatch, n, r+1)
			}
		}
		// A changed limit: rate 1 is spent, rate 3 admits two more at once.
		key := "changed"
		for i, want := range []bool{true, false} {
			if r, err := s.Take(ctx, key, l, 1); err != nil || r.Allowed != want {
				t.Fatalf("MaxBatch %d: take %d under rate 1: %+v %v, want allowed %v", maxBatch, i, r, err, want)
			}
		}
		l3 := l
		l3.Rate = 3
		for i, want := range []bool{true, true, false} {
			if r, err := s.Take(ctx, key, l3, 1); err != nil || r.Allowed != want || r.Limit != 3 {
				t.Fatalf("MaxBatch %d: take %d under rate 3: %+v %v, want allowed %v of 3", maxBatch, i, r, err, want)
			}
		}
		// The same through the all-or-nothing script.
		l5 := l
		l5.Rate = 5
		rs := make([]weir.Result, 1)
		err := s.Do(ctx, []weir.Request{{Key: key, Limit: l5, N: 2}}, rs)
		if err != nil || !rs[0].Allowed || rs[0].Remaining != 0 {
			t.Fatalf("MaxBatch %d: TakeAll of 2 under rate 5: %+v %v, want allowed, 0 remaining", maxBatch, rs, err)
		}
	}
}
