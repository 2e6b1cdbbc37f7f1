package envoyrls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/weir-dev/weir"
)

// reserveYAML: a daily token budget per tenant, charged on the response
// path (debit), reserving 100 tokens on the request path.
const reserveYAML = `
domain: llm
descriptors:
  - key: tenant
    debit: true
    reserve: 100
    rate_limit: { unit: day, requests_per_unit: 1000 }
`

// parseReserve parses yaml as weir serve --envoy-reserve does.
func parseReserve(t *testing.T, yaml string) *Config {
	t.Helper()
	c := &Config{domains: map[string]*domainConfig{}, reserveOK: true}
	if err := c.add([]byte(yaml), "test.yaml"); err != nil {
		t.Fatal(err)
	}
	return c
}

// mapReservations keeps reservations as weir serve's in-memory store
// does: each taken at most once.
type mapReservations struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (r *mapReservations) Put(_ context.Context, id string, rec []byte, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string][]byte{}
	}
	r.m[id] = rec
	return nil
}

func (r *mapReservations) Take(_ context.Context, id string) ([]byte, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.m[id]
	delete(r.m, id)
	return rec, ok, nil
}

// counted reads the count of a fixed window key without changing it: a
// peek under the largest rate reports countRate minus the count.
func counted(t *testing.T, st weir.Store, cfg *Config, tenant string) int64 {
	t.Helper()
	r, _, _ := cfg.domains["llm"].match(desc("tenant", tenant).Entries)
	l := r.limit
	l.Rate = countRate
	res := make([]weir.Result, 1)
	if err := st.Do(context.Background(), []weir.Request{{Key: stateKey("llm", desc("tenant", tenant).Entries, nil), Limit: l}}, res); err != nil {
		t.Fatal(err)
	}
	return countRate - res[0].Remaining
}

// reserveCall is the request path: hits_addend 0. It returns the
// response and the reservation's id from its dynamic metadata.
func reserveCall(t *testing.T, c rlspb.RateLimitServiceClient, tenant string) (*rlspb.RateLimitResponse, string) {
	t.Helper()
	r, err := c.ShouldRateLimit(context.Background(), request("llm", 0, withHits(desc("tenant", tenant), 0)))
	if err != nil {
		t.Fatal(err)
	}
	return r, r.GetDynamicMetadata().GetFields()[ReservationKey].GetStringValue()
}

// settleCall is the response path: the reservation's id as an entry,
// and the actual cost as hits_addend.
func settleCall(t *testing.T, c rlspb.RateLimitServiceClient, tenant, id string, actual uint64) *rlspb.RateLimitResponse {
	t.Helper()
	r, err := c.ShouldRateLimit(context.Background(), request("llm", 0, withHits(desc("tenant", tenant, ReservationKey, id), actual)))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReserveSettle: the request path takes the reserve and answers an
// id; the response path charges what the actual cost passes it by, or
// refunds what it falls short by. An id used twice, forged, or of another
// tenant is a plain charge, never a refund, and is counted.
func TestReserveSettle(t *testing.T) {
	cfg := parseReserve(t, reserveYAML)
	eachStore(t, cfg, nil, func(t *testing.T, h *harness) {
		resv := &mapReservations{}
		h = h.serve(cfg, h.st, []Option{WithReservations(resv)})
		want := func(what string, n int64) {
			t.Helper()
			if got := counted(t, h.st, cfg, "a"); got != n {
				t.Fatalf("%s: counted %d, want %d", what, got, n)
			}
		}
		r, id1 := reserveCall(t, h.client, "a")
		if r.OverallCode != rlspb.RateLimitResponse_OK || len(id1) != 32 {
			t.Fatalf("reserve: %v, id %q", r, id1)
		}
		want("after the reserve", 100)
		settleCall(t, h.client, "a", id1, 150)
		want("settled 150 over 100", 150)
		_, id2 := reserveCall(t, h.client, "a")
		want("second reserve", 250)
		settleCall(t, h.client, "a", id2, 30)
		want("settled 30 under 100", 180)
		if n := h.svc.UnknownReservations(); n != 0 {
			t.Fatalf("%d unknown reservations after two good settlements", n)
		}
		// Reused: a plain charge of 10, not a refund of 90.
		settleCall(t, h.client, "a", id2, 10)
		want("reused id", 190)
		// Forged, and empty: plain charges.
		settleCall(t, h.client, "a", "0123456789abcdef0123456789abcdef", 5)
		settleCall(t, h.client, "a", "", 0)
		want("forged id", 195)
		// Another tenant's reservation: a plain charge on b, and a's
		// reservation is gone, so a's estimate stays charged.
		_, id3 := reserveCall(t, h.client, "a")
		want("third reserve", 295)
		settleCall(t, h.client, "b", id3, 0)
		if got := counted(t, h.st, cfg, "b"); got != 0 {
			t.Fatalf("b charged %d for 0 tokens", got)
		}
		settleCall(t, h.client, "a", id3, 0)
		want("a's id spent by b: a's settlement of 0 refunds nothing", 295)
		if n := h.svc.UnknownReservations(); n != 5 {
			t.Fatalf("%d unknown reservations, want 5", n)
		}
		// Refused when the reserve does not fit: no id, nothing taken.
		settleCall(t, h.client, "a", "x", 650) // 945 counted
		r, id := reserveCall(t, h.client, "a")
		if r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || id != "" {
			t.Fatalf("reserve of 100 with 55 left: %v, id %q", r, id)
		}
		want("refused reserve", 945)
		if len(resv.m) != 0 {
			t.Fatalf("%d reservations left open", len(resv.m))
		}
	})
}

// TestReserveIgnoredWithoutOption: without WithReservations, reserve: is
// not honoured: the request path peeks, and no id is answered.
func TestReserveIgnoredWithoutOption(t *testing.T) {
	cfg := parseReserve(t, reserveYAML)
	h := start(t, cfg)
	r, id := reserveCall(t, h.client, "a")
	if r.OverallCode != rlspb.RateLimitResponse_OK || id != "" || counted(t, h.st, cfg, "a") != 0 {
		t.Fatalf("reserve without the option: %v, id %q", r, id)
	}
}

func TestReserveConfigErrors(t *testing.T) {
	if _, err := Parse([]byte(reserveYAML), "test.yaml"); err == nil ||
		!strings.Contains(err.Error(), "test.yaml:6: reserve is off") || !strings.Contains(err.Error(), "--envoy-reserve") {
		t.Errorf("reserve: without --envoy-reserve: %v", err)
	}
	for _, c := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: k\n    reserve: 5\n    rate_limit: { unit: day, requests_per_unit: 50 }\n", "test.yaml:4: reserve needs debit: true"},
		{"domain: d\ndescriptors:\n  - key: k\n    debit: true\n    reserve: 0\n    rate_limit: { unit: day, requests_per_unit: 50 }\n", "test.yaml:5: reserve"},
		{"domain: d\ndescriptors:\n  - key: k\n    debit: true\n    reserve: 51\n    rate_limit: { unit: day, requests_per_unit: 50 }\n", "test.yaml:5: reserve 51 is more than"},
		{"domain: d\ndescriptors:\n  - key: k\n    reserve: 5\n", "test.yaml:4: reserve needs a rate_limit"},
	} {
		c2 := &Config{domains: map[string]*domainConfig{}, reserveOK: true}
		err := c2.add([]byte(c.yaml), "test.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
}

// TestReserveUnderConcurrency: many tenants, many streams in flight, each
// reserving 20 tokens and using 1 to 40. Every token used is counted,
// and a tenant's admitted tokens pass its budget by at most the sum, over
// its admitted streams, of what each used past its estimate.
func TestReserveUnderConcurrency(t *testing.T) {
	const (
		tenants   = 6
		workers   = 24
		estimate  = 20
		maxTokens = 40
	)
	yaml := fmt.Sprintf("domain: llm\ndescriptors:\n  - key: tenant\n    debit: true\n    reserve: %d\n    rate_limit: { unit: day, requests_per_unit: 600 }\n", estimate)
	cfg := parseReserve(t, yaml)
	eachStore(t, cfg, nil, func(t *testing.T, h *harness) {
		h = h.serve(cfg, h.st, []Option{WithReservations(&mapReservations{})})
		var mu sync.Mutex
		used := make([]int64, tenants)   // tokens of admitted streams
		excess := make([]int64, tenants) // sum of max(0, actual − estimate)
		refused := make([]int64, tenants)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 11))
				for i := 0; ; i++ {
					tn := (w + i) % tenants
					mu.Lock()
					done := true
					for _, r := range refused {
						done = done && r >= 3
					}
					mu.Unlock()
					if done {
						return
					}
					tenant := fmt.Sprintf("t%d", tn)
					r, err := h.client.ShouldRateLimit(context.Background(), request("llm", 0, withHits(desc("tenant", tenant), 0)))
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
					id := r.GetDynamicMetadata().GetFields()[ReservationKey].GetStringValue()
					n := int64(1 + rng.IntN(maxTokens))
					mu.Lock()
					used[tn] += n
					excess[tn] += max(0, n-estimate)
					mu.Unlock()
					if _, err := h.client.ShouldRateLimit(context.Background(), request("llm", 0, withHits(desc("tenant", tenant, ReservationKey, id), uint64(n)))); err != nil {
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
		for tn := range tenants {
			got := counted(t, h.st, cfg, fmt.Sprintf("t%d", tn))
			if got != used[tn] {
				t.Errorf("tenant %d: %d tokens counted, %d used by admitted streams", tn, got, used[tn])
			}
			over := used[tn] - 600
			if over > excess[tn] {
				t.Errorf("tenant %d: used %d of 600: over by %d, more than the %d its streams used past their estimates", tn, used[tn], over, excess[tn])
			}
			t.Logf("tenant %d: used %d of 600, over by %d, bound %d", tn, used[tn], over, excess[tn])
		}
	})
}

// TestStripReservations: the entry is removed from a copy; the request
// Envoy sent is unchanged; two entries in one descriptor are refused.
func TestStripReservations(t *testing.T) {
	req := request("llm", 0, desc("tenant", "a", ReservationKey, "id1"), desc("model", "m"))
	out, ids, err := stripReservations(req)
	if err != nil || len(ids) != 2 || ids[0] != "id1" || ids[1] != "" {
		t.Fatalf("ids %q, %v", ids, err)
	}
	if len(out.Descriptors[0].Entries) != 1 || len(req.Descriptors[0].Entries) != 2 || out.Descriptors[1] != req.Descriptors[1] {
		t.Fatalf("stripped %v from %v", out, req)
	}
	if _, _, err := stripReservations(request("llm", 0, desc(ReservationKey, "a", ReservationKey, "b"))); err == nil || !strings.Contains(err.Error(), "descriptors[0] has two weir_reservation entries") {
		t.Fatalf("two entries: %v", err)
	}
}

// TestReserveRefundedWhenCallRefused: a call refused by another
// descriptor never runs its stream, so its reserve is given back and no
// id answered.
func TestReserveRefundedWhenCallRefused(t *testing.T) {
	cfg := parseReserve(t, reserveYAML+"  - key: model\n    rate_limit: { unit: day, requests_per_unit: 1 }\n")
	h := start(t, cfg, WithReservations(&mapReservations{}))
	call := func() (*rlspb.RateLimitResponse, string) {
		r := h.call(request("llm", 0, withHits(desc("tenant", "a"), 0), desc("model", "m")))
		return r, r.GetDynamicMetadata().GetFields()[ReservationKey].GetStringValue()
	}
	if r, id := call(); r.OverallCode != rlspb.RateLimitResponse_OK || id == "" || counted(t, h.st, cfg, "a") != 100 {
		t.Fatalf("first call: %v, id %q", r, id)
	}
	if r, id := call(); r.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || id != "" {
		t.Fatalf("call refused by model: %v, id %q", r, id)
	}
	if got := counted(t, h.st, cfg, "a"); got != 100 {
		t.Fatalf("the refused call's reserve stayed charged: %d counted, want 100", got)
	}
}
