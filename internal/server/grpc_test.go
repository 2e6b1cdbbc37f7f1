package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir"
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

// serveEnvoy starts a server, with opts, whose Envoy config directory holds
// rlYAML, on free loopback ports; it stops it when t ends and returns the
// server, the directory and the gRPC address.
func serveEnvoy(t *testing.T, rlYAML string, opts ...Option) (*Server, string, string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rl.yaml"), []byte(rlYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	opts = append([]Option{WithConfig(mustParse(t, testConfig)), WithEnvoyConfigDir(dir), WithLogger(quietLogger())}, opts...)
	s, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	gl, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, hl, gl) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s, dir, gl.Addr().String()
}

func TestGRPCServesEnvoyAndHealth(t *testing.T) {
	s, dir, addr := serveEnvoy(t, "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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

// sniffConn copies what the server sends into a pipe that an HTTP/2 framer
// reads, so a test can see the server's frames.
type sniffConn struct {
	net.Conn
	w *io.PipeWriter
}

func (c sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.w.Write(p[:n])
	}
	return n, err
}

// TestGRPCNoBDPPings: the server's flow-control windows are fixed, so it
// never sends the bandwidth-estimation PINGs that grpc-go otherwise sends
// as data arrives, each costing a write and a read on both sides. (With
// grpc-go's default windows this test sees a PING about once per call.)
func TestGRPCNoBDPPings(t *testing.T) {
	_, _, addr := serveEnvoy(t, "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n")

	pr, pw := io.Pipe()
	var pings, settings atomic.Int64
	go func() {
		// The client preface goes the other way; the server's stream
		// starts with its SETTINGS frame.
		fr := http2.NewFramer(io.Discard, pr)
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				io.Copy(io.Discard, pr)
				return
			}
			switch f := f.(type) {
			case *http2.PingFrame:
				if !f.IsAck() {
					pings.Add(1)
				}
			case *http2.SettingsFrame:
				settings.Add(1)
			}
		}
	}()
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return sniffConn{Conn: c, w: pw}, nil
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
	if err != nil {
		t.Fatal(err)
	}
	rl := rlspb.NewRateLimitServiceClient(conn)
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	req := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}}
	for i := 0; i < 50; i++ {
		if resp, err := rl.ShouldRateLimit(cctx, req); err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("call %d: %v %v", i, resp, err)
		}
	}
	conn.Close()
	pw.Close()
	if settings.Load() == 0 {
		t.Fatal("saw no SETTINGS frame from the server: the sniffer is not reading the server's frames")
	}
	if n := pings.Load(); n != 0 {
		t.Fatalf("the server sent %d PINGs over 50 calls, want none", n)
	}
}

// hangStore answers nothing until the caller's context ends.
type hangStore struct{}

func (hangStore) Take(ctx context.Context, _ string, _ weir.Limit, _ int64) (weir.Result, error) {
	<-ctx.Done()
	return weir.Result{}, fmt.Errorf("%w: %w", weir.ErrStore, ctx.Err())
}
func (h hangStore) Do(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
	for i, r := range reqs {
		var err error
		if res[i], err = h.Take(ctx, r.Key, r.Limit, r.N); err != nil {
			return err
		}
	}
	return nil
}

// TestCallerGiveUpIsNoStoreError: a caller that gives up before the store
// answers (Envoy's rate-limit timeout is 20ms) is not counted as a store
// error, while a store that fails is.
func TestCallerGiveUpIsNoStoreError(t *testing.T) {
	const rl = "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	req := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}}
	// The caller that gives up has a 20ms deadline; the one whose store
	// fails has all the time it needs, so that a loaded machine's slow
	// call cannot turn it into a caller that gave up.
	for _, tc := range []struct {
		name     string
		store    weir.Store
		deadline time.Duration
		want     uint64
	}{{"caller gives up", hangStore{}, 20 * time.Millisecond, 0}, {"store fails", wrappedErrStore{}, 10 * time.Second, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			s, _, addr := serveEnvoy(t, rl, WithStore(tc.store))
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			_, err = rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, req)
			if tc.want == 0 && status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("a store that hangs: %v, want the client's deadline", err)
			}
			// The handler may still be finishing after the client gave up.
			deadline := time.Now().Add(5 * time.Second)
			for s.metrics.errorsTotal.Load() < tc.want && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // past the guard's own 50ms timeout
			if got := s.metrics.errorsTotal.Load(); got != tc.want {
				t.Fatalf("%d store errors counted, want %d", got, tc.want)
			}
		})
	}
}
