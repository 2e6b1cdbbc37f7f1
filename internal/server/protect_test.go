package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/weir-dev/weir/protect"
)

// TestProtectMetricsAndSnapshot: weir serve applies its config's protect
// rules to its own API, and reports them in /metrics and the dashboard
// snapshot; probes and scrapes are not counted.
func TestProtectMetricsAndSnapshot(t *testing.T) {
	cfg := testConfig + `
protect:
  - name: checks
    match: {path: /v1/check}
    concurrency: 5
    priority: header:X-Priority
    reserve: 20%
  - name: deps
    match: {path: /v1/nothing}
    breaker: {errors: 5}
system:
  max_inflight: 100
`
	_, ts := newTestServer(t, WithConfig(mustParse(t, cfg)))
	for range 3 {
		resp, _ := call(t, "POST", ts.URL+"/v1/check", `{"rule":"api","key":"k"}`, "X-Priority", "critical")
		if resp.StatusCode >= 500 {
			t.Fatalf("check: %d", resp.StatusCode)
		}
	}
	call(t, "GET", ts.URL+"/healthz", "")
	_, body := call(t, "GET", ts.URL+"/metrics", "")
	m := string(body)
	for _, want := range []string{
		`weir_protect_limit{protect="checks"} 5`,
		`weir_protect_in_flight{protect="checks"} 0`,
		`weir_protect_admitted_total{priority="critical",protect="checks"} 3`,
		`weir_protect_shed_total{priority="sheddable",protect="checks"} 0`,
		`weir_protect_limit{protect="system"} 100`,
		`weir_protect_breaker_state{protect="deps"} 0`,
		`weir_protect_breaker_transitions_total{protect="deps",state="open"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(m, `weir_protect_breaker_state{protect="checks"}`) {
		t.Error("a breaker state for a rule without a breaker")
	}
	_, body = call(t, "GET", ts.URL+"/v1/dashboard/snapshot", "")
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	// The JSON contract with the dashboard (protect.js).
	wantKeys(t, doc["protect"].([]any)[2], "protect entry", "name", "adaptive", "shadow", "limit", "in_flight",
		"base_rtt_ms", "admitted", "shed", "circuit_open", "breaker", "transitions")
	var snap Snapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Protect) != 3 {
		t.Fatalf("snapshot protect: %+v", snap.Protect)
	}
	sys, checks, deps := snap.Protect[0], snap.Protect[1], snap.Protect[2]
	// The system section saw the checks and the metrics scrape is exempt,
	// but this snapshot request itself is in flight.
	if sys.Name != "system" || sys.Admitted["normal"] != 3+1 || sys.InFlight != 1 {
		t.Errorf("system: %+v", sys)
	}
	if checks.Name != "checks" || checks.Admitted["critical"] != 3 || checks.Limit != 5 || checks.Breaker != "" {
		t.Errorf("checks: %+v", checks)
	}
	if deps.Breaker != "closed" || deps.Limit != 0 {
		t.Errorf("deps: %+v", deps)
	}
}

// TestProtectGRPC: a protect rule matching ShouldRateLimit's method limits
// Envoy's calls in flight; a call past it gets Unavailable at once, and
// the health service is exempt.
func TestProtectGRPC(t *testing.T) {
	const rl = "domain: rl\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	cfg := testConfig + `
store: {timeout: 2s}
protect:
  - name: rls
    match: {path: /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit}
    concurrency: 1
`
	s, _, addr := serveEnvoy(t, rl, WithConfig(mustParse(t, cfg)), WithStore(hangStore{}))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}}}}
	// The first call hangs in the store until the store's 2s timeout,
	// holding the one slot meanwhile.
	hung := make(chan error, 1)
	go func() {
		_, err := client.ShouldRateLimit(context.Background(), req)
		hung <- err
	}()
	// Wait for the hanging call to hold the one slot.
	for deadline := time.Now().Add(10 * time.Second); s.Policy().ProtectStats()[0].InFlight != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the first call never got in flight")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = client.ShouldRateLimit(ctx, req)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rls") {
		t.Fatalf("a call past the limit: %v, want Unavailable naming the rule", err)
	}
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health while the limit is full: %v %v", h, err)
	}
	<-hung
	for deadline := time.Now().Add(10 * time.Second); s.Policy().ProtectStats()[0].InFlight != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the slot never came back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := s.Policy().ProtectStats()[0]
	if st.Admitted[protect.Normal] != 1 || st.Shed[protect.Normal] != 1 {
		t.Fatalf("stats %+v", st)
	}
}
