package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/grpclimit"
	"github.com/weir-dev/weir/store/memstore"
)

// Two calls a minute per API key, on every method of a gRPC server.
func Example() {
	lim := weir.NewLimiter(memstore.New())
	ic := grpclimit.New(lim, weir.Limit{Algorithm: weir.FixedWindow, Rate: 2, Period: time.Minute},
		grpclimit.WithName("api"), grpclimit.KeyByMetadata("x-api-key"))

	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary()), grpc.ChainStreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	defer srv.Stop()

	cc, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "alice")
	for i := 0; i < 3; i++ {
		var trailer metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		st := status.Convert(err)
		fmt.Println(st.Code())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok && ri.RetryDelay.AsDuration() > 0 {
				fmt.Println("RetryInfo present; policy", trailer.Get("ratelimit-policy"))
			}
		}
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted
	// RetryInfo present; policy ["api";q=2;w=60]
}
