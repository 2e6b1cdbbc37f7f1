package redisstore

import (
	"context"
	"fmt"
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
	srv := redistest.Standalone(t)
	clock := storetest.NewClock(storetest.Epoch)
	cfg := Config{Addrs: []string{srv.Addr}, Clock: clock.Now, Prefix: fmt.Sprintf("ov%d", prefixSeq.Add(1)), Overrides: true}
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
	if got := limitOn(b, "r:team-1"); got != 7 {
		t.Fatalf("after its refresh the other instance decided under %d, want 7", got)
	}
	if ok, err := a.DeleteOverride(ctx, "r:exact"); err != nil || !ok {
		t.Fatalf("DeleteOverride = %v, %v", ok, err)
	}
	if got := limitOn(b, "r:exact"); got != 2 {
		t.Fatalf("after the delete the other instance decided under %d, want 2", got)
	}
}
