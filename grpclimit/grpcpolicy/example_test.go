package grpcpolicy_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/grpclimit/grpcpolicy"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
)

// A weir.yaml rule on one gRPC method: two health checks a minute per
// tenant, matched by the full method name as a path.
func Example() {
	cfg, err := policy.Parse([]byte(`
rules:
  - name: health
    match: { path: /grpc.health.v1.Health/Check }
    identity: header:x-tenant
    limit: 2/m
`), "weir.yaml")
	if err != nil {
		panic(err)
	}
	p, err := policy.New(cfg, memstore.New())
	if err != nil {
		panic(err)
	}
	ic := grpcpolicy.New(func() *policy.Policy { return p })

	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Stop()

	cc, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant", "acme")
	for i := 0; i < 3; i++ {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err))
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted
}
