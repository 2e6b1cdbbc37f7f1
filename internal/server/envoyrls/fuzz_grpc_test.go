package envoyrls

import (
	"context"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weir-dev/weir/store/memstore"
)

// Any bytes that decode as a RateLimitRequest, as gRPC would hand them to
// ShouldRateLimit, get a response or InvalidArgument; never a panic, an
// Internal error or Unavailable (the store, in memory, never fails).
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlspb.RateLimitRequest{
		{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{desc("foo", "x", "bar", "banned")}},
		{Domain: "rl", HitsAddend: 7, Descriptors: []*rlcommon.RateLimitDescriptor{desc("foo", "x"), desc("qux", "")}},
		{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{withOverride(desc("foo", "x"), 3, typev3.RateLimitUnit_HOUR, 2)}},
		{Domain: "unknown", Descriptors: []*rlcommon.RateLimitDescriptor{desc("a", "b")}},
		{Domain: "", Descriptors: nil},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	cfg, err := Parse([]byte(exampleYAML), "example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	svc := New(cfg, memstore.New())
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlspb.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return // gRPC would refuse it before the handler
		}
		resp, err := svc.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument {
				t.Fatalf("ShouldRateLimit(%v): %v (code %v)", &req, err, c)
			}
			return
		}
		if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("ShouldRateLimit(%v): %d statuses for %d descriptors", &req, len(resp.GetStatuses()), len(req.GetDescriptors()))
		}
	})
}
