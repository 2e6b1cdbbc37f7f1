package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/grpclimit"
	"github.com/weir-dev/weir/store/memstore"
)

// serve starts a real gRPC server on a local port with the health service
// (unary Check, server-streaming Watch) behind ic, and returns a client.
func serve(t *testing.T, ic *grpclimit.Interceptor) healthpb.HealthClient {
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

func TestUnaryExactUnderConcurrency(t *testing.T) {
	lim := weir.NewLimiter(stillStore())
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 100, Period: time.Hour}
	c := serve(t, grpclimit.New(lim, l))
	var ok, exhausted atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.ResourceExhausted:
					exhausted.Add(1)
				default:
					t.Errorf("unexpected error %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 100 || exhausted.Load() != 220 {
		t.Fatalf("admitted %d, exhausted %d; want 100 and 220", ok.Load(), exhausted.Load())
	}
}

func TestRejectionCarriesRetryInfoAndTrailers(t *testing.T) {
	lim := weir.NewLimiter(stillStore())
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	c := serve(t, grpclimit.New(lim, l, grpclimit.WithName("api")))
	var hdr metadata.MD
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&hdr)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"api";q=1;w=3600` {
		t.Fatalf("admitted call's ratelimit-policy header = %q", got)
	}
	var tr metadata.MD
	_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("second call: %v, want ResourceExhausted", err)
	}
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if ri == nil {
		t.Fatalf("no RetryInfo detail in %v", st.Details())
	}
	if d := ri.RetryDelay.AsDuration(); d <= 0 || d > time.Hour {
		t.Fatalf("RetryInfo delay %v outside (0, 1h]", d)
	}
	if got := tr.Get("retry-after"); len(got) != 1 || got[0] == "" {
		t.Fatalf("retry-after trailer = %q", got)
	}
	if got := tr.Get("ratelimit"); len(got) != 1 || got[0][:len(`"api";r=0;t=`)] != `"api";r=0;t=` {
		t.Fatalf("ratelimit trailer = %q", got)
	}
}

// A concurrency lease is held while the stream is open and given back when
// it ends.
func TestStreamLeaseReleasedWhenStreamEnds(t *testing.T) {
	lim := weir.NewLimiter(stillStore())
	l := weir.Limit{Algorithm: weir.Concurrency, Rate: 1, Period: time.Hour}
	c := serve(t, grpclimit.New(lim, l))

	ctx1, cancel1 := context.WithCancel(context.Background())
	s1, err := c.Watch(ctx1, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s1.Recv(); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	s2, err := c.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream while the first is open: %v, want ResourceExhausted", err)
	}
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("unary call while the stream holds the slot: %v", err)
	}
	cancel1()
	// The server's handler returns after the cancellation reaches it; poll.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("after the stream ended: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The unary call released its lease when it returned.
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("unary lease not released: %v", err)
	}
}

func TestKeyByPeerHonoursOnlyTrustedProxies(t *testing.T) {
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	call := func(c healthpb.HealthClient, xff string) codes.Code {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-forwarded-for", xff)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	// Untrusted: the forwarded address is ignored, every call is 127.0.0.1.
	c := serve(t, grpclimit.New(weir.NewLimiter(stillStore()), l))
	if a, b := call(c, "198.51.100.1"), call(c, "198.51.100.2"); a != codes.OK || b != codes.ResourceExhausted {
		t.Fatalf("untrusted peer: %v, %v; want OK, ResourceExhausted", a, b)
	}
	// Trusted: each forwarded client has its own budget.
	c = serve(t, grpclimit.New(weir.NewLimiter(stillStore()), l, grpclimit.KeyByPeer(netip.MustParsePrefix("127.0.0.0/8"))))
	if a, b, again := call(c, "198.51.100.1"), call(c, "198.51.100.2"), call(c, "198.51.100.1"); a != codes.OK || b != codes.OK || again != codes.ResourceExhausted {
		t.Fatalf("trusted peer: %v, %v, %v; want OK, OK, ResourceExhausted", a, b, again)
	}
}

func TestKeyByMetadata(t *testing.T) {
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	c := serve(t, grpclimit.New(weir.NewLimiter(stillStore()), l, grpclimit.KeyByMetadata("X-API-Key")))
	call := func(key string) codes.Code {
		ctx := context.Background()
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
		}
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	if got := call(""); got != codes.InvalidArgument {
		t.Fatalf("no key: %v, want InvalidArgument", got)
	}
	if a, b, a2 := call("alice"), call("bob"), call("alice"); a != codes.OK || b != codes.OK || a2 != codes.ResourceExhausted {
		t.Fatalf("alice, bob, alice: %v %v %v", a, b, a2)
	}
}

// Behind Envoy, which appends the peer to x-forwarded-for and passes a
// client's own x-real-ip through, the client cannot choose its key with
// x-real-ip, nor with entries it puts left of the proxy's.
func TestKeyByPeerIgnoresClientRealIP(t *testing.T) {
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Hour}
	trusted := netip.MustParsePrefix("127.0.0.0/8")
	call := func(c healthpb.HealthClient, kv ...string) codes.Code {
		_, err := c.Check(metadata.AppendToOutgoingContext(context.Background(), kv...), &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	c := serve(t, grpclimit.New(weir.NewLimiter(stillStore()), l, grpclimit.KeyByPeer(trusted)))
	for i := range 6 {
		want := codes.ResourceExhausted
		if i == 0 {
			want = codes.OK
		}
		if got := call(c, "x-real-ip", fmt.Sprintf("203.0.113.%d", i+1), "x-forwarded-for", fmt.Sprintf("192.0.2.%d, 198.51.100.7", i+1)); got != want {
			t.Fatalf("call %d with its own x-real-ip: %v, want %v", i+1, got, want)
		}
	}
	if got := call(c, "x-forwarded-for", "198.51.100.8"); got != codes.OK {
		t.Fatalf("another client: %v", got)
	}
	// Named explicitly, x-real-ip is read, for proxies that overwrite it.
	c = serve(t, grpclimit.New(weir.NewLimiter(stillStore()), l, grpclimit.KeyByPeer(trusted), grpclimit.WithClientIPHeader("x-real-ip")))
	if a, b := call(c, "x-real-ip", "203.0.113.1"), call(c, "x-real-ip", "203.0.113.2"); a != codes.OK || b != codes.OK {
		t.Fatalf("x-real-ip named: %v, %v; want OK, OK", a, b)
	}
}

// stillStore is a memory store whose clock stands still a minute into an
// hour, so that no test's hour-long window can end while it runs.
func stillStore() *memstore.Store {
	at := time.Date(2030, 1, 1, 10, 1, 0, 0, time.UTC)
	return memstore.New(memstore.WithClock(func() time.Time { return at }))
}
