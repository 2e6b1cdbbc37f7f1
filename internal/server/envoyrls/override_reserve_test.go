package envoyrls

import (
	"context"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/weir-dev/weir"
)

// overrideCounted reads the count of an override's counter (descriptor d,
// which carries the override) without changing it.
func overrideCounted(t *testing.T, h *harness, domain string, d *rlcommon.RateLimitDescriptor) int64 {
	t.Helper()
	r, err := overrideRule(h.svc.Config().domains[domain], 0, d, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := r.limit
	l.Rate = countRate
	res := make([]weir.Result, 1)
	if err := h.st.Do(context.Background(), []weir.Request{{Key: overrideKey(domain, r, d.Entries), Limit: l}}, res); err != nil {
		t.Fatal(err)
	}
	return countRate - res[0].Remaining
}

// TestOverrideReserveSettle: a descriptor that carries its own limit
// (Envoy Gateway's limit.fromMetadata) reserves the reserve: of the
// configured descriptor its entries match, under its own counter, and
// settles as a configured one does. The reservation is keyed by the
// override's counter (descriptor and period), not by its numbers: a
// tenant whose limit changes between the request and the response
// settles all the same. A reused, forged, configured descriptor's or
// other period's id is a plain charge, never a refund.
func TestOverrideReserveSettle(t *testing.T) {
	cfg := parseReserve(t, reserveYAML)
	eachStore(t, cfg, nil, func(t *testing.T, h *harness) {
		h = h.serve(cfg, h.st, []Option{WithReservations(&mapReservations{})})
		tenant := func(name string, rpu uint32, unit typev3.RateLimitUnit, kv ...string) *rlcommon.RateLimitDescriptor {
			return withOverride(desc(append([]string{"tenant", name}, kv...)...), rpu, unit, 0)
		}
		hourly := func(rpu uint32, kv ...string) *rlcommon.RateLimitDescriptor {
			return tenant("acme", rpu, typev3.RateLimitUnit_HOUR, kv...)
		}
		reserve := func(d *rlcommon.RateLimitDescriptor) (*rlspb.RateLimitResponse, string) {
			t.Helper()
			r := h.call(request("llm", 0, withHits(d, 0)))
			return r, r.GetDynamicMetadata().GetFields()[ReservationKey].GetStringValue()
		}
		settle := func(d *rlcommon.RateLimitDescriptor, actual uint64) *rlspb.RateLimitResponse {
			t.Helper()
			return h.call(request("llm", 0, withHits(d, actual)))
		}
		want := func(what string, n int64) {
			t.Helper()
			if got := overrideCounted(t, h, "llm", hourly(500)); got != n {
				t.Fatalf("%s: counted %d, want %d", what, got, n)
			}
		}
		r, id1 := reserve(hourly(500))
		if r.OverallCode != ok || len(id1) != 32 || r.Statuses[0].LimitRemaining != 400 || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 500 {
			t.Fatalf("reserve under an override of 500/h: %v, id %q", r, id1)
		}
		want("after the reserve", 100)
		if r := settle(hourly(500, ReservationKey, id1), 150); r.Statuses[0].LimitRemaining != 350 {
			t.Fatalf("settled 150: %v", r)
		}
		want("settled 150 over 100", 150)
		// The limit changes between the request and the response path:
		// the reservation is the same counter's, so it settles.
		_, id2 := reserve(hourly(300))
		want("second reserve, under 300/h", 250)
		settle(hourly(700, ReservationKey, id2), 30)
		want("settled 30 under 100, under 700/h", 180)
		if n := h.svc.UnknownReservations(); n != 0 {
			t.Fatalf("%d unknown reservations after two good settlements", n)
		}
		// Reused and forged ids: plain charges.
		settle(hourly(500, ReservationKey, id2), 10)
		settle(hourly(500, ReservationKey, "0123456789abcdef0123456789abcdef"), 5)
		want("reused and forged ids", 195)
		// The configured descriptor's reservation does not settle the
		// override, nor the override's the configured descriptor's.
		_, idc := reserveCall(t, h.client, "acme")
		if got := counted(t, h.st, cfg, "acme"); got != 100 {
			t.Fatalf("the configured descriptor's reserve: %d counted, want 100 under its own key", got)
		}
		settle(hourly(500, ReservationKey, idc), 0)
		_, id3 := reserve(hourly(500))
		want("third reserve", 295)
		settleCall(t, h.client, "acme", id3, 0)
		if got := counted(t, h.st, cfg, "acme"); got != 100 {
			t.Fatalf("an override's id settled the configured descriptor: %d counted, want 100", got)
		}
		// Another period is another counter: its id does not settle this one.
		_, id4 := reserve(tenant("acme", 500, typev3.RateLimitUnit_MINUTE))
		settle(hourly(500, ReservationKey, id4), 0)
		want("another period's id: nothing refunded here", 295)
		if n := h.svc.UnknownReservations(); n != 5 {
			t.Fatalf("%d unknown reservations, want 5", n)
		}
		// The tenant's limit drops to 0 before the response: what the
		// stream used past its estimate still counts; nothing is refunded.
		_, id5 := reserve(hourly(500))
		settle(hourly(0, ReservationKey, id5), 130)
		settle(hourly(500, ReservationKey, id5), 1) // reused: a plain charge
		want("settled 130 of 100 under a limit of 0", 426)
		_, id6 := reserve(hourly(1000))
		settle(hourly(0, ReservationKey, id6), 30)
		want("settled 30 of 100 under a limit of 0: no refund", 526)
		if n := h.svc.UnknownReservations(); n != 6 {
			t.Fatalf("%d unknown reservations, want 6", n)
		}
		// A reserve that does not fit the override's limit is refused,
		// takes nothing and answers no id.
		if r, id := reserve(hourly(600)); r.OverallCode != over || id != "" {
			t.Fatalf("reserve of 100 with 74 left: %v, id %q", r, id)
		}
		want("refused reserve", 526)
		// An override below the reserve reserves all of it.
		if r, id := reserve(tenant("tiny", 40, typev3.RateLimitUnit_HOUR)); r.OverallCode != ok || id == "" || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("reserve under 40/h: %v, id %q", r, id)
		}
		// A descriptor the tree does not match reserves nothing: the
		// request path checks, as without --envoy-reserve.
		if r, id := reserve(withOverride(desc("team", "x"), 500, typev3.RateLimitUnit_HOUR, 0)); r.OverallCode != ok || id != "" {
			t.Fatalf("an override without reserve: %v, id %q", r, id)
		}
	})
}
