package server

import (
	"net/http"

	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// WithEnvoyAwaitConfig makes GET /healthcheck answer 500 until the first
// SetEnvoyConfig, as envoyproxy/ratelimit's does before its first config
// arrives over xDS. Without it /healthcheck is healthy from the start.
func WithEnvoyAwaitConfig() Option { return func(o *options) { o.envoyAwait = true } }

// SetEnvoyConfig puts cfg in force on the Envoy rate limit service (calls
// under way finish with the old one), as a config received over xDS is.
func (s *Server) SetEnvoyConfig(cfg *envoyrls.Config) {
	s.envoy.SetConfig(cfg)
	s.envoyLoaded.Store(true)
}

// handleHealthcheck is envoyproxy/ratelimit's GET /healthcheck, which the
// probes of its Kubernetes deployments (Envoy Gateway's) ask: 200 "OK"
// while serving, 500 with no body once shutting down, and before the
// first Envoy config under WithEnvoyAwaitConfig.
func (s *Server) handleHealthcheck(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() || (s.o.envoyAwait && !s.envoyLoaded.Load()) {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Write([]byte("OK"))
}

// WithTLSOnGRPCOnly keeps the HTTP listener in plaintext when WithTLS (or
// server.tls) secures the listeners: only gRPC speaks TLS, as
// envoyproxy/ratelimit's GRPC_SERVER_USE_TLS does, whose HTTP port serves
// the plaintext /healthcheck that Kubernetes probes ask.
func WithTLSOnGRPCOnly() Option { return func(o *options) { o.tlsGRPCOnly = true } }

// TLSOnGRPCOnly reports whether WithTLSOnGRPCOnly keeps HTTP in plaintext.
func (s *Server) TLSOnGRPCOnly() bool { return s.o.tlsGRPCOnly }
