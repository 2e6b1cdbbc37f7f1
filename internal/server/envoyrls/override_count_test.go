package envoyrls

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// TestOverrideChangeKeepsCount: a tenant's limit sent by Envoy (the
// descriptor's limit, Envoy Gateway's limit.fromMetadata) changes its
// limit, never its count, as a tenant override of weir's own does: the
// counter is keyed by the tenant and the override's period, not its
// requests_per_unit, and the store decides the same state under the new
// number. Raising 10 to 20 mid-window admits 10 more, not 20; lowering
// it refuses at once; each step is exact under concurrent calls, on
// memstore and on Redis. Another period is another window, and so
// another counter, as weir's own overrides may not change the period.
func TestOverrideChangeKeepsCount(t *testing.T) {
	tenant := func(name string, rpu uint32, unit typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
		return withOverride(desc("user", name), rpu, unit, 0)
	}
	eachStore(t, mustParse(t, userYAML), nil, func(t *testing.T, h *harness) {
		// burst makes n concurrent calls and returns how many were OK.
		burst := func(n int, d func() *rlcommon.RateLimitDescriptor) int {
			var okN atomic.Int64
			var wg sync.WaitGroup
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := h.client.ShouldRateLimit(context.Background(), request("rl", 0, d()))
					if err != nil {
						t.Error(err)
						return
					}
					if r.OverallCode == rlspb.RateLimitResponse_OK {
						okN.Add(1)
					}
				}()
			}
			wg.Wait()
			return int(okN.Load())
		}
		hourly := func(rpu uint32) func() *rlcommon.RateLimitDescriptor {
			return func() *rlcommon.RateLimitDescriptor { return tenant("acme", rpu, typev3.RateLimitUnit_HOUR) }
		}
		for _, s := range []struct {
			name  string
			rpu   uint32
			calls int
			want  int
		}{
			{"10 per hour", 10, 30, 10},
			{"raised to 20: 10 more", 20, 30, 10},
			{"lowered to 5: none", 5, 10, 0},
			{"back to 20: none, the count is 20", 20, 10, 0},
			{"raised to 25: 5 more", 25, 30, 5},
		} {
			if got := burst(s.calls, hourly(s.rpu)); got != s.want {
				t.Fatalf("%s: %d of %d concurrent calls admitted, want %d", s.name, got, s.calls, s.want)
			}
		}
		// The remaining count follows the limit in force.
		r := h.call(request("rl", 0, tenant("acme", 40, typev3.RateLimitUnit_HOUR)))
		if st := r.Statuses[0]; st.Code != ok || st.LimitRemaining != 14 || st.CurrentLimit.GetRequestsPerUnit() != 40 {
			t.Fatalf("raised to 40 after 25: %v, want OK with 14 left of 40", st)
		}
		// Another tenant, and another period of the same tenant, count apart.
		if got := burst(20, func() *rlcommon.RateLimitDescriptor { return tenant("globex", 10, typev3.RateLimitUnit_HOUR) }); got != 10 {
			t.Fatalf("another tenant: %d of 20 admitted, want its own 10", got)
		}
		if got := burst(20, func() *rlcommon.RateLimitDescriptor { return tenant("acme", 7, typev3.RateLimitUnit_MINUTE) }); got != 7 {
			t.Fatalf("another period: %d of 20 admitted, want 7 in its own window", got)
		}
	})
}
