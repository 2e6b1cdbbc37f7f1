package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/weir-dev/weir/internal/server"
)

// TestEnvoyServeFlags: --envoy-merge-domains, --envoy-shadow-mode,
// --envoy-response-headers and --envoy-quota-mode (or their WEIR_*
// variables) reach the Envoy service weir serve runs.
func TestEnvoyServeFlags(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"1.yaml": "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
		"2.yaml": "domain: edge\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	noEnv := func(string) (string, bool) { return "", false }
	newServer := func(args []string, lookup func(string) (string, bool)) (*server.Server, error) {
		t.Helper()
		f, _, code := parseServeArgs(append(args, "--envoy-config", dir, "--http", "127.0.0.1:0", "--grpc", "off"), io.Discard, io.Discard, lookup)
		if f == nil {
			t.Fatalf("%v: exit %d", args, code)
		}
		return server.New(serverOptions(f, slog.New(slog.DiscardHandler), lookup)...)
	}
	if _, err := newServer(nil, noEnv); err == nil || !strings.Contains(err.Error(), `domain "edge" is already defined`) {
		t.Fatalf("a domain in two files without --envoy-merge-domains: err = %v", err)
	}
	req := func(keys ...string) *rls.RateLimitRequest {
		r := &rls.RateLimitRequest{Domain: "edge", HitsAddend: 2}
		for _, k := range keys {
			r.Descriptors = append(r.Descriptors, &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: "x"}}})
		}
		return r
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		overall rls.RateLimitResponse_Code
		headers int
	}{
		{"merge only", []string{"--envoy-merge-domains"}, nil, rls.RateLimitResponse_OVER_LIMIT, 0},
		{"shadow and headers", []string{"--envoy-merge-domains", "--envoy-shadow-mode", "--envoy-response-headers"}, nil, rls.RateLimitResponse_OK, 3},
		{"quota by environment", nil, map[string]string{"WEIR_ENVOY_MERGE_DOMAINS": "true", "WEIR_ENVOY_QUOTA_MODE": "true"}, rls.RateLimitResponse_OK, 0},
	} {
		lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		srv, err := newServer(tc.args, lookup)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// a is over (2 hits, limit 1); "none" matches nothing.
		resp, err := srv.Envoy().Check(context.Background(), req("a", "none"))
		srv.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if resp.OverallCode != tc.overall || resp.Statuses[0].Code != rls.RateLimitResponse_OVER_LIMIT || len(resp.ResponseHeadersToAdd) != tc.headers {
			t.Errorf("%s: overall %v, status %v, %d headers; want %v, OVER_LIMIT, %d", tc.name, resp.OverallCode, resp.Statuses[0].Code, len(resp.ResponseHeadersToAdd), tc.overall, tc.headers)
		}
	}
}
