package server

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestDefaults(t *testing.T) {
	s, err := New(WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.HTTPAddr() != ":8080" || s.GRPCAddr() != ":8081" || s.StoreDescription() != "memory" || s.AdminEnabled() {
		t.Fatalf("defaults: %s %s %s %v", s.HTTPAddr(), s.GRPCAddr(), s.StoreDescription(), s.AdminEnabled())
	}
	var names []string
	for _, r := range s.Policy().Rules() {
		names = append(names, r.Name)
	}
	if len(names) != 3 || names[0] != "demo-ip" || names[1] != "login" || names[2] != "api" {
		t.Fatalf("demo rules: %v", names)
	}
	s2, err := New(WithLogger(quietLogger()), WithGRPCAddr("off"), WithHTTPAddr("127.0.0.1:9999"))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.GRPCAddr() != "" || s2.HTTPAddr() != "127.0.0.1:9999" {
		t.Fatalf("overrides: %q %q", s2.GRPCAddr(), s2.HTTPAddr())
	}
}

func TestGRPCServesEnvoyAndHealth(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "rl.yaml"), []byte("domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644)
	s, err := New(WithConfig(mustParse(t, testConfig)), WithEnvoyConfigDir(dir), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, hl, gl) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	h, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	rl := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}}
	for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		resp, err := rl.ShouldRateLimit(cctx, req)
		if err != nil || resp.OverallCode != want {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
	}
	// The decisions reach the dashboard's counters under the rule's path.
	if got := s.stats.names(); len(got) != 1 || got[0] != "rl.user" {
		t.Fatalf("stats: %v", got)
	}
	// A changed directory is picked up by Reload.
	os.WriteFile(filepath.Join(dir, "rl.yaml"), []byte("domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	req.Descriptors[0].Entries[0].Value = "bob"
	for range 5 {
		if resp, err := rl.ShouldRateLimit(cctx, req); err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("after reload: %v %v", resp, err)
		}
	}
}
