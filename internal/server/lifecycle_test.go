package server

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestStartWithRedisDown: a server whose Redis is down at start serves
// anyway, deciding by on_error, ready, with its store reported down; when
// Redis starts, the same server connects and sets up by itself, without a
// restart: decisions reach Redis, and so does its own work (the fleet
// view's keys).
func TestStartWithRedisDown(t *testing.T) {
	r := redistest.Standalone(t)
	r.Stop() // nothing listens at r.Addr now
	s, base := newRedisServer(t, r.Addr, "a")
	if !strings.HasPrefix(s.StoreDescription(), "redis standalone "+r.Addr) {
		t.Fatalf("store: %s", s.StoreDescription())
	}
	for range 3 {
		if code, d := check(t, base, "login", "192.0.2.1", 1); code != 200 || d["fallback"] != "local" {
			t.Fatalf("check with Redis down: %d %v; want the on_error fallback (local)", code, d)
		}
	}
	if resp, b := call(t, "GET", base+"/readyz", ""); resp.StatusCode != 200 {
		t.Fatalf("readyz with Redis down: %d %s", resp.StatusCode, b)
	}
	if resp, b := call(t, "GET", base+"/healthz/store", ""); resp.StatusCode != 503 || decode(t, b)["status"] != "down" {
		t.Fatalf("healthz/store with Redis down: %d %s", resp.StatusCode, b)
	}

	r.Start()
	eventually(t, 30*time.Second, "decisions to reach Redis", func() bool {
		code, d := check(t, base, "api", "key-1", 1)
		return code == 200 && d["fallback"] == nil && d["allowed"] == true
	})
	keys, err := r.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	state := false
	for _, k := range keys.([]any) {
		state = state || strings.Contains(k.(string), "fixed_window")
	}
	if !state {
		t.Fatalf("no limiter state in Redis: %v", keys)
	}
	eventually(t, 10*time.Second, "the fleet view's keys", func() bool {
		n, err := r.Do("EXISTS", keysFor("").fleetIndex)
		return err == nil && n == int64(1)
	})
	if resp, b := call(t, "GET", base+"/healthz/store", ""); resp.StatusCode != 200 {
		t.Fatalf("healthz/store with Redis up: %d %s", resp.StatusCode, b)
	}
	if fl, err := r.Do("FUNCTION", "LIST"); err != nil || len(fl.([]any)) == 0 {
		t.Fatalf("the library was not loaded: %v %v", fl, err)
	}
}

// TestShutdownGoesUnreadyFirst: once the context ends, the server answers
// /readyz with 503 and gRPC health NOT_SERVING while it still serves
// decisions, for the shutdown delay; then it stops.
func TestShutdownGoesUnreadyFirst(t *testing.T) {
	s, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken(""),
		WithShutdownDelay(time.Hour), WithShutdownTimeout(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + hl.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, hl, gl) }()
	cc, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	eventually(t, 10*time.Second, "serving", func() bool {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
	})
	if resp, b := call(t, "GET", base+"/readyz", ""); resp.StatusCode != 200 {
		t.Fatalf("readyz: %d %s", resp.StatusCode, b)
	}

	cancel()
	eventually(t, 10*time.Second, "readyz to answer 503", func() bool {
		resp, _ := call(t, "GET", base+"/readyz", "")
		return resp.StatusCode == 503
	})
	for _, name := range []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"} {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("gRPC health of %q while draining: %v %v", name, resp, err)
		}
	}
	// Still serving decisions, and telling clients to close connections.
	r, b := call(t, "POST", base+"/v1/check", `{"rule":"login","key":"192.0.2.1","hits":1}`, "Content-Type", "application/json")
	if r.StatusCode != 200 || decode(t, b)["allowed"] != true || !r.Close {
		t.Fatalf("check while draining: %d %s (close %v)", r.StatusCode, b, r.Close)
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned during the shutdown delay: %v", err)
	default:
	}
	// A second Shutdown call ends the delay early (what the timeout does).
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if err := s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}
