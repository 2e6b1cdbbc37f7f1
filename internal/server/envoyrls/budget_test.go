package envoyrls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/weir-dev/weir"
)

// TestTokenBudgetUnderConcurrency plays Envoy Gateway / AI Gateway's token
// budget: per-tenant limits come as overrides (limit.fromMetadata); each
// stream is checked with hits_addend 0 on the request path and charged
// its tokens (hits_addend N) when it is done. Many streams of many
// tenants run at once. Every token of an admitted stream is charged (the
// tenant's counter ends equal to the tokens its admitted streams used),
// and a tenant's admitted tokens exceed its budget by less than its
// streams in flight times the largest stream: a check passes only while
// the counter is within the budget, so only the streams admitted before
// the counter crossed it, and not yet charged, can overrun it.
func TestTokenBudgetUnderConcurrency(t *testing.T) {
	const (
		tenants   = 6
		workers   = 24 // streams in flight at once, over all tenants
		maxTokens = 40 // the most tokens one stream uses
	)
	budget := func(tn int) uint32 { return uint32(500 + 150*tn) }
	d := func(tn int, hits uint64) *rlcommon.RateLimitDescriptor {
		return withOverride(withHits(desc("tenant", fmt.Sprintf("t%d", tn)), hits), budget(tn), typev3.RateLimitUnit_HOUR, 0)
	}
	eachStore(t, loadTestdata(t, "tokens.yaml"), nil, func(t *testing.T, h *harness) {
		var mu sync.Mutex
		used := make([]int64, tenants)    // tokens of admitted streams
		refused := make([]int64, tenants) // refused checks
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				for i := 0; ; i++ {
					tn := (w + i) % tenants // every tenant has streams from several workers
					mu.Lock()
					done := true
					for _, r := range refused {
						done = done && r >= 3
					}
					mu.Unlock()
					if done {
						return
					}
					r, err := h.client.ShouldRateLimit(context.Background(), request("tokens", 0, d(tn, 0)))
					if err != nil {
						errs <- err
						return
					}
					if r.OverallCode != rlspb.RateLimitResponse_OK {
						mu.Lock()
						refused[tn]++
						mu.Unlock()
						continue
					}
					n := 1 + rng.IntN(maxTokens)
					mu.Lock()
					used[tn] += int64(n)
					mu.Unlock()
					if _, err := h.client.ShouldRateLimit(context.Background(), request("tokens", 0, d(tn, uint64(n)))); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		dom := h.svc.Config().domains["tokens"]
		worst := int64(0)
		for tn := range tenants {
			r, err := overrideRule(dom, 0, d(tn, 0), 0)
			if err != nil {
				t.Fatal(err)
			}
			// Read the counter without changing it: a peek under the
			// largest rate reports countRate minus the count.
			l := r.limit
			l.Rate = countRate
			res := make([]weir.Result, 1)
			if err := h.st.Do(context.Background(), []weir.Request{{Key: overrideKey("tokens", r, d(tn, 0).Entries), Limit: l}}, res); err != nil {
				t.Fatal(err)
			}
			counted := countRate - res[0].Remaining
			if counted != used[tn] {
				t.Errorf("tenant %d: %d tokens counted, %d used by admitted streams", tn, counted, used[tn])
			}
			over := used[tn] - int64(budget(tn))
			if over <= 0 {
				t.Errorf("tenant %d: used %d of %d: the budget was never reached", tn, used[tn], budget(tn))
			}
			if over >= workers*maxTokens {
				t.Errorf("tenant %d: used %d of %d: over by %d, not less than %d streams × %d tokens", tn, used[tn], budget(tn), over, workers, maxTokens)
			}
			worst = max(worst, over)
		}
		t.Logf("largest overrun: %d tokens (bound %d)", worst, workers*maxTokens)
	})
}
