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
//	GET    /healthz, /readyz      liveness, and readiness (this instance answers; 503 once shutting down)
//	GET    /healthz/store         whether the store answers (200 or 503), for alerts, never for readiness
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/buildinfo"
	"github.com/weir-dev/weir/internal/resp"
	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/internal/tlsfiles"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/denycache"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/redisstore"
	"github.com/weir-dev/weir/weirotel"
)

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

// DefaultShutdownDelay is how long weir serve keeps serving, unready, once
// told to stop, so that load balancers take it out of rotation before its
// listeners close. A Server's own default is 0 (see WithShutdownDelay).
const DefaultShutdownDelay = 5 * time.Second

// An Option configures New.
type Option func(*options)

type options struct {
	cfg             *config.Config
	cfgPath         string
	store           weir.Store
	redis           *redisstore.Store
	redisURL        string
	storeTimeout    time.Duration  // WithStoreTimeout
	redisTLS        *redisTLSFiles // WithRedisTLS
	envoyCfg        *envoyrls.Config
	envoyDir        string
	envoyAwait      bool // /healthcheck fails until SetEnvoyConfig (envoyhealth.go)
	tlsGRPCOnly     bool // WithTLSOnGRPCOnly (envoyhealth.go)
	envoyMetadata   bool
	envoyReserve    bool
	envoySettings   EnvoySettings
	log             *slog.Logger
	adminToken      *string
	adminTokenEnv   string
	lookupEnv       func(string) (string, bool)
	instanceID      string
	version         string
	httpAddr        *string
	grpcAddr        *string
	respAddr        *string
	respToken       *string
	tls             *config.ServerTLSConfig
	tracing         *weirotel.Tracing
	shutdownTimeout time.Duration
	shutdownDelay   time.Duration
	now             func() time.Time

	// Intervals of the background loops; tests shorten them.
	fleetEvery time.Duration
	spendEvery time.Duration // how often settlements go to the fleet's spend ranking
	rulesEvery time.Duration
	probeEvery time.Duration
	// Event delivery's timing (events.go); zero: the Deliverer's defaults.
	eventPoll, webhookTimeout, webhookBackoff time.Duration
}

// WithConfig makes the server use cfg (from policy.Parse or built in Go).
// Without WithConfig or WithConfigFile the server runs DemoConfig, unless
// an Envoy config is given (WithEnvoyConfig, WithEnvoyConfigDir): then it
// runs no rules of its own.
func WithConfig(cfg *config.Config) Option { return func(o *options) { o.cfg = cfg } }

// WithConfigFile loads weir.yaml from path and reloads it whenever it
// changes (and on Reload); a bad new file is rejected and logged, and the
// old rules stay in force. With WithConfig too, cfg is used for the first
// policy instead of the file's first content (so a caller can adjust it,
// as weir serve does with --redis), and reloads read the file.
func WithConfigFile(path string) Option { return func(o *options) { o.cfgPath = path } }

// WithStore makes the server keep limiter state in store instead of the
// one the config's store section describes. The server does not close it,
// and takes it as it is: no deny cache in front (it may not be shared),
// the guard's deadline on every call, reservations in memory. A Redis
// store goes through WithRedisStore.
func WithStore(store weir.Store) Option { return func(o *options) { o.store, o.redis = store, nil } }

// WithRedisStore makes the server keep limiter state in rs instead of the
// store the config's store section describes, as the Redis store it
// would have opened: the server does not close it, and sends its own keys
// (stored rules, fleet view, penalty-box index, reservations) over rs's
// client (redisstore.Store.Client), named after the config's
// store.redis.prefix: give it the prefix of rs's Config.
func WithRedisStore(rs *redisstore.Store) Option {
	return func(o *options) { o.store, o.redis = nil, rs }
}

// WithRedisURL makes the server keep its state in Redis at url (the syntax
// of redisstore.ParseURL), overriding the config's store section.
func WithRedisURL(url string) Option { return func(o *options) { o.redisURL = url } }

// WithStoreTimeout sets the deadline of every store call, overriding the
// config's store.timeout (d > 0).
func WithStoreTimeout(d time.Duration) Option { return func(o *options) { o.storeTimeout = d } }

// redisTLSFiles are WithRedisTLS's settings.
type redisTLSFiles struct {
	ca, cert, key string
	anyName       bool
}

// WithRedisTLS sets the Redis store's TLS files, overriding the config's
// store.redis.tls_ca, tls_cert and tls_key where not empty: the CA the
// servers' certificates must chain to, and the client certificate and
// key. Any of them turns TLS on. anyName verifies the servers'
// certificates against the CA but not their names (envoyproxy/ratelimit's
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
func WithRedisTLS(ca, cert, key string, anyName bool) Option {
	return func(o *options) { o.redisTLS = &redisTLSFiles{ca: ca, cert: cert, key: key, anyName: anyName} }
}

// WithEnvoyConfig serves cfg on the gRPC ShouldRateLimit service and on
// POST /v1/check for Envoy-style bodies.
func WithEnvoyConfig(cfg *envoyrls.Config) Option { return func(o *options) { o.envoyCfg = cfg } }

// WithEnvoyConfigDir loads envoyproxy/ratelimit YAML files from dir (see
// envoyrls.LoadDir), and reloads them when they change and on Reload.
func WithEnvoyConfigDir(dir string) Option { return func(o *options) { o.envoyDir = dir } }

// WithEnvoyDynamicMetadata makes Envoy rate limit responses carry dynamic
// metadata (envoyrls.WithDynamicMetadata).
func WithEnvoyDynamicMetadata(on bool) Option { return func(o *options) { o.envoyMetadata = on } }

// WithEnvoyReserve honours the reserve: of Envoy descriptors: the request
// path reserves, the response path settles (envoyrls.WithReservations),
// with the reservations of POST /v1/reserve's store. Without it, a
// configuration with reserve: is refused.
func WithEnvoyReserve(on bool) Option { return func(o *options) { o.envoyReserve = on } }

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
//   - Bounds on what one connection can make the server hold or do: a
//     request message of at most grpcMaxRecv bytes (a call at the
//     envoyrls bounds of descriptors and entries is far smaller; a bigger
//     one is refused with ResourceExhausted before it is decoded), at most
//     grpcMaxStreams calls at once (a client past that waits, or opens
//     another connection as Envoy does), and headers of at most
//     grpcMaxHeaders bytes.
func grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.NumStreamWorkers(grpcStreamWorkers),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		grpc.MaxRecvMsgSize(grpcMaxRecv),
		grpc.MaxConcurrentStreams(grpcMaxStreams),
		grpc.MaxHeaderListSize(grpcMaxHeaders),
		// Envoy's requests and their responses without protobuf's
		// reflection; every other message as gRPC's proto codec does it.
		envoyrls.CodecOption(),
	}
}

const (
	grpcStreamWorkers = 256       // calls in flight served by pooled goroutines; more get their own
	grpcWindow        = 1 << 20   // bytes; fixed, which turns off the BDP estimator
	grpcMaxRecv       = 256 << 10 // bytes in one request message
	grpcMaxStreams    = 256       // calls at once on one connection, as many as the pooled workers
	grpcMaxHeaders    = 64 << 10  // bytes of request headers
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

// WithVersion sets the version the snapshot and weir_build_info report
// (default: the version the build stamped into the binary).
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

// WithShutdownDelay makes ListenAndServe and Serve, once their context
// ends, first go unready (/readyz answers 503, gRPC health NOT_SERVING,
// HTTP responses ask clients to close their connections) and keep serving
// for d, so that load balancers and Kubernetes endpoints stop sending new
// requests, before they stop accepting and drain. The delay counts
// towards the shutdown timeout. Default 0; weir serve uses
// DefaultShutdownDelay.
func WithShutdownDelay(d time.Duration) Option { return func(o *options) { o.shutdownDelay = d } }

// Server is the rate-limit service. Build it with New; serve it with
// ListenAndServe or Serve, or mount Handler in a server of your own and
// call Close when done.
type Server struct {
	o       options
	log     *slog.Logger
	now     func() time.Time
	id      string
	version string

	base   atomic.Pointer[config.Config] // the config file's (or WithConfig's) content
	holder *policy.Holder
	// evCfg is the events config in force (events.go); evCounters its metrics.
	evCfg      evCfgPointer
	evCounters *eventCounters
	// The store stack (composeStore): every decision enters at stack.
	stack weir.Store        // deny cache → guard → tracing → store
	deny  *denycache.Store  // the deny cache in front of a Redis store; nil without
	guard *guard.Guard      // deadline, circuit breaker, on_error fallback
	store weir.Store        // the store at the bottom: redis, memory or the caller's
	redis *redisstore.Store // the store when it is Redis; nil otherwise
	mem   bool              // the store is the memstore openStore opened
	owned func()            // closes what New opened
	info  atomic.Pointer[storeInfo]
	rdb   rueidis.Client // the Redis store's client; nil without Redis
	resv  reservations   // POST /v1/reserve's open reservations
	keys  redisKeys      // the names of the service's own keys in Redis

	envoy      *envoyrls.Service
	envoyDir   string
	envoyState envoyState // reloads of envoyDir (envoywatch.go)

	tls *tlsfiles.Source // the listeners' certificate; nil for plaintext

	adminToken string
	adminEnv   string
	auth       *adminAuth
	redact     *redactor

	metrics *metrics
	stats   *stats
	tops    *topSet
	spend   *spendBook // the settled cost per rule and identity in its period (GET /v1/spend)
	blocked *blockedIndex
	fleet   *fleet
	leases  *localbudget.Table // local budgets (local_budget: N), shared by every policy
	rules   *ruleSync

	healthy      atomic.Bool
	lastStoreErr atomic.Int64 // UnixNano of the last probe the store failed; 0 if none
	draining     atomic.Bool  // shutting down: /readyz answers 503
	envoyLoaded  atomic.Bool  // SetEnvoyConfig has given a config (envoyhealth.go)
	lastFallbk   atomic.Pointer[fallbackSeen]

	handler http.Handler

	bgCtx    context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup

	mu        sync.Mutex
	httpSrv   *http.Server
	grpcSrv   *grpc.Server
	grpcHlth  *health.Server
	respSrv   *resp.Server
	closeOnce sync.Once

	stopping     chan struct{} // closed when Shutdown starts
	shutdownOnce sync.Once
	shutdownErr  error
}

// New builds a Server: it opens the store, compiles the rules and starts
// the background work (config watching, fleet counters, store health probes).
// It listens on nothing until ListenAndServe or Serve.
func New(opts ...Option) (*Server, error) {
	o := options{
		log:        slog.Default(),
		version:    buildinfo.Read().Short(),
		now:        time.Now,
		fleetEvery: time.Second,
		spendEvery: time.Second,
		rulesEvery: 500 * time.Millisecond,
		probeEvery: 2 * time.Second,
	}
	for _, f := range opts {
		f(&o)
	}
	s := &Server{o: o, log: o.log, now: o.now, version: o.version, owned: func() {}, stopping: make(chan struct{})}
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
	cfg, err := s.o.config()
	if err != nil {
		return err
	}
	s.base.Store(cfg)
	s.keys = keysFor(cfg.Store.Redis.Prefix)
	if err := s.initTLS(cfg); err != nil {
		return err
	}

	if err := s.openStore(cfg); err != nil {
		return err
	}
	s.metrics = newMetrics(func() float64 { return breakerValue(s.guard.State()) }, s.protectStats)
	s.metrics.buildInfo(s.version)
	s.evCounters = newEventCounters(s.metrics.reg)
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "weir_store_up",
		Help: "1 while the store answers the health probe (every 2s and on GET /healthz/store), 0 while it does not; alert on it, never take instances out of rotation for it.",
	}, func() float64 {
		if s.healthy.Load() {
			return 1
		}
		return 0
	}))
	if err := s.composeStore(cfg); err != nil {
		return err
	}
	s.stats = newStats()
	s.tops = newTopSet(topK)
	s.spend = newSpendBook()
	s.blocked = newBlockedIndex(s.rdb, s.keys.blocked, s.log, s.now)
	s.fleet = newFleet(s)
	s.leases = localbudget.New(localbudget.Config{Now: s.now})
	s.metrics.leases(s.leases, s.instances)
	s.rules = newRuleSync(s)

	s.initAdminToken(cfg)
	if err := s.initPolicy(cfg); err != nil {
		return err
	}
	if err := s.initEnvoy(); err != nil {
		return err
	}

	s.handler = s.protectHandler(s.routes())
	s.healthy.Store(true)
	s.probe(s.bgCtx)

	s.goBackground(s.blocked.run)
	s.goBackground(s.fleet.run)
	s.goBackground(s.spendLoop)
	s.goBackground(s.rules.run)
	s.goBackground(s.probeLoop)
	s.goBackground(s.overrideRefreshLoop)
	s.goBackground(s.eventLoop)
	s.goBackground(s.sweepLoop)
	return nil
}

// config returns the config the server starts with: the caller's (copied), the
// file's, or the demo, with --redis applied.
func (o *options) config() (*config.Config, error) {
	cfg := o.cfg
	if cfg != nil {
		c := *cfg // New adjusts the store section; the caller's copy stays as it is
		cfg = &c
	}
	if cfg == nil && o.cfgPath != "" {
		c, err := policy.LoadFile(o.cfgPath)
		if err != nil {
			return nil, fmt.Errorf("server: config: %w", err)
		}
		cfg = c
	}
	if cfg == nil {
		src, name := DemoConfig, "built-in demo config"
		if !o.demo() {
			src, name = envoyOnlyConfig, "built-in config for Envoy rules only"
		}
		c, err := policy.Parse([]byte(src), name)
		if err != nil {
			return nil, fmt.Errorf("server: the %s is invalid: %w", name, err)
		}
		cfg = c
	}
	if err := o.applyStore(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// initAdminToken reads the admin token (option, else the environment variable
// the option or the config names) and sets up the admin authenticator.
func (s *Server) initAdminToken(cfg *config.Config) {
	o := &s.o
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
	s.adminToken = normalizeAdminToken(s.adminToken)
	if n := len(s.adminToken); n > 0 && n < minAdminToken {
		s.log.Warn("weir: the admin token is short; use a random secret of at least 16 bytes", "env", s.adminEnv, "bytes", n)
	}
	s.auth = newAdminAuth(s.adminToken, s.metrics.reg, s.now)
	s.redact = newRedactor()
}

// initPolicy builds the first policy and, with a config file, watches it. A
// replacement stored in Redis wins over the file's rules.
func (s *Server) initPolicy(cfg *config.Config) error {
	o := &s.o
	if err := s.rules.loadInitial(s.bgCtx); err != nil {
		s.log.Warn("weir: could not read the rules stored in Redis; using the config's", "err", err)
	}
	if o.cfgPath == "" {
		p, err := s.build(cfg)
		if err != nil {
			return fmt.Errorf("server: config: %w", err)
		}
		s.holder = policy.NewHolder(p)
		return nil
	}
	first := true
	h, err := policy.Watch(s.bgCtx, o.cfgPath, func(fileCfg *config.Config) (*policy.Policy, error) {
		if first && o.cfg != nil {
			first = false
			return s.build(cfg) // the caller's adjusted copy of the file
		}
		first = false
		if err := o.applyStore(fileCfg); err != nil {
			return nil, err
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
	return nil
}

// initEnvoy sets up the Envoy rate limit service from the options' config or
// directory.
func (s *Server) initEnvoy() error {
	o := &s.o
	ecfg := o.envoyCfg
	if o.envoyDir != "" {
		c, sum, err := s.loadEnvoyDir(o.envoyDir)
		if err != nil {
			return fmt.Errorf("server: envoy config: %w", err)
		}
		ecfg, s.envoyDir = c, o.envoyDir
		s.envoyState.lastSum = sum
		s.envoyState.lastOK.Store(time.Now().Unix())
	}
	maxOverride := s.base.Load().Server.EnvoyMaxOverridePeriod
	if maxOverride == 0 {
		maxOverride = defaultEnvoyMaxOverride
	}
	s.envoy = envoyrls.New(ecfg, s.stack, append(s.envoyServiceOptions(), envoyrls.WithFallbackDecider(s.envoyDecider),
		envoyrls.WithObserver(s.envoyObserve), envoyrls.WithMaxOverridePeriod(maxOverride), envoyrls.WithDynamicMetadata(s.o.envoyMetadata), s.envoyReservations())...)
	s.registerEnvoyMetrics()
	if s.envoyDir != "" {
		s.startEnvoyWatch()
	}
	return nil
}

// defaultEnvoyMaxOverride is server.envoy_max_override_period's default:
// an Envoy limit override lasts at most a day, so that whoever reaches the
// service cannot fill the store with counters that last a year.
const defaultEnvoyMaxOverride = 24 * time.Hour

// redisLoop runs work every period until ctx ends (once at the start too
// when first is set). A streak of failures logs two lines (failLog): warn
// at the first, back at the first success after it, with how many it did
// not log. Without Redis it returns at once.
func (s *Server) redisLoop(ctx context.Context, period time.Duration, first bool, work func(context.Context) error, warn, back string) {
	if s.rdb == nil {
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	fl := &failLog{warn: warn, back: back}
	for {
		if first {
			err := work(ctx)
			switch {
			case err == nil:
				fl.ok(s.log, time.Now())
			case ctx.Err() == nil:
				fl.fail(s.log, time.Now(), err)
			}
		}
		first = true
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
func (s *Server) build(cfg *config.Config) (*policy.Policy, error) {
	eff, err := s.rules.overlay(cfg)
	if err != nil {
		return nil, err
	}
	if err := CheckConfig(eff, s.o.cfgPath); err != nil {
		return nil, err
	}
	p, err := policy.New(eff, s.stack, policy.WithGuard(s.guard), policy.WithObserver(s.observe), policy.WithLogger(s.log),
		policy.WithLocalBudgets(s.leases), policy.WithInstances(s.fleet.count))
	if err != nil {
		return nil, err
	}
	if err := s.applyEvents(eff); err != nil {
		return nil, err
	}
	return p, nil
}

// instances is the instance count the policy in force divides by (0
// before there is one).
func (s *Server) instances() int {
	if s.holder == nil {
		return 0
	}
	if p := s.holder.Load(); p != nil {
		return p.Instances()
	}
	return 0
}

// onSwap is told about every reload of the config file.
func (s *Server) onSwap(old, p *policy.Policy, err error) {
	s.metrics.reload(err == nil)
	if err == nil && p != nil {
		s.rulesChanged(p)
	}
}

// update changes the run-time rules with change, then rebuilds the policy
// from the config and those rules and puts it in force. Both happen under
// the holder's lock, which file reloads (watch, SIGHUP, Reload) hold from
// reading the file to the swap, so every path that changes the rules (the
// file, PUT and DELETE /v1/rules, the Redis poll) is serialized: the
// policy in force always reflects the latest file and the latest
// replacement. If the build fails, the change of the rules is undone (the
// version seen excepted) and the old policy stays.
func (s *Server) update(change func() error) (*policy.Policy, error) {
	p, err := s.holder.Update(func(*policy.Policy) (*policy.Policy, error) {
		rs := s.rules
		rs.mu.Lock()
		raw, cfg, present := rs.raw, rs.cfg, rs.present
		rs.mu.Unlock()
		if err := change(); err != nil {
			return nil, err
		}
		p, err := s.build(s.base.Load())
		if err != nil {
			rs.mu.Lock()
			rs.raw, rs.cfg, rs.present = raw, cfg, present
			rs.mu.Unlock()
			return nil, err
		}
		return p, nil
	})
	if err != nil {
		return nil, err
	}
	if s.o.cfgPath == "" {
		// A Holder without a file has no callback: count here.
		s.metrics.reload(true)
		s.rulesChanged(p)
	}
	return p, nil
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
	s.spend.retain(keep)
	s.stats.prune(s.now(), keep)
	s.flushDenyCache()
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
		if err := s.reloadEnvoy(true); err != nil {
			errs = append(errs, err)
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
	if a == config.GRPCOff {
		return ""
	}
	return a
}

// ListenAndServe listens on HTTPAddr and GRPCAddr and serves until ctx
// ends; then it shuts down gracefully and returns nil: unready while still
// serving for the shutdown delay (WithShutdownDelay), then it stops
// accepting and drains in-flight requests, all within the shutdown
// timeout. It returns an error if a port
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
	if a := s.RESPAddr(); a != "" {
		rl, err := net.Listen("tcp", a)
		if err == nil {
			err = s.ServeRESP(rl)
		}
		if err != nil {
			hl.Close()
			if gl != nil {
				gl.Close()
			}
			return fmt.Errorf("server: RESP: %w", err)
		}
	}
	return s.Serve(ctx, hl, gl)
}

// Serve serves HTTP on hl and, if gl is not nil, gRPC on gl until ctx
// ends, then shuts down gracefully as ListenAndServe does.
func (s *Server) Serve(ctx context.Context, hl, gl net.Listener) error {
	hs := &http.Server{
		Handler:           s.closeWhenDraining(s.handler),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	if s.tls != nil && !s.o.tlsGRPCOnly {
		hs.TLSConfig = s.httpTLS()
	}
	var gs *grpc.Server
	var hlth *health.Server
	if gl != nil {
		gopts := grpcOptions()
		if s.o.tracing != nil {
			// Traced first, so that a call protection refuses has its span.
			gopts = append(gopts, grpc.ChainUnaryInterceptor(s.traceGRPC))
		}
		gopts = append(gopts, grpc.ChainUnaryInterceptor(s.protectUnary))
		if s.tls != nil {
			gopts = append(gopts, grpc.Creds(credentials.NewTLS(s.grpcTLS())))
		}
		gs = grpc.NewServer(gopts...)
		hlth = envoyrls.RegisterGRPC(gs, s.envoy)
	}
	s.mu.Lock()
	s.httpSrv, s.grpcSrv, s.grpcHlth = hs, gs, hlth
	s.mu.Unlock()

	errc := make(chan error, 2)
	go func() {
		serve := hs.Serve
		if s.tls != nil && !s.o.tlsGRPCOnly {
			serve = func(l net.Listener) error { return hs.ServeTLS(l, "", "") }
		}
		if err := serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
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
	if serveErr == nil && s.o.shutdownDelay > 0 {
		// Unready first, still serving, so that balancers move away
		// before the listeners close.
		s.unready()
		s.log.Info("weir: shutting down: unready, serving for the shutdown delay before draining", "delay", s.o.shutdownDelay.String(), "timeout", timeout.String())
		t := time.NewTimer(s.o.shutdownDelay)
		select {
		case <-t.C:
		case <-sctx.Done():
		case <-s.stopping: // Shutdown called directly
		case serveErr = <-errc:
		}
		t.Stop()
	}
	if err := s.Shutdown(sctx); err != nil && serveErr == nil {
		serveErr = err
	}
	return serveErr
}

// unready makes the instance report itself unready: /readyz answers 503,
// gRPC health NOT_SERVING, and HTTP responses close their connections
// (closeWhenDraining).
func (s *Server) unready() {
	s.mu.Lock()
	hlth := s.grpcHlth
	s.mu.Unlock()
	if hlth != nil {
		hlth.Shutdown() // NOT_SERVING, so that balancers move away
	}
	// After gRPC health: whoever sees /readyz fail sees gRPC unready too.
	s.draining.Store(true)
}

// closeWhenDraining answers with "Connection: close" once the server is
// shutting down, so that a client opens its next connection elsewhere
// instead of reusing this one. (http.Server.SetKeepAlivesEnabled(false)
// would also close the idle connections at once, racing with clients
// that are about to send on them: those requests would be lost.)
func (s *Server) closeWhenDraining(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// Shutdown stops accepting connections, waits until in-flight HTTP and
// gRPC requests finish or ctx ends, then stops the background work and
// closes the store New opened. It goes unready at once, with
// no shutdown delay (Serve applies that before calling it). Later calls
// wait for the first and return its result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		close(s.stopping)
		s.shutdownErr = s.shutdown(ctx)
	})
	return s.shutdownErr
}

func (s *Server) shutdown(ctx context.Context) error {
	s.mu.Lock()
	hs, gs, hlth := s.httpSrv, s.grpcSrv, s.grpcHlth
	s.mu.Unlock()
	var errs []error
	s.draining.Store(true)
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
	if err := s.shutdownRESP(ctx); err != nil {
		errs = append(errs, err)
	}
	wg.Wait()
	s.Close()
	return errors.Join(errs...)
}

// Close stops the background work and closes the store connections New
// opened, without waiting for requests. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		rs := s.respSrv
		s.mu.Unlock()
		if rs != nil {
			rs.Close()
		}
		s.bgCancel()
		s.bgWG.Wait()
		s.fleet.withdraw()
		_ = s.flushSpend(context.Background())
		s.owned()
	})
	return nil
}

func breakerValue(st guard.BreakerState) float64 {
	switch st {
	case guard.BreakerHalfOpen:
		return 1
	case guard.BreakerOpen:
		return 2
	}
	return 0
}

// composeStore builds the stack every decision of weir serve goes
// through, in this one place, cheapest answer first:
//
//	deny cache (Redis only) → guard → tracing → store
//
// The deny cache answers certain denials from memory, so they never reach
// the guard's breaker nor cost a span; a miss goes through the guard
// (deadline, circuit breaker) and the tracing wrapper to the store. On a
// store error the policy's on_error fallback decides through the guard
// (policy.WithGuard). Each piece is a weir.Store of two methods; what one
// needs of another (the store's own deadline, its refund notifications)
// is passed here from the concrete store openStore kept, never
// discovered.
func (s *Server) composeStore(cfg *config.Config) error {
	gc := guard.Config{
		Timeout:    cfg.Store.Timeout,
		Breaker:    cfg.Store.Breaker,
		Logger:     s.log,
		Now:        s.now,
		NoDeadline: s.mem, // memstore never waits
	}
	if s.redis != nil {
		gc.StoreTimeout = s.redis.Timeout() // its own deadline per call
	}
	s.guard = guard.New(s.o.tracing.Store(s.store), gc)
	s.stack = s.guard
	if s.redis == nil || !cfg.Store.DenyCacheOn() {
		return nil
	}
	rs := s.redis
	bus := denycache.NewRedisBus(rs.Client(), denycache.RedisBusConfig{Channel: s.keys.denyCache, Logger: s.log})
	d, err := denycache.New(s.guard, denycache.Config{Size: cfg.Store.DenyCacheSize, Bus: bus, Logger: s.log, Timeout: rs.Timeout(), OnRefund: rs.OnRefund})
	if err != nil {
		return fmt.Errorf("server: store.deny_cache: %w", err)
	}
	s.deny, s.stack = d, d
	prev := s.owned
	s.owned = func() { d.Close(); prev() }
	s.metrics.reg.MustRegister(denyCacheCollector{d})
	return nil
}
