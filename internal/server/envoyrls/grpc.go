package envoyrls

import (
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ServiceName is the gRPC name of the rate limit service, as health checks
// ask for it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// HealthName is the short name envoyproxy/ratelimit registers with the
// gRPC health service; Envoy's health checks and Kubernetes probes
// written for it ask for this name.
const HealthName = "ratelimit"

// RegisterGRPC registers svc as Envoy's rate limit service on s, together
// with the standard gRPC health service reporting SERVING overall (""),
// for ServiceName and for HealthName. It returns the health server, so that a
// draining server can switch it to NOT_SERVING with Shutdown.
func RegisterGRPC(s grpc.ServiceRegistrar, svc *Service) *health.Server {
	rlspb.RegisterRateLimitServiceServer(s, svc)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(HealthName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	return h
}
