package envoyrls

import (
	"os"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// loadTestdata loads one of this package's own configuration files.
func loadTestdata(t *testing.T, name string) *Config {
	t.Helper()
	cfg, err := LoadFiles("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestWildcardAnywhere: a '*' anywhere in a value matches any run of
// bytes, empty included; exact values come first, then wildcards in file
// order, then the key alone; share_threshold shares one counter among all
// the values a middle wildcard matches.
func TestWildcardAnywhere(t *testing.T) {
	cfg := loadTestdata(t, "wildcards.yaml")
	type call struct {
		key, value string
		limit      uint32 // 0: no rule applies
		remaining  uint32
	}
	cases := []struct {
		name  string
		calls []call
	}{
		{"middle", []call{{"mid", "barb", 5, 4}, {"mid", "barxyzb", 5, 4}, {"mid", "barab", 5, 4}, {"mid", "bar", 0, 0}, {"mid", "barbx", 0, 0}, {"mid", "xbarb", 0, 0}}},
		{"several", []call{{"multi", "foobarbaz", 6, 5}, {"multi", "foo1bar2baz", 6, 5}, {"multi", "foobarbarbaz", 6, 5}, {"multi", "foobazbar", 0, 0}, {"multi", "foobarbaz1", 0, 0}, {"multi", "fooba", 0, 0}}},
		{"no overlap of first and last", []call{{"overlap", "aba", 0, 0}, {"overlap", "abba", 7, 6}, {"overlap", "ab-ba", 7, 6}}},
		{"precedence", []call{{"p", "a-exact-z", 1, 0}, {"p", "a-other-z", 2, 1}, {"p", "az", 2, 1}, {"p", "a-y", 3, 2}, {"p", "b", 4, 3}}},
		{"shared", []call{{"tenant", "org-a-prod", 2, 1}, {"tenant", "org-b-prod", 2, 0}, {"tenant", "org-c-dev", 0, 0}}},
	}
	eachStore(t, cfg, nil, func(t *testing.T, h *harness) {
		for _, c := range cases {
			for _, k := range c.calls {
				want := resp(ok, noLimit())
				if k.limit > 0 {
					want = resp(ok, st(ok, k.limit, min_, k.remaining, 43*time.Second))
				}
				h.t = t
				h.expect(request("wild", 0, desc(k.key, k.value)), want)
			}
		}
		// The shared counter is spent for every value the pattern matches.
		h.expect(request("wild", 0, desc("tenant", "org-zzz-prod")), resp(over, st(over, 2, min_, 0, 43*time.Second)))
		// Nested levels with middle wildcards.
		h.expect(request("wild", 0, desc("route", "/v1/acme/chat", "model", "gpt-4o-mini")), resp(ok, st(ok, 8, min_, 7, 43*time.Second)))
		h.expect(request("wild", 0, desc("route", "/v1/acme/chat", "model", "gpt-4o")), resp(ok, noLimit()))
		h.expect(request("wild", 0, desc("route", "/v2/acme/chat", "model", "gpt-4o-mini")), resp(ok, noLimit()))
	})
}

// TestWildcardMatch checks the matcher itself on the edge cases.
func TestWildcardMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"k_a*", "k_a", true}, {"k_a*", "k_abc", true}, {"k_a*", "k_b", false},
		{"k_*", "k_", true}, {"k_a*b", "k_ab", true}, {"k_a*b", "k_axxb", true}, {"k_a*b", "k_axxbc", false},
		{"k_a*b*c", "k_abc", true}, {"k_a*b*c", "k_acb", false}, {"k_a*b*c", "k_abbcbc", true},
		{"k_ab*ba", "k_aba", false}, {"k_a**b", "k_ab", true}, {"k_a?b", "k_axb", false}, {"k_a?b", "k_a?b", true},
		{"k_*x*", "k_x", true}, {"k_*x*", "k_yyy", false},
	} {
		if got := wildcardMatch(splitStar(c.pattern), c.s); got != c.want {
			t.Errorf("%q matches %q: %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}

func TestTestdataLoads(t *testing.T) {
	ents, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, err := LoadFiles("testdata/" + e.Name()); err != nil {
			t.Errorf("%s: %v", e.Name(), err)
		}
	}
}

// TestDynamicMetadata: with WithDynamicMetadata, a response carries the
// domain, the descriptors and the merged metadata: of the rules whose
// descriptors passed, in envoyproxy/ratelimit's shape; without it, none.
func TestDynamicMetadata(t *testing.T) {
	cfg := loadTestdata(t, "metadata.yaml")
	mustStruct := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	entries := func(kv ...string) map[string]any {
		var es []any
		for i := 0; i+1 < len(kv); i += 2 {
			es = append(es, kv[i]+"="+kv[i+1])
		}
		return map[string]any{"entries": es}
	}
	eachStore(t, cfg, []Option{WithDynamicMetadata(true)}, func(t *testing.T, h *harness) {
		h.t = t
		// b passes once: both merge, a's scalars first, mappings merged.
		got := h.call(request("meta", 0, desc("svc", "a"), desc("svc", "b"), desc("svc", "free")))
		want := mustStruct(map[string]any{
			"domain":      "meta",
			"descriptors": []any{entries("svc", "a"), entries("svc", "b"), entries("svc", "free")},
			"metadata": map[string]any{
				"quota": map[string]any{"name": "a", "tier": 1, "region": "eu"},
				"owner": "team-a", "tags": []any{"x", "y", 3}, "enabled": true,
			},
		})
		if !proto.Equal(got.DynamicMetadata, want) {
			t.Fatalf("first call: got %v\nwant %v", got.DynamicMetadata, want)
		}
		// b is over the limit now: only a's metadata; hits_addend shows.
		got = h.call(request("meta", 2, desc("svc", "b"), withHits(desc("svc", "a"), 1)))
		dh := entries("svc", "a")
		dh["hitsAddend"] = 1
		want = mustStruct(map[string]any{
			"domain":      "meta",
			"hitsAddend":  2,
			"descriptors": []any{entries("svc", "b"), dh},
			"metadata":    map[string]any{"quota": map[string]any{"name": "a", "tier": 1}, "owner": "team-a", "tags": []any{"x", "y", 3}, "enabled": true},
		})
		if got.OverallCode != over || !proto.Equal(got.DynamicMetadata, want) {
			t.Fatalf("second call: %v, got %v\nwant %v", got.OverallCode, got.DynamicMetadata, want)
		}
		// detailed_metric, and value_to_metric that changes the stats key,
		// lose the metadata, as upstream; value_to_metric with an empty
		// value keeps it.
		for _, c := range []struct {
			d    []string
			keep bool
		}{{[]string{"detailed", "x"}, false}, {[]string{"v2m", "x"}, false}, {[]string{"v2m", ""}, true}} {
			got = h.call(request("meta", 0, desc(c.d...)))
			_, has := got.DynamicMetadata.GetFields()["metadata"]
			if has != c.keep {
				t.Fatalf("%v: metadata %v, want %v: %v", c.d, has, c.keep, got.DynamicMetadata)
			}
		}
	})
	// Off by default.
	h := start(t, cfg)
	if got := h.call(request("meta", 0, desc("svc", "a"))); got.DynamicMetadata != nil {
		t.Fatalf("dynamic metadata without the option: %v", got.DynamicMetadata)
	}
}

// step is one call of a single descriptor and the code and
// limit_remaining upstream answers.
type step struct {
	name string
	d    func() *rlcommon.RateLimitDescriptor
	code rlspb.RateLimitResponse_Code
	left uint32
}

func (h *harness) steps(domain string, steps []step) {
	h.t.Helper()
	for _, s := range steps {
		r := h.call(request(domain, 0, s.d()))
		if r.Statuses[0].Code != s.code || r.Statuses[0].LimitRemaining != s.left {
			h.t.Fatalf("%s: %v with %d left, want %v with %d", s.name, r.Statuses[0].Code, r.Statuses[0].LimitRemaining, s.code, s.left)
		}
	}
}

// TestCheckThenCharge: hits_addend 0 (the request-path check) passes
// while the window's counter is at most the limit, a spent budget
// included; a descriptor's own hits_addend (the response-path charge)
// always counts, past the limit if need be, so that the next check is
// refused until the next window. This is envoyproxy/ratelimit's token
// quota flow: with 2 a minute, three requests pass and the fourth not.
func TestCheckThenCharge(t *testing.T) {
	check := func() *rlcommon.RateLimitDescriptor { return withHits(desc("model", "small"), 0) }
	charge := func(n uint64) func() *rlcommon.RateLimitDescriptor {
		return func() *rlcommon.RateLimitDescriptor { return withHits(desc("model", "small"), n) }
	}
	eachStore(t, loadTestdata(t, "tokens.yaml"), nil, func(t *testing.T, h *harness) {
		h.t = t
		h.steps("tokens", []step{
			{"request 1", check, ok, 2}, {"charge 1", charge(1), ok, 1},
			{"request 2", check, ok, 1}, {"charge 2", charge(1), ok, 0},
			{"request 3, budget spent but not overrun", check, ok, 0}, {"charge 3, over", charge(1), over, 0},
			{"request 4, overrun", check, over, 0},
			{"a charge while over still counts", charge(5), over, 0},
		})
		h.clk.Add(time.Minute)
		h.steps("tokens", []step{{"next window", check, ok, 2}, {"a charge larger than the limit", charge(7), over, 0}, {"after it", check, over, 0}})
	})
}

// TestOverrideCountsByDescriptor: a limit override (Envoy Gateway's
// limit.fromMetadata) counts per descriptor and period: a tenant whose
// limit changes mid-window keeps its count, response-path charges count
// past the limit, and the configured rule of the same descriptor keeps a
// counter of its own.
func TestOverrideCountsByDescriptor(t *testing.T) {
	tenant := func(rpu uint32, hits uint64) func() *rlcommon.RateLimitDescriptor {
		return func() *rlcommon.RateLimitDescriptor {
			return withOverride(withHits(desc("tenant", "t1"), hits), rpu, typev3.RateLimitUnit_MINUTE, 0)
		}
	}
	plain := func() *rlcommon.RateLimitDescriptor { return desc("tenant", "t1") }
	eachStore(t, loadTestdata(t, "tokens.yaml"), nil, func(t *testing.T, h *harness) {
		h.t = t
		h.steps("tokens", []step{
			{"check at 10", tenant(10, 0), ok, 10},
			{"charge 4 at 10", tenant(4, 4), ok, 0}, // the charge's own override: 4 of 4
			{"limit raised to 20: the count stays", tenant(20, 0), ok, 16},
			{"configured rule: its own counter", plain, ok, 2},
			{"charge 20: counted past the limit", tenant(20, 20), over, 0},
			{"the next check is refused", tenant(20, 0), over, 0},
			{"even under a higher limit until the count fits it", tenant(23, 0), over, 0},
			{"a limit the count fits", tenant(24, 0), ok, 0},
			{"configured rule untouched", plain, ok, 1},
		})
		h.clk.Add(time.Minute)
		h.steps("tokens", []step{{"next window", tenant(20, 0), ok, 20}})
	})
}

// TestQuotaModeAcrossDescriptors: the call is over only when every
// quota_mode descriptor of the call is, whatever their entries (upstream
// forms no groups by backend_name or model_name_override).
func TestQuotaModeAcrossDescriptors(t *testing.T) {
	user := func(u string) *rlcommon.RateLimitDescriptor {
		return desc("backend_name", "b", "model_name_override", "m", "user", u)
	}
	eachStore(t, loadTestdata(t, "tokens.yaml"), nil, func(t *testing.T, h *harness) {
		h.t = t
		h.expect(request("tokens", 0, user("u1")), resp(ok, st(ok, 1, min_, 0, 43*time.Second)))
		// u1 over, u2 within: one of two quota descriptors passes: OK.
		h.expect(request("tokens", 0, user("u1"), user("u2")), resp(ok, st(over, 1, min_, 0, 43*time.Second), st(ok, 1, min_, 0, 43*time.Second)))
		h.expect(request("tokens", 0, user("u1"), user("u2")), resp(over, st(over, 1, min_, 0, 43*time.Second), st(over, 1, min_, 0, 43*time.Second)))
	})
}
