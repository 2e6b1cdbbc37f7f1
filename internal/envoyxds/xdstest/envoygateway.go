package xdstest

// EnvoyGatewayCommand is the command of the rate limit container in the
// Deployment Envoy Gateway generates (envoyproxy/gateway,
// internal/infrastructure/kubernetes/ratelimit/resource.go,
// expectedRateLimitContainers); it sets no args.
var EnvoyGatewayCommand = []string{"/bin/ratelimit"}

// EnvoyGatewayEnv is that container's environment, in order, with Redis
// as a plain URL and Prometheus on (expectedRateLimitContainerEnv in the
// same file; testdata/deployments/default.yaml there shows it rendered).
// The files are those EG mounts: /certs/tls.crt, tls.key, ca.crt from the
// envoy-rate-limit Secret. Tests replace the addresses only.
var EnvoyGatewayEnv = [][2]string{
	{"RUNTIME_ROOT", "/data"},
	{"RUNTIME_SUBDIRECTORY", "ratelimit"},
	{"RUNTIME_IGNOREDOTFILES", "true"},
	{"RUNTIME_WATCH_ROOT", "false"},
	{"LOG_LEVEL", "info"},
	{"USE_STATSD", "false"},
	{"CONFIG_TYPE", "GRPC_XDS_SOTW"},
	{"CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"},
	{"CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"},
	{"GRPC_SERVER_USE_TLS", "true"},
	{"GRPC_SERVER_TLS_CERT", "/certs/tls.crt"},
	{"GRPC_SERVER_TLS_KEY", "/certs/tls.key"},
	{"GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "true"},
	{"REDIS_SOCKET_TYPE", "tcp"},
	{"REDIS_URL", "redis.redis.svc:6379"},
	{"USE_PROMETHEUS", "true"},
	{"PROMETHEUS_ADDR", ":19001"},
	{"PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"},
}

// The ports of that Deployment: gRPC (the Service's), metrics, and the
// probes' GET /healthcheck, plaintext HTTP.
const (
	EnvoyGatewayGRPCPort    = 8081
	EnvoyGatewayMetricsPort = 19001
	EnvoyGatewayProbePort   = 8080
	EnvoyGatewayProbePath   = "/healthcheck"
)
