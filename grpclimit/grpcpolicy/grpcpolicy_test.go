package grpcpolicy_test

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/grpclimit/grpcpolicy"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
)

// serve starts a real gRPC server on a local port with the health service
// (unary Check, server-streaming Watch) behind ic, and returns a client.
func serve(t *testing.T, ic *grpcpolicy.Interceptor) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
	h := health.NewServer()
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func TestPolicyRulesMatchFullMethod(t *testing.T) {
	cfg, err := policy.Parse([]byte(`
rules:
  - name: health-check
    match: { path: /grpc.health.v1.Health/Check }
    identity: header:x-tenant
    limit: 2/h
    algorithm: fixed_window
deny:
  - { identity: header:x-tenant, values: [mallory] }
`), "grpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.New(cfg, stillStore())
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, grpcpolicy.New(func() *policy.Policy { return p }))
	call := func(tenant string) codes.Code {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant", tenant)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		if got := call("acme"); got != want {
			t.Fatalf("call %d: %v, want %v", i, got, want)
		}
	}
	if got := call("other"); got != codes.OK {
		t.Fatalf("another tenant: %v", got)
	}
	if got := call("mallory"); got != codes.PermissionDenied {
		t.Fatalf("deny-listed tenant: %v", got)
	}
	// Watch is not matched by the rule: unlimited.
	s, err := c.Watch(metadata.AppendToOutgoingContext(context.Background(), "x-tenant", "acme"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("unmatched method: %v", err)
	}
}

// stillStore is a memory store whose clock stands still a minute into an
// hour, so that no test's hour-long window can end while it runs.
func stillStore() *memstore.Store {
	at := time.Date(2030, 1, 1, 10, 1, 0, 0, time.UTC)
	return memstore.New(memstore.WithClock(func() time.Time { return at }))
}
