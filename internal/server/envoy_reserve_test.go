package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// envoyReserveYAML: a daily token budget, reserving 100 on the request
// path. A day, so that no wall clock refills it during the test.
const envoyReserveYAML = `domain: llm
descriptors:
  - key: tenant
    debit: true
    reserve: 100
    rate_limit: {unit: day, requests_per_unit: 1000}
`

// TestEnvoyReserveOnRedis: with --envoy-reserve and Redis, one instance
// reserves and another settles (the reservation is in Redis, taken with
// GETDEL); a second settlement of the same id is a plain charge, never a
// refund, and is counted.
func TestEnvoyReserveOnRedis(t *testing.T) {
	r := redistest.Standalone(t)
	opts := []Option{WithRedisURL("redis://" + r.Addr + "/0"), WithEnvoyReserve(true),
		WithConfig(mustParse(t, testConfig+"store:\n  timeout: 5s\n"))}
	_, _, addrA := serveEnvoy(t, envoyReserveYAML, opts...)
	sB, _, addrB := serveEnvoy(t, envoyReserveYAML, opts...)
	client := func(addr string) rlspb.RateLimitServiceClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlspb.NewRateLimitServiceClient(conn)
	}
	a, b := client(addrA), client(addrB)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(c rlspb.RateLimitServiceClient, id string, hits uint64) *rlspb.RateLimitResponse {
		t.Helper()
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}, HitsAddend: wrapperspb.UInt64(hits)}
		if id != "" {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: envoyrls.ReservationKey, Value: id})
		}
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := call(a, "", 0)
	id := resp.GetDynamicMetadata().GetFields()[envoyrls.ReservationKey].GetStringValue()
	if resp.OverallCode != rlspb.RateLimitResponse_OK || id == "" || resp.Statuses[0].LimitRemaining != 900 {
		t.Fatalf("request path: %v", resp)
	}
	// Settled on the other instance: 40 used of 100 reserved refunds 60.
	if resp := call(b, id, 40); resp.Statuses[0].LimitRemaining != 960 {
		t.Fatalf("settled 40 of 100: %v", resp)
	}
	// Again, on the first: a plain charge of 40, not a refund.
	if resp := call(a, id, 40); resp.Statuses[0].LimitRemaining != 920 {
		t.Fatalf("the same id settled twice: %v", resp)
	}
	if n := sB.Envoy().UnknownReservations(); n != 0 {
		t.Fatalf("instance B counted %d unknown reservations", n)
	}
	// A forged id of /v1/reserve's shape: a plain charge.
	if resp := call(b, "00000000000000000000000000000000", 0); resp.Statuses[0].LimitRemaining != 920 || sB.Envoy().UnknownReservations() != 1 {
		t.Fatalf("forged id: %v, %d unknown", resp, sB.Envoy().UnknownReservations())
	}
	// A limit override (limit.fromMetadata): reserved on A under 500 a
	// day, settled on B under 800 a day (the tenant's limit changed in
	// between): the same counter, so 160 of 100 charges 60 more.
	override := func(c rlspb.RateLimitServiceClient, id string, rpu uint32, hits uint64) *rlspb.RateLimitResponse {
		t.Helper()
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: "acme"}}, HitsAddend: wrapperspb.UInt64(hits),
			Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_DAY}}
		if id != "" {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: envoyrls.ReservationKey, Value: id})
		}
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp = override(a, "", 500, 0)
	id = resp.GetDynamicMetadata().GetFields()[envoyrls.ReservationKey].GetStringValue()
	if resp.OverallCode != rlspb.RateLimitResponse_OK || id == "" || resp.Statuses[0].LimitRemaining != 400 {
		t.Fatalf("override's request path: %v", resp)
	}
	if resp := override(b, id, 800, 160); resp.Statuses[0].LimitRemaining != 640 || sB.Envoy().UnknownReservations() != 1 {
		t.Fatalf("override settled 160 of 100 on B: %v, %d unknown", resp, sB.Envoy().UnknownReservations())
	}
	// The configured descriptor's counter is apart: still 920 left.
	if resp := call(b, "00000000000000000000000000000000", 0); resp.Statuses[0].LimitRemaining != 920 {
		t.Fatalf("the configured counter after the override's: %v", resp)
	}
}

// TestEnvoyReserveOff: without --envoy-reserve, a configuration with
// reserve: is refused at start, naming the file, the line and the flag.
func TestEnvoyReserveOff(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rl.yaml"), []byte(envoyReserveYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(WithConfig(mustParse(t, testConfig)), WithEnvoyConfigDir(dir), WithLogger(quietLogger()))
	if err == nil || !strings.Contains(err.Error(), "rl.yaml:5: reserve is off") || !strings.Contains(err.Error(), "--envoy-reserve") {
		t.Fatalf("reserve: without --envoy-reserve: %v", err)
	}
}

// TestEnvoySettleAcrossRedisOutage: with --envoy-reserve, Redis and
// on_error: allow, settlements made while Redis is down are answered by
// the fallback and kept by the instance; when Redis is back they are
// made there, each exactly once: the reservations (taken by neither
// instance while Redis was down) are settled, the charge past the
// estimate debited and the refund short of it given back. The tenant's
// budget is a limit override (Envoy Gateway's limit.fromMetadata) of
// 1000 tokens a day; one instance reserves, the other settles.
func TestEnvoySettleAcrossRedisOutage(t *testing.T) {
	r := redistest.Standalone(t)
	opts := []Option{WithRedisURL("redis://" + r.Addr + "/0"), WithEnvoyReserve(true),
		WithConfig(mustParse(t, testConfig+"store:\n  timeout: 5s\n  on_error: allow\n"))}
	_, _, addrA := serveEnvoy(t, envoyReserveYAML, opts...)
	sB, _, addrB := serveEnvoy(t, envoyReserveYAML, opts...)
	client := func(addr string) rlspb.RateLimitServiceClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlspb.NewRateLimitServiceClient(conn)
	}
	a, b := client(addrA), client(addrB)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rls := func(c rlspb.RateLimitServiceClient, tenant, id string, hits uint64) *rlspb.RateLimitResponse {
		t.Helper()
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}}, HitsAddend: wrapperspb.UInt64(hits),
			Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_DAY}}
		if id != "" {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: envoyrls.ReservationKey, Value: id})
		}
		resp, err := c.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var ids []string
	for range 2 {
		resp := rls(a, "acme", "", 0)
		id := resp.GetDynamicMetadata().GetFields()[envoyrls.ReservationKey].GetStringValue()
		if resp.OverallCode != rlspb.RateLimitResponse_OK || id == "" {
			t.Fatalf("request path: %v", resp)
		}
		ids = append(ids, id)
	}
	if _, err := r.Do("SAVE"); err != nil { // kept across the restart
		t.Fatal(err)
	}
	r.Stop()
	for i, actual := range []uint64{150, 30} {
		if resp := rls(b, "acme", ids[i], actual); resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("settlement during the outage: %v", resp)
		}
	}
	if n := sB.Envoy().PendingSettlements(); n != 2 {
		t.Fatalf("%d settlements wait for Redis, want 2", n)
	}
	metricsB := httptestServe(t, sB) + "/metrics"
	if _, body := call(t, "GET", metricsB, ""); !strings.Contains(string(body), "weir_envoy_pending_settlements 2") {
		t.Errorf("/metrics lacks weir_envoy_pending_settlements 2")
	}
	r.Start()
	for sB.Envoy().PendingSettlements() > 0 {
		if ctx.Err() != nil {
			t.Fatalf("%d settlements still wait after Redis came back", sB.Envoy().PendingSettlements())
		}
		rls(b, "other", "", 1) // the store answers again, eventually
		time.Sleep(20 * time.Millisecond)
	}
	if n := sB.Envoy().UnknownReservations(); n != 0 {
		t.Fatalf("instance B counted %d unknown reservations", n)
	}
	// 200 reserved, +50 for 150 of 100, −70 for 30 of 100: 180. A
	// forged id charges 0 and reports what is left. Asked of B, whose
	// store has just answered: A's connections broke in the outage (and
	// its background tasks failed), so its first call may still be
	// answered by on_error.
	if resp := rls(b, "acme", "00000000000000000000000000000000", 0); resp.Statuses[0].LimitRemaining != 820 {
		t.Fatalf("after the outage: %v, want 820 of 1000 left", resp)
	}
	_, body := call(t, "GET", metricsB, "")
	for _, want := range []string{"weir_envoy_pending_settlements 0", "weir_envoy_dropped_settlements_total 0"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
