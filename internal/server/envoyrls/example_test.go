package envoyrls

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// examples/envoy/envoy.yaml must be a valid Envoy bootstrap (Envoy is not
// needed: its protos and validation rules are), with a rate limit filter
// for the example's domain, talking gRPC to weir's port.
func TestExampleEnvoyYAML(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml is not an Envoy bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails Envoy's validation: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var rl ratelimitv3.RateLimit
	if err := hcm.HttpFilters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadDir(filepath.Join("..", "..", "..", "examples", "envoy", "config"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.domains[rl.Domain] == nil {
		t.Fatalf("the filter's domain %q is not in the example config (%v)", rl.Domain, cfg.Domains())
	}
	cluster := rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	for _, c := range b.StaticResources.Clusters {
		if c.Name == cluster {
			port := c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address.GetSocketAddress().GetPortValue()
			if port != 8081 {
				t.Fatalf("cluster %s points at port %d, not weir's gRPC port 8081", cluster, port)
			}
			return
		}
	}
	t.Fatalf("no cluster %q", cluster)
}
