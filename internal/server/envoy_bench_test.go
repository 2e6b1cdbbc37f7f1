//go:build unix

package server

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// benchEnvoyDescriptors are the descriptor keys BenchmarkEnvoyCall asks
// about, each with a limit of its own in benchEnvoyConfig.
var benchEnvoyDescriptors = []string{"client", "path", "method", "tenant", "route"}

const benchEnvoyConfig = `domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: method
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 100}
`

// BenchmarkEnvoyCall is weir serve's own work for one Envoy
// ShouldRateLimit call on the memory store, everything but the HTTP/2
// transport: the request decoded by the server's codec, the server's
// interceptor, the service with its decider and observer (metrics,
// per-second counters), and the response encoded. Keys are uniform over
// 100k, as make bench-serve sends them. allocs/op and cpu-ns/op (the
// process's CPU time, garbage collection included) are the figures to
// watch; ns/op moves with the machine's load.
func BenchmarkEnvoyCall(b *testing.B) {
	for _, n := range []int{1, 5} {
		b.Run(strconv.Itoa(n)+"desc", func(b *testing.B) {
			ecfg, err := envoyrls.Parse([]byte(benchEnvoyConfig), "bench.yaml")
			if err != nil {
				b.Fatal(err)
			}
			s, _ := newTestServer(b, WithEnvoyConfig(ecfg))
			codec := envoyrls.Codec() // as weir serve decodes and encodes
			const keys = 100_000
			bodies := make([]mem.BufferSlice, 1024)
			for i := range bodies {
				req := &rlspb.RateLimitRequest{Domain: "bench", HitsAddend: 1}
				for d := range n {
					v := strconv.Itoa((i*7919 + d*104729) % keys)
					req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
						Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: benchEnvoyDescriptors[d], Value: v}},
					})
				}
				if bodies[i], err = codec.Marshal(req); err != nil {
					b.Fatal(err)
				}
			}
			info := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
			handler := func(ctx context.Context, req any) (any, error) {
				return s.envoy.ShouldRateLimit(ctx, req.(*rlspb.RateLimitRequest))
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for i := range b.N {
				req := new(rlspb.RateLimitRequest)
				if err := codec.Unmarshal(bodies[i%len(bodies)], req); err != nil {
					b.Fatal(err)
				}
				resp, err := s.protectUnary(ctx, req, info, handler)
				if err != nil {
					b.Fatal(err)
				}
				out, err := codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				if len(resp.(*rlspb.RateLimitResponse).Statuses) != n {
					b.Fatalf("%d statuses, want %d", len(resp.(*rlspb.RateLimitResponse).Statuses), n)
				}
				out.Free()
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
