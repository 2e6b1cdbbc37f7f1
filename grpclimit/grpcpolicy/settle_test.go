package grpcpolicy_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/grpclimit/grpcpolicy"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/redisstore"
)

// backend is a gRPC server behind an interceptor whose handlers end every
// call with the code code holds, counting the calls that reach them.
type backend struct {
	client  healthpb.HealthClient
	code    atomic.Int32 // codes.Code
	reached atomic.Int64
}

func serveBackend(t *testing.T, ic *grpcpolicy.Interceptor) *backend {
	t.Helper()
	b := &backend{}
	end := func() error {
		b.reached.Add(1)
		if c := codes.Code(b.code.Load()); c != codes.OK {
			return status.Error(c, "from the handler")
		}
		return nil
	}
	unary := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
		if err := end(); err != nil {
			return nil, err
		}
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	stream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, _ grpc.StreamHandler) error {
		return end()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary(), unary), grpc.ChainStreamInterceptor(ic.Stream(), stream))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	b.client = healthpb.NewHealthClient(cc)
	return b
}

func (b *backend) call() codes.Code {
	_, err := b.client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	return status.Code(err)
}

// stream opens a Watch stream and returns the code it ends with.
func (b *backend) stream() codes.Code {
	s, err := b.client.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		return status.Code(err)
	}
	if _, err = s.Recv(); err == io.EOF {
		return codes.OK
	}
	return status.Code(err)
}

func policyOf(t *testing.T, doc string, store weir.Store) *grpcpolicy.Interceptor {
	t.Helper()
	cfg, err := policy.Parse([]byte(doc), t.Name()+".yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.New(cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	return grpcpolicy.New(func() *policy.Policy { return p })
}

// countOK's store timeout is long enough for a busy test machine: a
// decision that times out would be answered by on_error instead.
const countOK = `
store: {timeout: 10s}
rules:
  - name: ok-calls
    identity: ip
    limit: 3/h
    algorithm: token_bucket  # no window edge on Redis's real clock
    count: { status: [200] }
`

// A count rule is settled by the call's code: with count: {status: [200]},
// 3 of 10 successful calls pass.
func TestPolicyCountRuleCountsCalls(t *testing.T) {
	b := serveBackend(t, policyOf(t, countOK, stillStore()))
	got := map[codes.Code]int{}
	for range 10 {
		got[b.call()]++
	}
	if got[codes.OK] != 3 || got[codes.ResourceExhausted] != 7 || b.reached.Load() != 3 {
		t.Fatalf("codes %v, handler reached %d times; want 3 OK and 7 ResourceExhausted, 3 reached", got, b.reached.Load())
	}
}

// A count rule takes before the handler: of 200 concurrent calls exactly
// 3 reach it, on the memory store and on Redis.
func TestPolicyCountRuleExactUnderConcurrency(t *testing.T) {
	stores := map[string]func(t *testing.T) weir.Store{
		"memory": func(*testing.T) weir.Store { return stillStore() },
		"redis": func(t *testing.T) weir.Store {
			srv := redistest.Standalone(t)
			s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			b := serveBackend(t, policyOf(t, countOK, store(t)))
			var ok, exhausted atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					switch c := b.call(); c {
					case codes.OK:
						ok.Add(1)
					case codes.ResourceExhausted:
						exhausted.Add(1)
					default:
						t.Errorf("unexpected code %v", c)
					}
				}()
			}
			close(start)
			wg.Wait()
			if b.reached.Load() != 3 || ok.Load() != 3 || exhausted.Load() != 197 {
				t.Fatalf("handler reached %d times, %d OK, %d ResourceExhausted; want 3, 3, 197", b.reached.Load(), ok.Load(), exhausted.Load())
			}
		})
	}
}

// Calls ending with a code whose status the rule does not count get their
// take back; calls ending Unauthenticated (401) count, on unary calls and
// on streams alike.
func TestPolicyCountRuleRefundsUncountedCodes(t *testing.T) {
	b := serveBackend(t, policyOf(t, `
rules:
  - name: failed-logins
    identity: ip
    limit: 3/h
    algorithm: fixed_window
    count: { status: [401] }
`, stillStore()))
	for i, c := range []codes.Code{codes.OK, codes.PermissionDenied, codes.NotFound, codes.Internal, codes.Canceled} {
		b.code.Store(int32(c))
		for range 4 {
			if got := b.call(); got != c {
				t.Fatalf("uncounted code %d (%v): call ended %v", i, c, got)
			}
			if got := b.stream(); got != c {
				t.Fatalf("uncounted code %d (%v): stream ended %v", i, c, got)
			}
		}
	}
	b.code.Store(int32(codes.Unauthenticated))
	for i, call := range []func() codes.Code{b.call, b.stream, b.call} {
		if got := call(); got != codes.Unauthenticated {
			t.Fatalf("failure %d: %v", i+1, got)
		}
	}
	reached := b.reached.Load()
	if got, gotS := b.call(), b.stream(); got != codes.ResourceExhausted || gotS != codes.ResourceExhausted || b.reached.Load() != reached {
		t.Fatalf("after 3 failures: call %v, stream %v, handler reached %d more times; want ResourceExhausted before the handler", got, gotS, b.reached.Load()-reached)
	}
}

// A handler that panics ends its call as Internal, a 500, for count rules.
func TestPolicyCountRulePanicCountsAs500(t *testing.T) {
	ic := policyOf(t, `
rules:
  - name: errors
    identity: const:all
    limit: 1/h
    algorithm: fixed_window
    count: { status: [500] }
`, stillStore())
	call := func(h grpc.UnaryHandler) (err error, panicked bool) {
		defer func() {
			if recover() != nil {
				panicked = true
			}
		}()
		_, err = ic.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/pkg.S/M"}, h)
		return err, false
	}
	if _, panicked := call(func(context.Context, any) (any, error) { panic("handler bug") }); !panicked {
		t.Fatal("the interceptor swallowed the handler's panic")
	}
	if err, _ := call(func(context.Context, any) (any, error) { return nil, nil }); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("after a panic counted as 500: %v, want ResourceExhausted", err)
	}
}

// A cost: rule takes the value of its metadata key; a value that is no
// whole number is refused with InvalidArgument naming the rule and value.
func TestPolicyCostFromMetadata(t *testing.T) {
	b := serveBackend(t, policyOf(t, `
rules:
  - name: tokens
    identity: const:all
    limit: 10/h
    algorithm: fixed_window
    cost: header:x-cost
`, stillStore()))
	call := func(cost string) error {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-cost", cost)
		_, err := b.client.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	err := call("lots")
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), `"tokens"`) || !strings.Contains(st.Message(), `"lots"`) {
		t.Fatalf("bad cost: %v; want InvalidArgument naming the rule and the value", err)
	}
	for i, c := range []struct {
		cost string
		want codes.Code
	}{{"7", codes.OK}, {"4", codes.ResourceExhausted}, {"3", codes.OK}, {"1", codes.ResourceExhausted}} {
		if got := status.Code(call(c.cost)); got != c.want {
			t.Fatalf("call %d costing %s: %v, want %v", i+1, c.cost, got, c.want)
		}
	}
}
