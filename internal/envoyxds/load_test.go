package envoyxds_test

import (
	"reflect"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weir-dev/weir/internal/envoyxds"
	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// TestLoadIsTheFileFormat: a RateLimitConfig loads into the same rules as
// the YAML file it stands for, field for field (nesting, values, names,
// replaces, unlimited, shadow mode, detailed metric, quota mode, metadata).
func TestLoadIsTheFileFormat(t *testing.T) {
	rl := func(n uint32, u rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{RequestsPerUnit: n, Unit: u}
	}
	meta, err := structpb.NewStruct(map[string]any{"team": "ml", "tier": map[string]any{"level": 2.0, "paid": true}})
	if err != nil {
		t.Fatal(err)
	}
	rc := &rlsconfv3.RateLimitConfig{Name: "r", Domain: "edge", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "client", RateLimit: rl(10, rlsconfv3.RateLimitUnit_SECOND), DetailedMetric: true},
		{Key: "path", Value: "/login", ShadowMode: true, RateLimit: &rlsconfv3.RateLimitPolicy{Name: "login", RequestsPerUnit: 5, Unit: rlsconfv3.RateLimitUnit_MINUTE}},
		{Key: "plan", Value: "free", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{RequestsPerUnit: 100, Unit: rlsconfv3.RateLimitUnit_DAY,
				Replaces: []*rlsconfv3.RateLimitReplace{{Name: "login"}}}},
			{Key: "admin", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
		}},
		// As Envoy AI Gateway's QuotaPolicy translates: a backend, its
		// model, a per-tenant bucket and a default bucket, all quotas.
		{Key: "backend_name", Value: "default/openai", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "model_name_override", Value: "gpt-4o", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "rule-0-x-tenant-id-match-0", RateLimit: rl(5, rlsconfv3.RateLimitUnit_HOUR), QuotaMode: true, ShadowMode: true},
				{Key: "rule-1-match--1", Value: "rule-1-match--1", RateLimit: rl(3, rlsconfv3.RateLimitUnit_HOUR), QuotaMode: true,
					Metadata: meta},
			}},
		}},
	}}
	a, err := anypb.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := envoyxds.Load(&discoveryv3.DiscoveryResponse{TypeUrl: envoyxds.TypeURL, Resources: []*anypb.Any{a}})
	if err != nil {
		t.Fatal(err)
	}
	want, err := envoyrls.Parse([]byte(`domain: edge
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 10}
    detailed_metric: true
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {name: login, unit: minute, requests_per_unit: 5}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit:
          unit: day
          requests_per_unit: 100
          replaces: [{name: login}]
      - key: admin
        rate_limit: {unlimited: true}
  - key: backend_name
    value: default/openai
    descriptors:
      - key: model_name_override
        value: gpt-4o
        descriptors:
          - key: rule-0-x-tenant-id-match-0
            rate_limit: {unit: hour, requests_per_unit: 5}
            quota_mode: true
            shadow_mode: true
          - key: rule-1-match--1
            value: rule-1-match--1
            rate_limit: {unit: hour, requests_per_unit: 3}
            quota_mode: true
            metadata: {team: ml, tier: {level: 2, paid: true}}
`), "f")
	if err != nil {
		t.Fatal(err)
	}
	strip := func(rs []envoyrls.Rule) []envoyrls.Rule {
		for i := range rs {
			rs[i].File, rs[i].Line = "", 0
		}
		return rs
	}
	g, w := strip(got.Rules()), strip(want.Rules())
	if len(g) != 6 || !reflect.DeepEqual(g, w) {
		t.Fatalf("from xDS:\n%+v\nfrom the file:\n%+v", g, w)
	}

	// A resource of another type is refused, named.
	other, _ := anypb.New(&discoveryv3.DiscoveryRequest{})
	if _, err := envoyxds.Load(&discoveryv3.DiscoveryResponse{TypeUrl: envoyxds.TypeURL, Resources: []*anypb.Any{other}}); err == nil {
		t.Fatal("a DiscoveryRequest loaded as a RateLimitConfig")
	}
}
