package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

const userYAML = `
domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// withOverride gives d a limit override.
func withOverride(d *rlcommon.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit, mult uint32) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	if mult > 0 {
		d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return d
}

// remaining makes one call of a single descriptor and returns its code and
// limit_remaining.
func (h *harness) remaining(d *rlcommon.RateLimitDescriptor) (rlspb.RateLimitResponse_Code, uint32) {
	h.t.Helper()
	r := h.call(request("rl", 0, d))
	return r.Statuses[0].Code, r.Statuses[0].LimitRemaining
}

// TestOverrideKeyedApart: a limit override counts under its own key, apart
// from the configured descriptor's counter and from overrides of another
// limit, so that an override can neither reset nor share a configured
// count. (Before, an override was a fixed window under the configured
// descriptor's key: an override of another unit restarted it at zero, one
// of the same unit shared it.)
func TestOverrideKeyedApart(t *testing.T) {
	h := start(t, mustParse(t, userYAML))
	plain := func() *rlcommon.RateLimitDescriptor { return desc("user", "alice") }
	hourly := func() *rlcommon.RateLimitDescriptor {
		return withOverride(desc("user", "alice"), 10, typev3.RateLimitUnit_HOUR, 0)
	}
	perMinute5 := func() *rlcommon.RateLimitDescriptor {
		return withOverride(desc("user", "alice"), 5, typev3.RateLimitUnit_MINUTE, 0)
	}
	perMinute5x2 := func() *rlcommon.RateLimitDescriptor {
		return withOverride(desc("user", "alice"), 5, typev3.RateLimitUnit_MINUTE, 2)
	}
	steps := []struct {
		name string
		d    *rlcommon.RateLimitDescriptor
		code rlspb.RateLimitResponse_Code
		left uint32
	}{
		{"configured 1", plain(), ok, 2},
		{"configured 2", plain(), ok, 1},
		{"hourly override", hourly(), ok, 9},
		{"configured 3, not reset by the hourly override", plain(), ok, 0},
		{"per-minute override of another rate", perMinute5(), ok, 4},
		{"configured 4, not reset by the per-minute override", plain(), over, 0},
		{"hourly override keeps its own count", hourly(), ok, 8},
		{"per-minute override keeps its own count", perMinute5(), ok, 3},
		{"override with a multiplier is another limit", perMinute5x2(), ok, 4},
		{"configured still over", plain(), over, 0},
	}
	for _, s := range steps {
		code, left := h.remaining(s.d)
		if code != s.code || left != s.left {
			t.Fatalf("%s: %v with %d left, want %v with %d", s.name, code, left, s.code, s.left)
		}
	}
	// The keys differ for every limit, and match for the same one.
	e := desc("user", "alice").Entries
	k := func(d *rlcommon.RateLimitDescriptor) string {
		r, err := overrideRule(h.svc.Config().domains["rl"], 0, d, 0)
		if err != nil {
			t.Fatal(err)
		}
		return overrideKey("rl", r, e)
	}
	keys := map[string]bool{stateKey("rl", e, nil): true, k(hourly()): true, k(perMinute5()): true, k(perMinute5x2()): true,
		k(withOverride(desc("user", "alice"), 10, typev3.RateLimitUnit_MINUTE, 6)): true}
	if len(keys) != 5 {
		t.Fatalf("keys collide: %v", keys)
	}
	if a, b := k(hourly()), k(hourly()); a != b {
		t.Fatalf("one override has two keys: %q and %q", a, b)
	}
}

// TestOverrideRuleBounded: whatever entries an override carries, its
// Observation.Rule is one fixed label per configured domain, never built
// from the request: metrics labels and dashboard rows stay bounded.
func TestOverrideRuleBounded(t *testing.T) {
	var mu sync.Mutex
	rules := map[string]int{}
	h := start(t, integrationConfig(t), WithObserver(func(_ context.Context, d Observation) {
		mu.Lock()
		rules[d.Rule]++
		mu.Unlock()
	}))
	for i := range 200 {
		d := withOverride(desc(fmt.Sprintf("k%d", i), "v", fmt.Sprintf("sub%d", i%7), "w"), 5, typev3.RateLimitUnit_MINUTE, 0)
		h.call(request("another", 0, d))
		d = withOverride(desc("key2", fmt.Sprint(i)), 5, typev3.RateLimitUnit_MINUTE, 0)
		h.call(request("basic", 0, d))
	}
	// An unknown domain has no rule at all.
	h.call(request("nope", 0, withOverride(desc("x", "y"), 5, typev3.RateLimitUnit_MINUTE, 0)))
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"another.(override)": 200, "basic.(override)": 200, "": 1}
	if len(rules) != len(want) {
		t.Fatalf("%d distinct rules: %v", len(rules), rules)
	}
	for r, n := range want {
		if rules[r] != n {
			t.Fatalf("rule %q seen %d times, want %d (all: %v)", r, rules[r], n, rules)
		}
	}
}

// TestCallBounds: a call with too many descriptors, entries, or too long
// an entry is refused with InvalidArgument naming the count and the cap,
// before anything is counted, on gRPC and through CheckJSON.
func TestCallBounds(t *testing.T) {
	var decided sync.Mutex
	var n int
	var h *harness
	h = start(t, mustParse(t, userYAML), WithDecider(func(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
		decided.Lock()
		n += len(reqs)
		decided.Unlock()
		return StoreDecider(h.store)(ctx, reqs, res)
	}))
	many := func(k int) []*rlcommon.RateLimitDescriptor {
		ds := make([]*rlcommon.RateLimitDescriptor, k)
		for i := range ds {
			ds[i] = desc("user", fmt.Sprint("u", i))
		}
		return ds
	}
	entries := func(k int) *rlcommon.RateLimitDescriptor {
		d := &rlcommon.RateLimitDescriptor{}
		for i := range k {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: "v"})
		}
		return d
	}
	for _, c := range []struct {
		name string
		req  *rlspb.RateLimitRequest
		msg  string
	}{
		{"descriptors", request("rl", 0, many(MaxDescriptors+1)...),
			fmt.Sprintf("envoyrls: bad request: %d descriptors, over the limit of %d per call", MaxDescriptors+1, MaxDescriptors)},
		{"entries", request("rl", 0, desc("user", "a"), entries(MaxEntries+1)),
			fmt.Sprintf("envoyrls: bad request: descriptors[1] has %d entries, over the limit of %d", MaxEntries+1, MaxEntries)},
		{"key length", request("rl", 0, desc(strings.Repeat("k", MaxEntryKeyLen+1), "a")),
			fmt.Sprintf("envoyrls: bad request: descriptors[0].entries[0].key is %d bytes, over the limit of %d", MaxEntryKeyLen+1, MaxEntryKeyLen)},
		{"value length", request("rl", 0, desc("user", "a", "x", strings.Repeat("v", MaxEntryValueLen+1))),
			fmt.Sprintf("envoyrls: bad request: descriptors[0].entries[1].value is %d bytes, over the limit of %d", MaxEntryValueLen+1, MaxEntryValueLen)},
		{"domain length", request(strings.Repeat("d", MaxDomainLen+1), 0, desc("user", "a")),
			fmt.Sprintf("envoyrls: bad request: the domain is %d bytes, over the limit of %d", MaxDomainLen+1, MaxDomainLen)},
		{"unknown domain too", request("nope", 0, many(MaxDescriptors+1)...),
			fmt.Sprintf("envoyrls: bad request: %d descriptors, over the limit of %d per call", MaxDescriptors+1, MaxDescriptors)},
	} {
		_, err := h.client.ShouldRateLimit(context.Background(), c.req)
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != c.msg {
			t.Errorf("%s: err = %v, want InvalidArgument %q", c.name, err, c.msg)
		}
	}
	if n != 0 {
		t.Fatalf("%d decisions reached the decider from refused calls", n)
	}
	// At the caps, a call is served.
	atCap := many(MaxDescriptors)
	atCap[0] = desc("user", strings.Repeat("v", MaxEntryValueLen))
	atCap[0].Entries[0].Key = strings.Repeat("k", MaxEntryKeyLen)
	atCap[1] = entries(MaxEntries)
	if r := h.call(request("rl", 0, atCap...)); len(r.Statuses) != MaxDescriptors || r.OverallCode != ok {
		t.Fatalf("a call at the caps: %v", r)
	}
	// The same through the JSON API: 400 and nothing counted.
	var b strings.Builder
	b.WriteString(`{"domain":"rl","descriptors":[`)
	for i := range MaxDescriptors + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"entries":[{"key":"user","value":"j%d"}]}`, i)
	}
	b.WriteString(`]}`)
	before := n
	out, code, err := h.svc.CheckJSON(context.Background(), []byte(b.String()))
	if code != http.StatusBadRequest || !errors.Is(err, ErrBadRequest) || !strings.Contains(string(out), "65 descriptors, over the limit of 64") {
		t.Fatalf("JSON with too many descriptors: %d %s %v", code, out, err)
	}
	if n != before {
		t.Fatal("a refused JSON call reached the decider")
	}
}

// TestInvalidOverrideIsBadRequest: an override weir cannot enforce (a
// period over ten years) is the caller's fault, found before the store is
// asked: InvalidArgument on gRPC, 400 through CheckJSON, and no failed
// decision reported. (Before, it reached the store and came back as a
// store failure: Unavailable, 503.)
func TestInvalidOverrideIsBadRequest(t *testing.T) {
	var mu sync.Mutex
	var seen []Observation
	h := start(t, integrationConfig(t), WithObserver(func(_ context.Context, d Observation) {
		mu.Lock()
		seen = append(seen, d)
		mu.Unlock()
	}))
	for _, c := range []struct {
		name string
		d    *rlcommon.RateLimitDescriptor
		msg  string
	}{
		{"eleven years", withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_YEAR, 11), "at most 10 years"},
		{"eleven years denying", withOverride(desc("key2", "x"), 0, typev3.RateLimitUnit_YEAR, 11), "at most 10 years"},
		{"4000 days", withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_DAY, 4000), "at most 10 years"},
		{"overflowing", withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_YEAR, 1<<32-1), "too long"},
	} {
		_, err := h.client.ShouldRateLimit(context.Background(), request("another", 0, c.d))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), c.msg) ||
			!strings.Contains(status.Convert(err).Message(), "descriptors[0].limit") {
			t.Errorf("%s: %v, want InvalidArgument naming descriptors[0].limit and %q", c.name, err, c.msg)
		}
	}
	body := `{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}],"limit":{"requests_per_unit":5,"unit":"YEAR","unit_multiplier":11}}]}`
	out, code, err := h.svc.CheckJSON(context.Background(), []byte(body))
	if code != http.StatusBadRequest || !errors.Is(err, ErrBadRequest) || !errors.Is(err, weir.ErrInvalidLimit) {
		t.Fatalf("JSON: %d %s %v", code, out, err)
	}
	mu.Lock()
	n := len(seen)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("%d decisions of refused calls were observed", n)
	}
	// Ten years is accepted.
	if r := h.call(request("another", 0, withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_YEAR, 10))); r.OverallCode != ok {
		t.Fatalf("a ten-year override: %v", r)
	}
}

// TestInvalidInputFromDecider: a Decider that answers invalid limit or
// cost (the store's own validation) is the request's fault, not the
// store's: InvalidArgument and 400, not Unavailable and 503.
func TestInvalidInputFromDecider(t *testing.T) {
	for _, sentinel := range []error{weir.ErrInvalidLimit, weir.ErrInvalidCost} {
		dec := WithDecider(func(context.Context, []weir.Request, []weir.Result) error {
			return fmt.Errorf("memstore: %w: the test says so", sentinel)
		})
		clk := newClock()
		svc := New(integrationConfig(t), memstore.New(memstore.WithClock(clk.Now)), WithClock(clk.Now), dec)
		_, err := svc.ShouldRateLimit(context.Background(), request("another", 0, desc("key2", "x")))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: gRPC %v, want InvalidArgument", sentinel, err)
		}
		_, code, err := svc.CheckJSON(context.Background(), []byte(`{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}]}]}`))
		if code != http.StatusBadRequest || !errors.Is(err, sentinel) {
			t.Errorf("%v: JSON %d %v, want 400", sentinel, code, err)
		}
	}
	// A decision never sent is still the store's side: Unavailable.
	svc := New(integrationConfig(t), memstore.New(), WithDecider(func(context.Context, []weir.Request, []weir.Result) error {
		return fmt.Errorf("redisstore: %w", weir.ErrNotSent)
	}))
	if _, err := svc.ShouldRateLimit(context.Background(), request("another", 0, desc("key2", "x"))); status.Code(err) != codes.Unavailable {
		t.Errorf("not sent: %v, want Unavailable", err)
	}
}

// TestOverridePeriodBounded: with WithMaxOverridePeriod, an override whose
// unit times unit_multiplier is longer is refused before the store is
// asked (InvalidArgument, 400 as JSON), naming the unit, the period and
// the bound; one of exactly the bound counts.
func TestOverridePeriodBounded(t *testing.T) {
	h := start(t, integrationConfig(t), WithMaxOverridePeriod(24*time.Hour))
	for _, c := range []struct {
		name string
		d    *rlcommon.RateLimitDescriptor
		msg  string
	}{
		{"a year", withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_YEAR, 0), "unit YEAR with unit_multiplier 1 is a period of 365d, longer than the 1d"},
		{"a denying year", withOverride(desc("key2", "x"), 0, typev3.RateLimitUnit_YEAR, 0), "a period of 365d"},
		{"25 hours", withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_HOUR, 25), "unit HOUR with unit_multiplier 25 is a period of 25h0m0s"},
		{"a week", withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_DAY, 7), "unit DAY with unit_multiplier 7 is a period of 7d"},
	} {
		_, err := h.client.ShouldRateLimit(context.Background(), request("another", 0, c.d))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), c.msg) ||
			!strings.Contains(status.Convert(err).Message(), "descriptors[0].limit") {
			t.Errorf("%s: %v, want InvalidArgument naming descriptors[0].limit and %q", c.name, err, c.msg)
		}
	}
	body := `{"domain":"another","descriptors":[{"entries":[{"key":"key2","value":"j"}],"limit":{"requests_per_unit":5,"unit":"MONTH"}}]}`
	out, code, err := h.svc.CheckJSON(context.Background(), []byte(body))
	if code != http.StatusBadRequest || !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "30d") {
		t.Fatalf("JSON, a month: %d %s %v, want 400 naming 30d", code, out, err)
	}
	if n := h.store.Len(); n != 0 {
		t.Fatalf("refused overrides left %d keys in the store", n)
	}
	for _, d := range []*rlcommon.RateLimitDescriptor{
		withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_DAY, 0),
		withOverride(desc("key2", "x"), 5, typev3.RateLimitUnit_HOUR, 24),
	} {
		if r := h.call(request("another", 0, d)); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 4 {
			t.Fatalf("a one-day override %v: %v", d.Limit, r)
		}
	}
}
