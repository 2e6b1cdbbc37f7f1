package envoyrls

import (
	"context"
	"sync"
	"testing"

	"github.com/weir-dev/weir"
)

// TestFallbackDeciderReported: the requests a FallbackDecider answered by
// its fallback reach the Observer with their fallback's name; those the
// store decided, with none.
func TestFallbackDeciderReported(t *testing.T) {
	var mu sync.Mutex
	seen := map[int]Observation{} // by descriptor
	var h *harness
	h = start(t, integrationConfig(t),
		WithFallbackDecider(func(ctx context.Context, reqs []weir.Request, res []weir.Result, fallback []string) error {
			for i, r := range reqs {
				if i == 0 {
					res[i] = weir.Result{Limit: r.Limit.Rate} // refused by a deny fallback
					fallback[i] = "deny"
					continue
				}
				var err error
				if res[i], err = h.store.Take(ctx, r.Key, r.Limit, r.N); err != nil {
					return err
				}
			}
			return nil
		}),
		WithObserver(func(_ context.Context, d Observation) {
			mu.Lock()
			seen[d.Descriptor] = d
			mu.Unlock()
		}))
	resp, err := h.client.ShouldRateLimit(context.Background(), request("another", 0, desc("key2", "d"), desc("key2", "e")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Statuses[0].Code != over || resp.Statuses[1].Code != ok {
		t.Fatalf("statuses %v", resp.Statuses)
	}
	mu.Lock()
	defer mu.Unlock()
	if d := seen[0]; d.Fallback != "deny" || d.Outcome != Limited {
		t.Fatalf("the fallback's decision: %+v", d)
	}
	if d := seen[1]; d.Fallback != "" || d.Outcome != Allowed {
		t.Fatalf("the store's decision: %+v", d)
	}
}
