// Package envoyrls makes weir a drop-in replacement for envoyproxy/ratelimit:
// it serves Envoy's envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
// over gRPC and reads envoyproxy/ratelimit's YAML configuration files
// unchanged.
//
// A configuration file names a domain and a tree of descriptors:
//
//	domain: rl
//	descriptors:
//	  - key: remote_address
//	    rate_limit: {unit: second, requests_per_unit: 10}
//
// Envoy sends a domain and a list of descriptors, each a list of key/value
// entries. Each descriptor is matched against the domain's tree, one entry
// per level: exact key and value first, then the first wildcard (a '*'
// anywhere, each matching any run of characters), then the key alone. The rate_limit on the node reached by the last
// entry applies, counted per distinct list of entries. Descriptors are
// counted independently, and the call is OVER_LIMIT when any of them is.
//
//	cfg, err := envoyrls.LoadDir("/srv/runtime_data/current/ratelimit/config")
//	svc := envoyrls.New(cfg, memstore.New())
//	gs := grpc.NewServer()
//	envoyrls.RegisterGRPC(gs, svc)
//
// A rule counts in a weir fixed window by default, aligned to the epoch as
// upstream's windows are; the extensions unit_multiplier, limit, algorithm
// and burst give any period and any weir algorithm. Unlike upstream, a
// request over the limit consumes nothing, unless it carries its own
// hits_addend (a cost), which counts as upstream counts it. docs/envoy.md
// is the migration guide.
package envoyrls
