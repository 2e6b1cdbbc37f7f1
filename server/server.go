// Package server is weir's rate-limit service, the engine of `weir serve`.
//
// A Server evaluates the rules of a weir.yaml (package policy) over a store
// (in memory, or Redis shared by many instances) and answers on HTTP:
//
//	POST   /v1/check              decide {"rule","key","hits"}, or an Envoy-style {"domain","descriptors"}
//	GET    /v1/auth               nginx auth_request, Traefik ForwardAuth, Caddy forward_auth
//	GET    /v1/rules              the rules in force
//	GET    /v1/top                the most limited identities per rule
//	GET    /v1/dashboard/snapshot everything the dashboard draws, in one JSON document
//	GET    /metrics               Prometheus metrics
//	GET    /healthz, /readyz      liveness, and readiness (the store answers)
//	GET    /                      the dashboard
//
// and, behind a bearer token, the admin API:
//
//	GET    /v1/state?rule=&key=   inspect an identity's remaining quota, without consuming
//	DELETE /v1/state?rule=&key=   reset it, penalty box included
//	GET    /v1/blocked            the identities held in a penalty box, fleet-wide with Redis
//	DELETE /v1/blocked?rule=&key= unblock one
//	PUT    /v1/rules              replace the rule set at run time (with Redis: on every instance)
//	DELETE /v1/rules              drop that replacement, back to the config file's rules
//
// On gRPC it serves Envoy's envoy.service.ratelimit.v3.RateLimitService
// from envoyproxy/ratelimit config files (package envoyrls), with the
// standard health service.
//
// A Server keeps nothing that matters in process: all limiter state is in
// the store, so instances scale out behind a load balancer. What each
// instance keeps for the dashboard (per-second counters, the most limited
// identities, the penalty-box index) it also publishes to Redis, so that
// any instance shows the whole fleet.
//
//	srv, err := server.New(server.WithConfigFile("weir.yaml"))
//	if err != nil { ... }
//	err = srv.ListenAndServe(ctx) // until ctx ends, then drains
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/server/envoyrls"
)

// Version is reported by the dashboard snapshot unless WithVersion says
// otherwise.
const Version = "0.1.0"

// DefaultAdminTokenEnv names the environment variable that holds the admin
// token when the config's server.admin_token_env is empty.
const DefaultAdminTokenEnv = "WEIR_ADMIN_TOKEN"

// Default listen addresses, those of envoyproxy/ratelimit.
const (
	DefaultHTTPAddr = ":8080"
	DefaultGRPCAddr = ":8081"
)

// DefaultShutdownTimeout bounds how long a graceful shutdown waits for
// in-flight requests.
const DefaultShutdownTimeout = 25 * time.Second

// An Option configures New.
type Option func(*options)

type options struct {
	cfg             *policy.Config
	cfgPath         string
	store           weir.Store
	redisURL        string
	envoyCfg        *envoyrls.Config
	envoyDir        string
	log             *slog.Logger
	adminToken      *string
	adminTokenEnv   string
	lookupEnv       func(string) (string, bool)
	instanceID      string
	version         string
	httpAddr        *string
	grpcAddr        *string
	shutdownTimeout time.Duration
	now             func() time.Time

	// Intervals of the background loops; tests shorten them.
	fleetEvery time.Duration
	rulesEvery time.Duration
	probeEvery time.Duration
}

// WithConfig makes the server use cfg (from policy.Parse or built in Go).
// Without WithConfig or WithConfigFile the server runs DemoConfig.
func WithConfig(cfg *policy.Config) Option { return func(o *options) { o.cfg = cfg } }

// WithConfigFile loads weir.yaml from path and reloads it whenever it
// changes (and on Reload); a bad new file is rejected and logged, and the
// old rules stay in force. With WithConfig too, cfg is used for the first
// policy instead of the file's first content (so a caller can adjust it,
// as weir serve does with --redis), and reloads read the file.
func WithConfigFile(path string) Option { return func(o *options) { o.cfgPath = path } }

// WithStore makes the server keep limiter state in store instead of the
// one the config's store section describes. The server does not close it.
func WithStore(store weir.Store) Option { return func(o *options) { o.store = store } }

// WithRedisURL makes the server keep its state in Redis at url (the syntax
// of redisstore.ParseURL), overriding the config's store section.
func WithRedisURL(url string) Option { return func(o *options) { o.redisURL = url } }

// WithEnvoyConfig serves cfg on the gRPC ShouldRateLimit service and on
// POST /v1/check for Envoy-style bodies.
func WithEnvoyConfig(cfg *envoyrls.Config) Option { return func(o *options) { o.envoyCfg = cfg } }

// WithEnvoyConfigDir loads envoyproxy/ratelimit YAML files from dir (see
// envoyrls.LoadDir), and reloads them on Reload.
func WithEnvoyConfigDir(dir string) Option { return func(o *options) { o.envoyDir = dir } }

// grpcOptions tunes the gRPC server for Envoy's traffic: many small unary
// calls, each connection with a few in flight.
//   - A pool of stream workers large enough for every call in flight, so
//     handlers run on goroutines whose stacks have already grown; a new
//     goroutine per call grows its stack afresh every time (measured at
//     ~12% of the CPU under load).
//   - Fixed 1 MiB flow-control windows. Requests and responses are a few
//     dozen bytes, so the windows never fill; fixing them turns off gRPC's
//     bandwidth-delay estimator, which otherwise answers data with a PING
//     and so adds writes and reads on every connection.
func grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(grpcStreamWorkers),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
	}
}

const (
	grpcStreamWorkers = 256     // calls in flight served by pooled goroutines; more get their own
	grpcWindow        = 1 << 20 // bytes; fixed, which turns off the BDP estimator
)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithAdminToken sets the admin API's bearer token; "" turns the admin API
// off. Without it the token is read from the environment variable that the
// config's server.admin_token_env names (DefaultAdminTokenEnv if empty).
func WithAdminToken(token string) Option { return func(o *options) { o.adminToken = &token } }

// WithAdminTokenEnv names the environment variable holding the admin
// token, overriding the config's server.admin_token_env.
func WithAdminTokenEnv(name string) Option { return func(o *options) { o.adminTokenEnv = name } }

// WithLookupEnv makes the server read environment variables (the admin
// token's) through lookup instead of os.LookupEnv.
func WithLookupEnv(lookup func(string) (string, bool)) Option {
	return func(o *options) { o.lookupEnv = lookup }
}

// WithInstanceID names this instance in the fleet view (default
// "hostname-pid").
func WithInstanceID(id string) Option { return func(o *options) { o.instanceID = id } }

// WithVersion sets the version the snapshot reports (default Version).
func WithVersion(v string) Option { return func(o *options) { o.version = v } }

// WithHTTPAddr sets the HTTP listen address, overriding server.http in the
// config (default DefaultHTTPAddr).
func WithHTTPAddr(addr string) Option { return func(o *options) { o.httpAddr = &addr } }

// WithGRPCAddr sets the gRPC listen address, overriding server.grpc in the
// config (default DefaultGRPCAddr); "" or "off" serves no gRPC.
func WithGRPCAddr(addr string) Option { return func(o *options) { o.grpcAddr = &addr } }

// WithShutdownTimeout bounds how long ListenAndServe drains in-flight
// requests once its context ends (default DefaultShutdownTimeout).
func WithShutdownTimeout(d time.Duration) Option { return func(o *options) { o.shutdownTimeout = d } }

// Server is the rate-limit service. Build it with New; serve it with
// ListenAndServe or Serve, or mount Handler in a server of your own and
// call Close when done.
type Server struct {
	o       options
	log     *slog.Logger
	now     func() time.Time
	id      string
	version string

	base   atomic.Pointer[policy.Config] // the config file's (or WithConfig's) content
	guard  *policy.Guard
	holder *policy.Holder
	store  weir.Store
	owned  func() // closes what New opened
	info   atomic.Pointer[storeInfo]
	rdb    rueidis.Client // nil without Redis

	envoy    *envoyrls.Service
	envoyDir string

	adminToken string
	adminEnv   string

	metrics *metrics
	stats   *stats
	tops    *topSet
	blocked *blockedIndex
	fleet   *fleet
	rules   *ruleSync

	healthy    atomic.Bool
	lastFallbk atomic.Pointer[fallbackSeen]

	handler http.Handler

	bgCtx    context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup

	mu        sync.Mutex
	httpSrv   *http.Server
	grpcSrv   *grpc.Server
	grpcHlth  *health.Server
	closeOnce sync.Once
}

// New builds a Server: it opens the store, compiles the rules and starts
// the background work (config watching, fleet counters, readiness probes).
// It listens on nothing until ListenAndServe or Serve.
func New(opts ...Option) (*Server, error) {
	o := options{
		log:        slog.Default(),
		version:    Version,
		now:        time.Now,
		fleetEvery: time.Second,
		rulesEvery: 500 * time.Millisecond,
		probeEvery: 2 * time.Second,
	}
	for _, f := range opts {
		f(&o)
	}
	s := &Server{o: o, log: o.log, now: o.now, version: o.version, owned: func() {}}
	s.id = o.instanceID
	if s.id == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "weir"
		}
		s.id = host + "-" + strconv.Itoa(os.Getpid())
	}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())
	if err := s.init(); err != nil {
		s.bgCancel()
		s.owned()
		return nil, err
	}
	return s, nil
}

func (s *Server) init() error {
	o := &s.o
	// The config: given, from the file, or the demo.
	cfg := o.cfg
	if cfg != nil {
		c := *cfg // New adjusts the store section; the caller's copy stays as it is
		cfg = &c
	}
	if cfg == nil && o.cfgPath != "" {
		c, err := policy.LoadFile(o.cfgPath)
		if err != nil {
			return fmt.Errorf("server: config: %w", err)
		}
		cfg = c
	}
	if cfg == nil {
		c, err := policy.Parse([]byte(DemoConfig), "built-in demo config")
		if err != nil {
			return fmt.Errorf("server: the demo config is invalid: %w", err)
		}
		cfg = c
	}
	if o.redisURL != "" {
		if err := applyRedisURL(cfg, o.redisURL); err != nil {
			return err
		}
	}
	s.base.Store(cfg)

	if err := s.openStore(cfg); err != nil {
		return err
	}
	s.metrics = newMetrics(func() float64 { return breakerValue(s.guard.State()) })
	s.guard = policy.NewGuard(s.store, policy.GuardConfig{
		Timeout: cfg.Store.Timeout,
		Breaker: cfg.Store.Breaker,
		Logger:  s.log,
		OnStateChange: func(from, to policy.BreakerState) {
			s.log.Warn("weir: store circuit breaker changed state", "from", from.String(), "to", to.String())
		},
	})
	s.stats = newStats()
	s.tops = newTopSet(topK)
	s.blocked = newBlockedIndex(s.rdb, blockedKey, s.log, s.now)
	s.fleet = newFleet(s)
	s.rules = newRuleSync(s)

	// The admin token.
	s.adminEnv = cfg.Server.AdminTokenEnv
	if o.adminTokenEnv != "" {
		s.adminEnv = o.adminTokenEnv
	}
	if s.adminEnv == "" {
		s.adminEnv = DefaultAdminTokenEnv
	}
	if o.adminToken != nil {
		s.adminToken = *o.adminToken
	} else {
		lookup := o.lookupEnv
		if lookup == nil {
			lookup = os.LookupEnv
		}
		s.adminToken, _ = lookup(s.adminEnv)
	}

	// The rules: a replacement stored in Redis wins over the file's.
	if err := s.rules.loadInitial(s.bgCtx); err != nil {
		s.log.Warn("weir: could not read the rules stored in Redis; using the config's", "err", err)
	}
	if o.cfgPath != "" {
		first := true
		h, err := policy.Watch(s.bgCtx, o.cfgPath, func(fileCfg *policy.Config) (*policy.Policy, error) {
			if first && o.cfg != nil {
				first = false
				return s.build(cfg) // the caller's adjusted copy of the file
			}
			first = false
			if o.redisURL != "" {
				if err := applyRedisURL(fileCfg, o.redisURL); err != nil {
					return nil, err
				}
			}
			p, err := s.build(fileCfg)
			if err == nil {
				s.base.Store(fileCfg)
			}
			return p, err
		}, s.onSwap, policy.WatchLogger(s.log))
		if err != nil {
			return fmt.Errorf("server: config: %w", err)
		}
		s.holder = h
	} else {
		p, err := s.build(cfg)
		if err != nil {
			return fmt.Errorf("server: config: %w", err)
		}
		s.holder = policy.NewHolder(p)
	}

	// Envoy.
	ecfg := o.envoyCfg
	if o.envoyDir != "" {
		c, err := envoyrls.LoadDir(o.envoyDir)
		if err != nil {
			return fmt.Errorf("server: envoy config: %w", err)
		}
		ecfg, s.envoyDir = c, o.envoyDir
	}
	s.envoy = envoyrls.New(ecfg, s.guard, envoyrls.WithDecider(s.envoyDecider), envoyrls.WithObserver(s.envoyObserve))

	s.handler = s.routes()
	s.healthy.Store(true)
	s.probe(s.bgCtx)

	s.goBackground(s.blocked.run)
	s.goBackground(s.fleet.run)
	s.goBackground(s.rules.run)
	s.goBackground(s.probeLoop)
	return nil
}

func (s *Server) goBackground(f func(context.Context)) {
	s.bgWG.Add(1)
	go func() {
		defer s.bgWG.Done()
		f(s.bgCtx)
	}()
}

// build compiles a config into a policy over the server's guard, with the
// rules replaced by the run-time replacement if there is one.
func (s *Server) build(cfg *policy.Config) (*policy.Policy, error) {
	eff, err := s.rules.overlay(cfg)
	if err != nil {
		return nil, err
	}
	return policy.New(eff, s.guard, policy.WithObserver(s.observe), policy.WithLogger(s.log))
}

// onSwap is told about every reload of the config file.
func (s *Server) onSwap(old, p *policy.Policy, err error) {
	s.metrics.reload(err == nil)
	if err == nil && p != nil {
		s.rulesChanged(p)
	}
}

// swap puts p in force after a change made through the API or Redis.
func (s *Server) swap(p *policy.Policy) {
	s.holder.Swap(p)
	if s.o.cfgPath == "" {
		// A Holder without a file has no callback: count here.
		s.metrics.reload(true)
		s.rulesChanged(p)
	}
}

// rulesChanged forgets the per-rule data of rules that are gone.
func (s *Server) rulesChanged(p *policy.Policy) {
	keep := map[string]bool{}
	for _, r := range p.Rules() {
		keep[r.Name] = true
	}
	for _, r := range s.envoy.Config().Rules() {
		keep[r.Path] = true
	}
	s.tops.retain(keep)
	s.stats.prune(s.now(), keep)
}

// Policy returns the policy in force.
func (s *Server) Policy() *policy.Policy { return s.holder.Load() }

// InstanceID returns the name of this instance in the fleet view.
func (s *Server) InstanceID() string { return s.id }

// AdminEnabled reports whether the admin API is on (a token is configured).
func (s *Server) AdminEnabled() bool { return s.adminToken != "" }

// Handler returns the HTTP API, the dashboard and the metrics.
func (s *Server) Handler() http.Handler { return s.handler }

// Envoy returns the Envoy rate limit service that the gRPC server serves.
func (s *Server) Envoy() *envoyrls.Service { return s.envoy }

// StoreDescription returns the store type and, for Redis, its topology and
// nodes, as the dashboard shows them: "memory" or "redis standalone
// 127.0.0.1:6379".
func (s *Server) StoreDescription() string { return s.storeInfo().String() }

// Reload re-reads the config file and the Envoy config directory, if the
// server has them, and puts them in force; a bad file is rejected, its
// error returned, and the old rules stay. weir serve calls it on SIGHUP.
func (s *Server) Reload() error {
	var errs []error
	if s.o.cfgPath != "" {
		if err := s.holder.Reload(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.envoyDir != "" {
		c, err := envoyrls.LoadDir(s.envoyDir)
		if err != nil {
			s.metrics.reload(false)
			s.log.Error("weir: envoy config rejected; the old one stays in force", "dir", s.envoyDir, "err", err)
			errs = append(errs, err)
		} else {
			s.envoy.SetConfig(c)
			s.metrics.reload(true)
			s.log.Info("weir: envoy config reloaded", "dir", s.envoyDir, "domains", len(c.Domains()))
		}
	}
	return errors.Join(errs...)
}

// HTTPAddr returns the address the HTTP API will listen on.
func (s *Server) HTTPAddr() string {
	if s.o.httpAddr != nil {
		return *s.o.httpAddr
	}
	if a := s.base.Load().Server.HTTP; a != "" {
		return a
	}
	return DefaultHTTPAddr
}

// GRPCAddr returns the address the gRPC service will listen on, "" for
// none.
func (s *Server) GRPCAddr() string {
	a := ""
	switch {
	case s.o.grpcAddr != nil:
		a = *s.o.grpcAddr
	case s.base.Load().Server.GRPC != "":
		a = s.base.Load().Server.GRPC
	default:
		a = DefaultGRPCAddr
	}
	if a == "off" {
		return ""
	}
	return a
}

// ListenAndServe listens on HTTPAddr and GRPCAddr and serves until ctx
// ends; then it shuts down gracefully, draining in-flight requests for up
// to the shutdown timeout, and returns nil. It returns an error if a port
// cannot be bound or a server fails.
func (s *Server) ListenAndServe(ctx context.Context) error {
	hl, err := net.Listen("tcp", s.HTTPAddr())
	if err != nil {
		return fmt.Errorf("server: HTTP: %w", err)
	}
	var gl net.Listener
	if a := s.GRPCAddr(); a != "" {
		if gl, err = net.Listen("tcp", a); err != nil {
			hl.Close()
			return fmt.Errorf("server: gRPC: %w", err)
		}
	}
	return s.Serve(ctx, hl, gl)
}

// Serve serves HTTP on hl and, if gl is not nil, gRPC on gl until ctx
// ends, then shuts down gracefully as ListenAndServe does.
func (s *Server) Serve(ctx context.Context, hl, gl net.Listener) error {
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	var gs *grpc.Server
	var hlth *health.Server
	if gl != nil {
		gs = grpc.NewServer(grpcOptions()...)
		hlth = envoyrls.RegisterGRPC(gs, s.envoy)
	}
	s.mu.Lock()
	s.httpSrv, s.grpcSrv, s.grpcHlth = hs, gs, hlth
	s.mu.Unlock()

	errc := make(chan error, 2)
	go func() {
		if err := hs.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("server: HTTP: %w", err)
		}
	}()
	if gs != nil {
		go func() {
			if err := gs.Serve(gl); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("server: gRPC: %w", err)
			}
		}()
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	timeout := s.o.shutdownTimeout
	if timeout <= 0 {
		timeout = DefaultShutdownTimeout
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil && serveErr == nil {
		serveErr = err
	}
	return serveErr
}

// Shutdown stops accepting connections, waits until in-flight HTTP and
// gRPC requests finish or ctx ends, then stops the background work and
// closes the store connections New opened.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	hs, gs, hlth := s.httpSrv, s.grpcSrv, s.grpcHlth
	s.mu.Unlock()
	var errs []error
	if hlth != nil {
		hlth.Shutdown() // NOT_SERVING, so that balancers move away
	}
	var wg sync.WaitGroup
	if gs != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() { gs.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				gs.Stop()
			}
		}()
	}
	if hs != nil {
		if err := hs.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("server: HTTP shutdown: %w", err))
			hs.Close()
		}
	}
	wg.Wait()
	s.Close()
	return errors.Join(errs...)
}

// Close stops the background work and closes the store connections New
// opened, without waiting for requests. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.bgCancel()
		s.bgWG.Wait()
		s.fleet.withdraw()
		s.owned()
	})
	return nil
}

func breakerValue(st policy.BreakerState) float64 {
	switch st {
	case policy.BreakerHalfOpen:
		return 1
	case policy.BreakerOpen:
		return 2
	}
	return 0
}
