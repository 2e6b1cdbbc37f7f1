package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/override"

	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/storetest"
)

func overrideHarness(addrs []string, maxBatch int) func(t *testing.T) storetest.Harness {
	return func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		s := newTestStore(t, Config{
			Addrs:     addrs,
			Clock:     clock.Now,
			Prefix:    fmt.Sprintf("ov%d", prefixSeq.Add(1)),
			Overrides: true,
			MaxBatch:  maxBatch,
		})
		return storetest.Harness{Store: s, Clock: clock, TTL: s.TTL, TTLSlack: 0}
	}
}

// TestOverridesStandalone runs the override suite with coalesced calls
// (batch.lua) and with one call per decision (take.lua).
func TestOverridesStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	t.Run("Coalesced", func(t *testing.T) { storetest.RunOverrides(t, overrideHarness([]string{srv.Addr}, 0)) })
	t.Run("Alone", func(t *testing.T) { storetest.RunOverrides(t, overrideHarness([]string{srv.Addr}, 1)) })
}

// TestOverridesCluster: the override lives in its key's slot.
func TestOverridesCluster(t *testing.T) {
	c := redistest.Cluster(t)
	storetest.RunOverrides(t, overrideHarness(c.Addrs, 0))
}

// TestOverridesTwoStores: two stores (two instances) on one Redis. An
// exact override set through one binds the other's very next decision; a
// pattern binds the instance that set it at once and the other from its
// next RefreshOverrides (weir serve's, every second), not before.
func TestOverridesTwoStores(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { overridesTwoStores(t, []string{redistest.Standalone(t).Addr}) })
	// On a cluster the keys below fall in many slots: a pattern is
	// applied in Go before the call, with the limit sent to the key's own
	// slot, so it binds every slot alike, within the same refresh bound.
	t.Run("Cluster", func(t *testing.T) { overridesTwoStores(t, redistest.Cluster(t).Addrs) })
}

func overridesTwoStores(t *testing.T, addrs []string) {
	clock := storetest.NewClock(storetest.Epoch)
	cfg := Config{Addrs: addrs, Clock: clock.Now, Prefix: fmt.Sprintf("ov%d", prefixSeq.Add(1)), Overrides: true}
	a, b := newTestStore(t, cfg), newTestStore(t, cfg)
	ctx := context.Background()
	base := weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Hour}
	limitOn := func(s *Store, key string) int64 {
		t.Helper()
		r, err := s.Take(ctx, key, base, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r.Limit
	}
	over := base
	over.Rate = 9
	if err := a.SetOverride(ctx, override.Override{Key: "r:exact", Limit: over}); err != nil {
		t.Fatal(err)
	}
	if got := limitOn(b, "r:exact"); got != 9 {
		t.Fatalf("the other instance decided the exact key under %d, want 9", got)
	}
	over.Rate = 7
	if err := a.SetOverride(ctx, override.Override{Key: "r:team-*", Limit: over}); err != nil {
		t.Fatal(err)
	}
	if got := limitOn(a, "r:team-1"); got != 7 {
		t.Fatalf("the instance that set the pattern decided under %d, want 7", got)
	}
	if got := limitOn(b, "r:team-1"); got != 2 {
		t.Fatalf("before its refresh the other instance decided under %d; the bound says 2 until it refreshes", got)
	}
	if err := b.RefreshOverrides(ctx); err != nil {
		t.Fatal(err)
	}
	slots := map[uint16]bool{}
	for i := range 64 {
		k := fmt.Sprintf("r:team-%d", i)
		slots[slot(k)] = true
		for _, s := range []*Store{a, b} {
			if got := limitOn(s, k); got != 7 {
				t.Fatalf("after the refresh %s decided under %d, want 7", k, got)
			}
		}
	}
	if len(slots) < 32 {
		t.Fatalf("the pattern's keys fell in only %d slots", len(slots))
	}
	if ok, err := a.DeleteOverride(ctx, "r:exact"); err != nil || !ok {
		t.Fatalf("DeleteOverride = %v, %v", ok, err)
	}
	if got := limitOn(b, "r:exact"); got != 2 {
		t.Fatalf("after the delete the other instance decided under %d, want 2", got)
	}
}

// TestOverrideBound: two stores (two instances) on one Redis, and on a
// cluster, set 160 overrides at once under a bound of 20: exactly 20
// are stored and logged, every other PUT is refused with an error naming
// the bound and writes nothing (its key decides under the rule).
func TestOverrideBound(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { overrideBound(t, []string{redistest.Standalone(t).Addr}) })
	t.Run("Cluster", func(t *testing.T) { overrideBound(t, redistest.Cluster(t).Addrs) })
}

func overrideBound(t *testing.T, addrs []string) {
	ctx := context.Background()
	cfg := Config{Addrs: addrs, Prefix: fmt.Sprintf("ov%d", prefixSeq.Add(1)), Overrides: true}
	a, b := newTestStore(t, cfg), newTestStore(t, cfg)
	a.ovrMax, b.ovrMax = 20, 20
	base := weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}
	l := base
	l.Rate = 50
	var ok, refused atomic.Int64
	stored := make([]atomic.Bool, 160)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := a
			if g%2 == 1 {
				s = b
			}
			for i := range 10 {
				key := fmt.Sprintf("r:%d-%d", g, i)
				if i%3 == 0 {
					key += "*"
				}
				err := s.SetOverride(ctx, override.Override{Key: key, Limit: l})
				var oe *override.Error
				switch {
				case err == nil:
					ok.Add(1)
					stored[g*10+i].Store(true)
				case errors.As(err, &oe) && oe.Field == "key" && strings.Contains(oe.Reason, "the most it keeps (20)"):
					refused.Add(1)
				default:
					t.Errorf("SetOverride(%s) = %v; want nil or the bound's error", key, err)
				}
			}
		}()
	}
	wg.Wait()
	list, err := a.Overrides(ctx, "")
	if err != nil || len(list) != 20 || ok.Load() != 20 || refused.Load() != 140 {
		t.Fatalf("stored %d (%v), %d set, %d refused; want 20, 20, 140", len(list), err, ok.Load(), refused.Load())
	}
	if log, _ := b.OverrideLog(ctx, 1000); len(log) != 20 {
		t.Fatalf("the log holds %d changes, want the 20 made", len(log))
	}
	// A refused exact override wrote nothing its key's decisions read.
	for g := range 16 {
		for i := 1; i < 10; i++ {
			if i%3 == 0 || stored[g*10+i].Load() {
				continue
			}
			if r, err := b.Take(ctx, fmt.Sprintf("r:%d-%d", g, i), base, 0); err != nil || r.Limit != 5 {
				t.Fatalf("r:%d-%d, refused, decides under %d (%v); want the rule's 5", g, i, r.Limit, err)
			}
		}
	}
	l.Rate = 60
	if err := b.SetOverride(ctx, override.Override{Key: list[0].Key, Limit: l}); err != nil {
		t.Fatalf("replacing an override at the bound: %v", err)
	}
	if ok, err := a.DeleteOverride(ctx, list[1].Key); err != nil || !ok {
		t.Fatalf("DeleteOverride = %v, %v", ok, err)
	}
	if err := b.SetOverride(ctx, override.Override{Key: "r:new", Limit: l}); err != nil {
		t.Fatalf("after a delete, under the bound again: %v", err)
	}
	if r, err := a.Take(ctx, "r:new", base, 0); err != nil || r.Limit != 60 {
		t.Fatalf("r:new decides under %d (%v), want 60", r.Limit, err)
	}
}

// TestOverrideKeySlot: on a real cluster, an exact key's override lives in
// the slot of the key's state and penalty box, whatever bytes the key
// holds (braces, a long key hashed), so the decision script reads it in
// the same atomic step; the index and the log share the slot {overrides}.
func TestOverrideKeySlot(t *testing.T) {
	c := redistest.Cluster(t)
	s := newTestStore(t, Config{Addrs: c.Addrs, Prefix: "weir", Overrides: true})
	ctx := context.Background()
	keyslot := func(k string) int64 {
		t.Helper()
		n, err := s.client.Do(ctx, s.client.B().ClusterKeyslot().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, key := range []string{"api:acme", "r:{x}", "r:}{", "", "~t", strings.Repeat("k", 300), "login:2001:db8::1"} {
		nm := s.names(key, "gcra")
		want := keyslot(nm.state)
		if got := keyslot(s.ovrKey(key)); got != want || keyslot(nm.block) != want {
			t.Errorf("%q: the override's slot %d, the state's %d", key, got, want)
		}
	}
	if keyslot(s.ovrIndex()) != keyslot(s.ovrLog()) {
		t.Errorf("the index %s and the log %s are in two slots", s.ovrIndex(), s.ovrLog())
	}
}

// TestOverrideRaceSettles: two instances set and delete the overrides of
// the same identities at once, on a standalone server and on a cluster
// (where an identity's override lives in its own slot, apart from the
// index): when they are done, every identity decides under what the index
// lists for it, on both.
func TestOverrideRaceSettles(t *testing.T) {
	t.Run("Standalone", func(t *testing.T) { overrideRaceSettles(t, []string{redistest.Standalone(t).Addr}) })
	t.Run("Cluster", func(t *testing.T) { overrideRaceSettles(t, redistest.Cluster(t).Addrs) })
}

func overrideRaceSettles(t *testing.T, addrs []string) {
	ctx := context.Background()
	cfg := Config{Addrs: addrs, Prefix: fmt.Sprintf("ov%d", prefixSeq.Add(1)), Overrides: true}
	stores := []*Store{newTestStore(t, cfg), newTestStore(t, cfg)}
	base := weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: time.Hour}
	keys := []string{"r:a", "r:b", "r:c", "r:d"}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[g%2]
			for i := range 30 {
				key := keys[(g+i)%len(keys)]
				if (g+i)%3 == 0 {
					if _, err := s.DeleteOverride(ctx, key); err != nil {
						t.Error(err)
					}
					continue
				}
				l := base
				l.Rate = int64(10 + g*30 + i)
				if err := s.SetOverride(ctx, override.Override{Key: key, Limit: l}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if stores[0].cluster {
		// A write that arrives after a later change's: dropped. (The race
		// above rarely orders them so; this does, every time.)
		a := stores[0]
		l := base
		l.Rate = 77
		if err := a.SetOverride(ctx, override.Override{Key: "r:late", Limit: l}); err != nil {
			t.Fatal(err)
		}
		seq, err := a.client.Do(ctx, a.client.B().Get().Key(a.ovrSeq()).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if err := a.putOverride(ctx, "r:late", seq-1, "", "0"); err != nil { // a delete, numbered before
			t.Fatal(err)
		}
		if r, err := stores[1].Take(ctx, "r:late", base, 0); err != nil || r.Limit != 77 {
			t.Fatalf("an earlier delete arriving late undid the override: %d, %v", r.Limit, err)
		}
		keys = append(keys, "r:late")
	}
	list, err := stores[0].Overrides(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]int64{}
	for _, o := range list {
		listed[o.Key] = o.Limit.Rate
	}
	for _, key := range keys {
		want, ok := listed[key]
		if !ok {
			want = base.Rate
		}
		for i, s := range stores {
			r, err := s.Take(ctx, key, base, 0)
			if err != nil || r.Limit != want {
				t.Errorf("instance %d: %s decides under %d (%v); the index says %d", i, key, r.Limit, err, want)
			}
		}
	}
}

// TestBatchReadsOverridesOnlyWhenIndexed: while no override is set, a
// coalesced decision reads no override key (one EXISTS of the index per
// call instead of a GET per decision); once one is, every decision reads
// its key's override again, and the override binds.
func TestBatchReadsOverridesOnlyWhenIndexed(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Overrides: true, Timeout: 10 * time.Second, Prefix: "ix"})
	ctx := context.Background()
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: 24 * time.Hour}
	takes := func(want bool) map[string]int {
		t.Helper()
		if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 10; i++ {
			if r, err := s.Take(ctx, "r:k"+strconv.Itoa(i), l, 1); err != nil || r.Allowed != want {
				t.Fatalf("take %d: %+v %v, want allowed %v", i, r, err, want)
			}
		}
		return commandCalls(t, srv)
	}
	// Sequential takes: each is a call of one decision. A fixed window's
	// take reads its state with SET NX GET: every GET is an override's.
	if calls := takes(true); calls["get"] != 0 || calls["exists"] != 10 {
		t.Errorf("without overrides: GET %d times (want 0), EXISTS %d (want 10, the index): %v", calls["get"], calls["exists"], calls)
	}
	if err := s.SetOverride(ctx, override.Override{Key: "r:k*", Limit: weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: 24 * time.Hour}}); err != nil {
		t.Fatal(err)
	}
	// The pattern binds in Go (the limit sent is the override's); the
	// index is not empty, so each decision reads its key's override too.
	if calls := takes(false); calls["get"] != 10 {
		t.Errorf("with an override indexed: GET %d times, want 10 (the overrides): %v", calls["get"], calls)
	}
	if err := s.SetOverride(ctx, override.Override{Key: "r:k3", Limit: weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: 24 * time.Hour}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteOverride(ctx, "r:k*"); err != nil {
		t.Fatal(err)
	}
	// The exact override of r:k3 (5/day, 1 taken) binds; the others are
	// back under the rule's limit (100/day, 2 taken).
	for i := 0; i < 4; i++ {
		if r, err := s.Take(ctx, "r:k3", l, 1); err != nil || !r.Allowed || r.Limit != 5 {
			t.Fatalf("take %d under the exact override: %+v %v", i, r, err)
		}
	}
	if r, err := s.Take(ctx, "r:k3", l, 1); err != nil || r.Allowed {
		t.Fatalf("the exact override's sixth: %+v %v", r, err)
	}
	if _, err := s.DeleteOverride(ctx, "r:k3"); err != nil {
		t.Fatal(err)
	}
	if calls := takes(true); calls["get"] != 0 {
		t.Errorf("after deleting every override: GET %d times, want 0: %v", calls["get"], calls)
	}
}
