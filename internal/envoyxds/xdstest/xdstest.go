// Package xdstest runs a real xDS management server for tests, built from
// go-control-plane's own server and snapshot cache (as Envoy Gateway's
// is), serving envoyproxy/ratelimit's RateLimitConfig resources.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Wait bounds every wait for the client, so that a broken client fails
// the test instead of hanging it; it is not a timing assertion.
const Wait = 60 * time.Second

// Server is a running management server.
type Server struct {
	// Addr is where it listens.
	Addr string

	t      testing.TB
	nodeID string
	cache  cachev3.SnapshotCache
	gs     *grpc.Server
	reqs   chan *discoveryv3.DiscoveryRequest
}

// Start serves on addr ("127.0.0.1:0" for any port; a fixed one to
// restart a server where the last one was) with TLS when tlsCfg is not
// nil, holding snapshots for nodeID. It stops when the test ends.
func Start(t testing.TB, addr string, tlsCfg *tls.Config, nodeID string) *Server {
	t.Helper()
	var l net.Listener
	var err error
	for range 100 { // a restarted server's port may still be closing
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("xdstest: listen %s: %v", addr, err)
	}
	s := &Server{Addr: l.Addr().String(), t: t, nodeID: nodeID,
		cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		reqs:  make(chan *discoveryv3.DiscoveryRequest, 4096)}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.gs = grpc.NewServer(opts...)
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
		select {
		case s.reqs <- req:
		default: // a test reads what it waits for; never block the server
		}
		return nil
	}}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(s.gs, serverv3.NewServer(context.Background(), s.cache, cb))
	go s.gs.Serve(l)
	t.Cleanup(s.Stop)
	return s
}

// Stop closes the server and its streams at once.
func (s *Server) Stop() { s.gs.Stop() }

// Set makes a snapshot of configs, at version, the one the node gets.
func (s *Server) Set(version string, configs ...*rlsconfv3.RateLimitConfig) {
	s.t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		s.t.Fatalf("xdstest: snapshot %s: %v", version, err)
	}
	if err := s.cache.SetSnapshot(context.Background(), s.nodeID, snap); err != nil {
		s.t.Fatalf("xdstest: snapshot %s: %v", version, err)
	}
}

// WaitRequest returns the first request from now on that match accepts,
// failing the test if none comes within Wait.
func (s *Server) WaitRequest(what string, match func(*discoveryv3.DiscoveryRequest) bool) *discoveryv3.DiscoveryRequest {
	s.t.Helper()
	deadline := time.After(Wait)
	for {
		select {
		case r := <-s.reqs:
			if match(r) {
				return r
			}
		case <-deadline:
			s.t.Fatalf("xdstest: no %s within %v", what, Wait)
			return nil
		}
	}
}

// ACK matches the ACK of version.
func ACK(version string) func(*discoveryv3.DiscoveryRequest) bool {
	return func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetErrorDetail() == nil && r.GetVersionInfo() == version && r.GetResponseNonce() != ""
	}
}

// NACK matches a NACK whose message holds substr.
func NACK(substr string) func(*discoveryv3.DiscoveryRequest) bool {
	return func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetErrorDetail() != nil && strings.Contains(r.GetErrorDetail().GetMessage(), substr)
	}
}

// Limit is a RateLimitConfig named name for domain with one descriptor
// key=value limited to n per unit.
func Limit(name, domain, key, value string, n uint32, unit rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: key, Value: value, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
	}}}
}
