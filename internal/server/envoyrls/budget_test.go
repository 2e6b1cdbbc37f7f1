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
)

// TestTokenBudgetUnderConcurrency plays Envoy Gateway / AI Gateway's token
// budget: per-tenant limits come as overrides (limit.fromMetadata), the
// same descriptor on both paths; each stream is checked with hits_addend
// 0 on the request path and charged its tokens (hits_addend N) when it
// is done. Many streams of many tenants run at once. Every token of an
// admitted stream is charged (the tenant's counter ends equal to the
// tokens its admitted streams used), and a tenant's admitted tokens pass
// its budget by no more than the documented bound:
//
//   - check: less than its streams in flight times the largest stream:
//     a check passes only while the counter is within the budget, so only
//     the streams admitted before the counter crossed it, and not yet
//     charged, can overrun it;
//   - reserve (--envoy-reserve, reserve: on the descriptor the overrides'
//     entries match): the request path takes the estimate and the
//     response path settles the reservation, so the overrun is at most
//     the sum, over the tenant's admitted streams, of what each used past
//     its estimate.
func TestTokenBudgetUnderConcurrency(t *testing.T) {
	t.Run("check", func(t *testing.T) {
		eachStore(t, loadTestdata(t, "tokens.yaml"), nil, func(t *testing.T, h *harness) {
			tokenBudget(t, h, false)
		})
	})
	t.Run("reserve", func(t *testing.T) {
		cfg := parseReserve(t, "domain: tokens\ndescriptors:\n  - key: tenant\n    debit: true\n    reserve: 20\n    rate_limit: {unit: hour, requests_per_unit: 100000}\n")
		eachStore(t, cfg, nil, func(t *testing.T, h *harness) {
			tokenBudget(t, h.serve(cfg, h.st, []Option{WithReservations(&mapReservations{})}), true)
		})
	})
}

// tokenBudget runs the token budget flow of TestTokenBudgetUnderConcurrency
// against h, reserving when reserve is set.
func tokenBudget(t *testing.T, h *harness, reserve bool) {
	const (
		tenants   = 16
		workers   = 64 // streams in flight at once, over all tenants
		maxTokens = 40 // the most tokens one stream uses
		estimate  = 20 // reserve: of the descriptor the overrides match
	)
	budget := func(tn int) uint32 { return uint32(500 + 150*tn) }
	d := func(tn int, hits uint64, kv ...string) *rlcommon.RateLimitDescriptor {
		return withOverride(withHits(desc(append([]string{"tenant", fmt.Sprintf("t%d", tn)}, kv...)...), hits), budget(tn), typev3.RateLimitUnit_HOUR, 0)
	}
	var mu sync.Mutex
	used := make([]int64, tenants)    // tokens of admitted streams
	excess := make([]int64, tenants)  // sum of max(0, tokens − estimate)
	refused := make([]int64, tenants) // refused checks
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
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
				var kv []string
				if reserve {
					id := r.GetDynamicMetadata().GetFields()[ReservationKey].GetStringValue()
					if id == "" {
						errs <- fmt.Errorf("tenant %d: admitted without a reservation: %v", tn, r)
						return
					}
					kv = []string{ReservationKey, id}
				}
				n := 1 + rng.IntN(maxTokens)
				mu.Lock()
				used[tn] += int64(n)
				excess[tn] += int64(max(0, n-estimate))
				mu.Unlock()
				if _, err := h.client.ShouldRateLimit(context.Background(), request("tokens", 0, d(tn, uint64(n), kv...))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := h.svc.UnknownReservations(); n != 0 {
		t.Fatalf("%d reservations unknown", n)
	}
	var worst, worstBound, admitted, budgets int64
	for tn := range tenants {
		counted := overrideCounted(t, h, "tokens", d(tn, 0))
		if counted != used[tn] {
			t.Errorf("tenant %d: %d tokens counted, %d used by admitted streams", tn, counted, used[tn])
		}
		over := used[tn] - int64(budget(tn))
		if over <= 0 && !reserve {
			t.Errorf("tenant %d: used %d of %d: the budget was never reached", tn, used[tn], budget(tn))
		}
		bound := int64(workers * maxTokens)
		if reserve {
			bound = excess[tn]
		}
		if over > bound || !reserve && over == bound {
			t.Errorf("tenant %d: used %d of %d: over by %d, past the bound %d", tn, used[tn], budget(tn), over, bound)
		}
		if over > worst {
			worst, worstBound = over, bound
		}
		admitted += used[tn]
		budgets += int64(budget(tn))
	}
	t.Logf("reserve=%v: %d tokens admitted against budgets of %d over %d tenants; largest overrun %d tokens (that tenant's bound %d)",
		reserve, admitted, budgets, tenants, worst, worstBound)
}
