package redisstore

import (
	"fmt"
	"testing"

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
