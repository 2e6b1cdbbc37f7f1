package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/weir-dev/weir/internal/server"
)

// TestServeEnvoyDynamicMetadata: --envoy-dynamic-metadata (or
// WEIR_ENVOY_DYNAMIC_METADATA=true) makes Envoy responses carry dynamic
// metadata with the passing descriptors' metadata:; without it they carry
// none.
func TestServeEnvoyDynamicMetadata(t *testing.T) {
	dir := t.TempDir()
	yml := "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 5}\n    metadata: {tier: gold}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  string
		want bool
	}{
		{nil, "", false},
		{[]string{"--envoy-dynamic-metadata"}, "", true},
		{nil, "true", true},
	} {
		lookup := func(k string) (string, bool) {
			if k == "WEIR_ENVOY_DYNAMIC_METADATA" && tc.env != "" {
				return tc.env, true
			}
			return "", false
		}
		f, _, code := parseServeArgs(append(tc.args, "--envoy-config", dir, "--http", "127.0.0.1:0", "--grpc", "off"), io.Discard, io.Discard, lookup)
		if f == nil {
			t.Fatalf("%v: exit %d", tc.args, code)
		}
		srv, err := server.New(serverOptions(f, slog.New(slog.NewTextHandler(io.Discard, nil)), lookup)...)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Envoy().Check(context.Background(), &rls.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "client", Value: "c1"}}}}})
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		tier := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["tier"].GetStringValue()
		if got := tier == "gold"; got != tc.want || !tc.want && resp.DynamicMetadata != nil {
			t.Errorf("%v env %q: dynamic metadata %v, want it %v", tc.args, tc.env, resp.DynamicMetadata, tc.want)
		}
	}
}
