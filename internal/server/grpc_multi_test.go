package server

import (
	"context"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestGRPCSeveralDescriptorsOnRedis: the descriptors of one request are
// decided concurrently (one pipelined round trip) and each still counts
// on its own, exactly, against real Redis. The limits are sliding logs, not upstream's fixed windows, so that a
// run that crosses a minute boundary of the clock sees the same counts.
func TestGRPCSeveralDescriptorsOnRedis(t *testing.T) {
	r := redistest.Standalone(t)
	_, _, addr := serveEnvoy(t, `domain: rl
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_log}
`, WithRedisURL("redis://"+r.Addr+"/0"),
		// Not the default 50ms: on a loaded machine a slow script would send
		// a decision to the local fallback, and the counts would be off.
		WithConfig(mustParse(t, testConfig+"store:\n  timeout: 5s\n")))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rl := rlspb.NewRateLimitServiceClient(conn)
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	d := func(k, v string) *rlcommon.RateLimitDescriptor {
		return &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	req := &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{d("user", "alice"), d("ip", "192.0.2.1"), d("user", "bob")}}
	ok, over := rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT
	for call, want := range [][3]rlspb.RateLimitResponse_Code{{ok, ok, ok}, {ok, ok, ok}, {over, ok, over}, {over, over, over}} {
		resp, err := rl.ShouldRateLimit(cctx, req)
		if err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		for i, st := range resp.Statuses {
			if st.Code != want[i] {
				t.Fatalf("call %d descriptor %d: %v, want %v (all: %v)", call, i, st.Code, want[i], resp.Statuses)
			}
		}
		wantRemaining := []uint32{uint32(max(1-call, 0)), uint32(max(2-call, 0)), uint32(max(1-call, 0))}
		for i, st := range resp.Statuses {
			if st.LimitRemaining != wantRemaining[i] {
				t.Fatalf("call %d descriptor %d: %d remaining, want %d", call, i, st.LimitRemaining, wantRemaining[i])
			}
		}
	}
}
