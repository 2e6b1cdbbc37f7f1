package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/weir-dev/weir/internal/otelsetup"
	"github.com/weir-dev/weir/internal/server"
)

func init() {
	register("serve", "run the rate-limit service: HTTP API, proxy auth, Envoy gRPC, dashboard", runServe)
}

// envPrefix starts the environment variable of every serve flag:
// --redis is WEIR_REDIS, --envoy-config is WEIR_ENVOY_CONFIG.
const envPrefix = "WEIR_"

// envName returns the environment variable that can set flag name.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// serveFlags are weir serve's settings.
type serveFlags struct {
	config, envoyConfig, http, grpc, redis string
	adminTokenEnv, instanceID              string
	resp, respToken                        string
	tlsCert, tlsKey, tlsClientCA           string
	redisTLSCA, redisTLSCert, redisTLSKey  string
	redisTLSAnyName                        bool
	storeTimeout                           time.Duration
	logLevel, logFormat                    string
	pprof                                  string
	shutdownTimeout, shutdownDelay         time.Duration
	refuseRoot                             bool
	compatFlags                            // envoyxds.go
	envoyDynamicMetadata                   bool
	envoyReserve                           bool
	envoy                                  envoyServeFlags // serve_envoy.go
}

func newServeFlagSet(stderr io.Writer) (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("weir serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &serveFlags{}
	fs.StringVar(&f.config, "config", "", "weir.yaml with the store, rules and server settings; reloaded when it changes and on SIGHUP (default: built-in demo rules on the memory store)")
	fs.StringVar(&f.envoyConfig, "envoy-config", "", "directory of envoyproxy/ratelimit YAML files to serve over gRPC ShouldRateLimit and POST /v1/check; reloaded when a file in it changes and on SIGHUP")
	fs.StringVar(&f.http, "http", "", `HTTP listen address for the API, /v1/auth, metrics and the dashboard (default: server.http in the config, else ":8080")`)
	fs.StringVar(&f.grpc, "grpc", "", `gRPC listen address for Envoy's rate limit service and gRPC health, or "off" (default: server.grpc in the config, else ":8081")`)
	fs.StringVar(&f.redis, "redis", "", "keep state in Redis at this URL instead of what the config says (its store.redis prefix and tuning stay): redis://[user:pass@]host:port/db, rediss://..., redis+sentinel://host:port,host:port/master, or host:port,host:port,... (or redis[s]://[user:pass@]host:port,host:port,...) for a cluster")
	fs.DurationVar(&f.storeTimeout, "store-timeout", 0, "deadline of every store call, after which on_error decides (default: store.timeout in the config, else 50ms)")
	fs.StringVar(&f.redisTLSCA, "redis-tls-ca", "", "PEM CA bundle Redis's certificates must chain to; turns TLS to Redis on (default: store.redis.tls_ca in the config)")
	fs.StringVar(&f.redisTLSCert, "redis-tls-cert", "", "PEM client certificate to present to Redis, with --redis-tls-key; turns TLS to Redis on (default: store.redis.tls_cert in the config)")
	fs.StringVar(&f.redisTLSKey, "redis-tls-key", "", "PEM private key of --redis-tls-cert (default: store.redis.tls_key in the config)")
	fs.BoolVar(&f.redisTLSAnyName, "redis-tls-skip-hostname-verification", false, "check that Redis's certificate chains to the CA, but not its name (envoyproxy/ratelimit's REDIS_TLS_SKIP_HOSTNAME_VERIFICATION)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate (chain) for the HTTP and gRPC listeners, which then speak TLS only; re-read when the file changes (default: server.tls.cert in the config)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key of --tls-cert, re-read with it (default: server.tls.key in the config)")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "PEM CA bundle: require client certificates that chain to it (mutual TLS) on both listeners (default: server.tls.client_ca in the config)")
	fs.StringVar(&f.resp, "resp", "", `Redis-protocol listen address for CL.THROTTLE, GCRA and WEIR.CHECK, e.g. ":6380", or "off" (default: server.resp.addr in the config, else none)`)
	fs.StringVar(&f.respToken, "resp-token", "", "token RESP clients must give with AUTH; set it through the environment rather than the command line (default: server.resp.token in the config, else none)")
	fs.StringVar(&f.adminTokenEnv, "admin-token-env", "", "name of the environment variable holding the admin API's bearer token (default: server.admin_token_env in the config, else WEIR_ADMIN_TOKEN); without a token the admin API is off")
	fs.StringVar(&f.instanceID, "instance-id", "", "this instance's name in the dashboard's fleet view (default: hostname-pid)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&f.pprof, "pprof", "", `serve Go's profiler (/debug/pprof/) on this address, e.g. "127.0.0.1:6060"; off by default, never on a public address`)
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", server.DefaultShutdownTimeout, "on SIGTERM or SIGINT, how long the whole shutdown may take (the delay, then letting in-flight requests finish)")
	fs.DurationVar(&f.shutdownDelay, "shutdown-delay", server.DefaultShutdownDelay, "on SIGTERM or SIGINT, how long to keep serving while unready (/readyz 503, gRPC health NOT_SERVING) before closing the listeners, so that load balancers stop sending first; 0 closes at once")
	fs.BoolVar(&f.envoyReserve, "envoy-reserve", false, "honour reserve: on Envoy descriptors: the request path takes the estimate and answers a reservation id (dynamic metadata weir_reservation); the response path brings it back as a descriptor entry and settles the actual cost")
	fs.BoolVar(&f.envoyDynamicMetadata, "envoy-dynamic-metadata", false, "return dynamic metadata on every Envoy rate limit response (domain, descriptors, the metadata: of the descriptors that passed), as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA=true")
	fs.BoolVar(&f.refuseRoot, "refuse-root", false, "exit with an error instead of serving when the effective user is root (uid 0); the container image sets it")
	addCompatFlags(fs, &f.compatFlags)
	addEnvoyFlags(fs, &f.envoy)
	// Every flag's help names its environment variable.
	fs.VisitAll(func(fl *flag.Flag) { fl.Usage += " [$" + envName(fl.Name) + "]" })
	fs.Usage = func() {
		w := fs.Output() // stderr, or stdout for -h
		fmt.Fprint(w, `Usage: weir serve [flags]

Runs the rate-limit service. With no flags it starts on the in-memory store
with built-in demo rules: HTTP on :8080 (API and dashboard at /) and gRPC on
:8081, and prints where to look.

  POST /v1/check               decide {"rule","key","hits"}, or Envoy-style {"domain","descriptors"}
  GET  /v1/auth                nginx auth_request, Traefik ForwardAuth, Caddy forward_auth (?status=429)
  GET  /v1/rules, /v1/top      the rules in force; the most limited identities
  GET  /v1/dashboard/snapshot  the dashboard's data
  GET  /metrics, /healthz, /readyz, /healthz/store
  GET  /openapi.json           the API's OpenAPI 3 document
  /v1/state, /v1/blocked, PUT/DELETE /v1/rules   the admin API (Authorization: Bearer $WEIR_ADMIN_TOKEN)

SIGHUP reloads the config files. SIGTERM and SIGINT make the instance unready
(/readyz 503, gRPC health NOT_SERVING) while it keeps serving for
--shutdown-delay, then close the listeners, let in-flight HTTP and gRPC
requests finish, and exit 0, all within --shutdown-timeout. /readyz does not
follow the store (a Redis outage leaves every instance ready, answering by
on_error); /healthz/store and the weir_store_up metric do.

Every flag can also be set by an environment variable: WEIR_ and the flag's
name in capitals with '-' as '_' (--redis is WEIR_REDIS). A flag on the
command line wins over its variable.

Traces: OpenTelemetry, off unless the standard OTEL_* variables ask for it
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf or
grpc, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...): a span per check, a
child span per store call, W3C trace context from the callers.

Flags:
`)
		fs.PrintDefaults()
		fmt.Fprint(w, `
Examples:
  weir serve
  weir serve --config weir.yaml --redis redis://127.0.0.1:6379
  WEIR_ADMIN_TOKEN=s3cret weir serve --config weir.yaml --envoy-config /etc/ratelimit/config
  weir serve --tls-cert /etc/weir/tls.crt --tls-key /etc/weir/tls.key --tls-client-ca /etc/weir/ca.crt
`)
	}
	return fs, f
}

// applyEnv sets every flag not given on the command line from its
// environment variable, if that is set.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	var errs []error
	fs.VisitAll(func(fl *flag.Flag) {
		if given[fl.Name] {
			return
		}
		name := envName(fl.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if err := fs.Set(fl.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("environment variable %s=%q: %v", name, v, err))
		}
	})
	return errors.Join(errs...)
}

func runServe(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return serve(ctx, args, stdout, stderr, os.LookupEnv, hup)
}

// serve runs weir serve until ctx ends; every value on reload asks for a
// reload of the config files.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer, lookup func(string) (string, bool), reload <-chan os.Signal) int {
	f, log, code := parseServeArgs(args, stdout, stderr, lookup)
	if f == nil {
		return code
	}
	if _, set := lookup("GOGC"); !set {
		// The service's heap is small and its allocation rate high: a
		// GC target of 400% halves GC work (and the goroutine stacks it
		// shrinks and requests regrow) for a few MB. GOGC still wins.
		debug.SetGCPercent(400)
	}
	jsonLog := f.logFormat == "json"
	if jsonLog {
		defer grpcLogs.toSlog(log, lookup)() // grpclog.go
	}
	fail := func(msg string) int {
		failure(stderr, log, jsonLog, msg)
		return 1
	}
	opts := serverOptions(f, log, lookup)
	otelsetup.LogErrors(log) // exporter errors, through slog and rate-limited
	copts, err := compatOptions(&f.compatFlags, f.envoyConfig)
	if err != nil {
		failure(stderr, log, jsonLog, errText(err))
		return 2
	}
	opts = append(opts, copts...)
	tracing, shutdownTracing, err := otelsetup.FromEnv(ctx, lookup)
	if err != nil {
		return fail(errText(err))
	}
	if tracing != nil {
		opts = append(opts, server.WithTracing(tracing))
		defer func() {
			// Flush the last spans, briefly: the process is leaving.
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdownTracing(sctx); err != nil {
				log.Warn("weir serve: flushing traces", "err", err)
			}
		}()
		log.Info("weir serve: tracing to OpenTelemetry (OTEL_* environment)")
	}
	srv, err := server.New(opts...)
	if err != nil {
		return fail(errText(err))
	}
	if f.pprof != "" {
		ps, err := startPprof(f.pprof)
		if err != nil {
			srv.Close()
			return fail(fmt.Sprintf("--pprof %s: %s", f.pprof, errText(err)))
		}
		defer ps.Close()
	}
	f.compatFlags.mergeDomains = f.envoy.merge
	stopCompat, err := startCompat(ctx, &f.compatFlags, srv, log)
	if err != nil {
		srv.Close()
		return fail(errText(err))
	}
	defer stopCompat()
	hl, gl, err := listen(srv)
	if err != nil {
		srv.Close()
		return fail(errText(err))
	}
	if a := srv.RESPAddr(); a != "" {
		rl, err := net.Listen("tcp", a)
		if err == nil {
			err = srv.ServeRESP(rl)
		}
		if err != nil {
			hl.Close()
			if gl != nil {
				gl.Close()
			}
			srv.Close()
			return fail(fmt.Sprintf("RESP on %s: %v", a, err))
		}
		if jsonLog {
			log.Info("weir: serving the Redis protocol", "resp", rl.Addr().String())
		} else {
			fmt.Fprintf(stdout, "weir: serving the Redis protocol on %s\n", rl.Addr().String())
		}
	}
	announce(stdout, log, jsonLog, srv, hl, gl)
	go reloadOnSignal(ctx, srv, log, reload)
	if err := srv.Serve(ctx, hl, gl); err != nil {
		return fail(errText(err))
	}
	log.Info("weir serve stopped")
	return 0
}

// failure reports why serve stops: a line on stderr, or, under
// --log-format json, an ERROR record, so that every line is JSON.
func failure(stderr io.Writer, log *slog.Logger, jsonLog bool, msg string) {
	if jsonLog {
		log.Error("weir serve: " + msg)
		return
	}
	fmt.Fprintln(stderr, "weir serve:", msg)
}

// earlyLogger is the logger of a failure before the flags' own: JSON
// records at the info level when format is json (the rest is printed as
// plain lines by failure).
func earlyLogger(stderr io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(stderr, nil))
	}
	return slog.New(slog.NewTextHandler(stderr, nil))
}

// peekLogFormat is the --log-format that args and the environment ask
// for, as far as they can be read: how to say why weir does not start.
func peekLogFormat(args []string, lookup func(string) (string, bool)) string {
	fs, f := newServeFlagSet(io.Discard)
	fs.Usage = func() {}
	_ = fs.Parse(args)
	_ = applyEnv(fs, lookup)
	return f.logFormat
}

// geteuid is os.Geteuid; tests replace it.
var geteuid = os.Geteuid

// parseServeArgs reads weir serve's flags from args, then from the
// environment (lookup) for those args leave unset, checks them and builds
// the logger they ask for. On bad usage it writes why to stderr and
// returns nil flags and the exit code.
func parseServeArgs(args []string, stdout, stderr io.Writer, lookup func(string) (string, bool)) (*serveFlags, *slog.Logger, int) {
	fs, f := newServeFlagSet(stderr)
	var notes []string
	if peerRole(args, lookup) { // peerenv.go
		var err error
		if args, notes, err = peerArgs(fs, args, lookup); err != nil {
			format := peekLogFormat(args, lookup)
			log := earlyLogger(stderr, format)
			peerNotices(stderr, log, format == "json", notes)
			failure(stderr, log, format == "json", "envoy-compat: "+err.Error())
			return nil, nil, 1
		}
	}
	if code, ok := parseFlags(fs, args, stdout); !ok {
		return nil, nil, code
	}
	if fs.NArg() > 0 {
		failure(stderr, earlyLogger(stderr, f.logFormat), f.logFormat == "json", fmt.Sprintf("unexpected argument %q (flags start with --)", fs.Arg(0)))
		return nil, nil, 2
	}
	if err := applyEnv(fs, lookup); err != nil {
		failure(stderr, earlyLogger(stderr, f.logFormat), f.logFormat == "json", errText(err))
		return nil, nil, 2
	}
	log, err := newLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		failure(stderr, earlyLogger(stderr, f.logFormat), f.logFormat == "json", errText(err))
		return nil, nil, 2
	}
	peerNotices(stderr, log, f.logFormat == "json", notes)
	if f.refuseRoot && geteuid() == 0 {
		failure(stderr, log, f.logFormat == "json", "refusing to run as root (effective uid 0) with --refuse-root ($WEIR_REFUSE_ROOT): run as an unprivileged user, e.g. docker run --user 65532:65532")
		return nil, nil, 1
	}
	if f.storeTimeout < 0 {
		failure(stderr, log, f.logFormat == "json", fmt.Sprintf("--store-timeout %v: want a positive duration (0: the config's store.timeout)", f.storeTimeout))
		return nil, nil, 2
	}
	if f.shutdownDelay < 0 || f.shutdownTimeout <= 0 || f.shutdownDelay >= f.shutdownTimeout {
		failure(stderr, log, f.logFormat == "json", fmt.Sprintf("--shutdown-delay %v and --shutdown-timeout %v: want 0 <= delay < timeout (the timeout includes the delay)", f.shutdownDelay, f.shutdownTimeout))
		return nil, nil, 2
	}
	return f, log, 0
}

// serverOptions are the server's options for the flags f: a flag left
// empty leaves the server's own default (or its config file's setting).
func serverOptions(f *serveFlags, log *slog.Logger, lookup func(string) (string, bool)) []server.Option {
	opts := []server.Option{
		server.WithLogger(log),
		server.WithVersion(binaryVersion()),
		server.WithShutdownTimeout(f.shutdownTimeout),
		server.WithShutdownDelay(f.shutdownDelay),
		server.WithLookupEnv(lookup),
		f.envoy.option(),
	}
	for _, o := range []struct {
		value string
		opt   func(string) server.Option
	}{
		{f.config, server.WithConfigFile},
		{f.envoyConfig, server.WithEnvoyConfigDir},
		{f.redis, server.WithRedisURL},
		{f.http, server.WithHTTPAddr},
		{f.grpc, server.WithGRPCAddr},
		{f.adminTokenEnv, server.WithAdminTokenEnv},
		{f.instanceID, server.WithInstanceID},
		{f.resp, server.WithRESPAddr},
		{f.respToken, server.WithRESPToken},
	} {
		if o.value != "" {
			opts = append(opts, o.opt(o.value))
		}
	}
	if f.envoyDynamicMetadata {
		opts = append(opts, server.WithEnvoyDynamicMetadata(true))
	}
	if f.envoyReserve {
		opts = append(opts, server.WithEnvoyReserve(true))
	}
	if f.storeTimeout > 0 {
		opts = append(opts, server.WithStoreTimeout(f.storeTimeout))
	}
	if f.redisTLSCA != "" || f.redisTLSCert != "" || f.redisTLSKey != "" || f.redisTLSAnyName {
		opts = append(opts, server.WithRedisTLS(f.redisTLSCA, f.redisTLSCert, f.redisTLSKey, f.redisTLSAnyName))
	}
	if f.tlsCert != "" || f.tlsKey != "" || f.tlsClientCA != "" {
		opts = append(opts, server.WithTLS(f.tlsCert, f.tlsKey, f.tlsClientCA))
	}
	return opts
}

// startPprof serves net/http/pprof's handlers on addr until the returned
// server is closed.
func startPprof(addr string) (*http.Server, error) {
	pl, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	ps := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go ps.Serve(pl)
	return ps, nil
}

// listen opens srv's HTTP listener and, unless gRPC is off, its gRPC
// listener (gl is then nil).
func listen(srv *server.Server) (hl, gl net.Listener, err error) {
	hl, err = net.Listen("tcp", srv.HTTPAddr())
	if err != nil {
		return nil, nil, fmt.Errorf("HTTP on %s: %w", srv.HTTPAddr(), err)
	}
	if a := srv.GRPCAddr(); a != "" {
		if gl, err = net.Listen("tcp", a); err != nil {
			hl.Close()
			return nil, nil, fmt.Errorf("gRPC on %s: %w", a, err)
		}
	}
	return hl, gl, nil
}

// announce tells the operator where weir serves: one line on stdout
// (none under --log-format json, whose readers want JSON only), and one
// log record with the addresses, store, admin API, instance and the rules
// in force: where they come from, their names, and the Envoy config's.
func announce(stdout io.Writer, log *slog.Logger, jsonLog bool, srv *server.Server, hl, gl net.Listener) {
	grpcAddr, grpcDesc := "off", "gRPC off"
	if gl != nil {
		grpcAddr = gl.Addr().String()
		grpcDesc = "gRPC " + displayAddr(grpcAddr, false)
	}
	scheme := "http"
	tlsOn, mutual := srv.TLS()
	if tlsOn && !srv.TLSOnGRPCOnly() {
		scheme = "https"
	}
	dashboard := scheme + "://" + displayAddr(hl.Addr().String(), true)
	if !jsonLog {
		fmt.Fprintf(stdout, "weir: serving on %s (dashboard), %s, store %s\n", dashboard, grpcDesc, srv.StoreDescription())
	}
	var names []string
	for _, r := range srv.Policy().Rules() {
		names = append(names, r.Name)
	}
	domains := map[string]bool{}
	var envoyDomains []string
	envoyRules := srv.Envoy().Config().Rules()
	for _, r := range envoyRules {
		if !domains[r.Domain] {
			domains[r.Domain] = true
			envoyDomains = append(envoyDomains, r.Domain)
		}
	}
	log.Info("weir serve started", "dashboard", dashboard, "http", hl.Addr().String(), "grpc", grpcAddr, "tls", tlsOn, "mutual_tls", mutual, "store", srv.StoreDescription(),
		"admin_api", srv.AdminEnabled(), "instance", srv.InstanceID(),
		"rules", len(names), "rules_from", srv.RulesSource(), "rule_names", strings.Join(names, ","),
		"envoy_rules", len(envoyRules), "envoy_domains", strings.Join(envoyDomains, ","))
}

// reloadOnSignal reloads srv's configuration on every value from reload
// until ctx ends; a rejected reload keeps the old configuration.
func reloadOnSignal(ctx context.Context, srv *server.Server, log *slog.Logger, reload <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
			if err := srv.Reload(); err != nil {
				log.Error("weir serve: reload rejected; the old configuration stays in force", "err", err)
			} else {
				log.Info("weir serve: reloaded on SIGHUP")
			}
		}
	}
}

// displayAddr renders a listen address for people: an unspecified host
// becomes localhost in a URL, and is left out otherwise (":8081").
func displayAddr(addr string, url bool) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if url {
			return "localhost:" + port
		}
		return ":" + port
	}
	return net.JoinHostPort(host, port)
}

// newLogger builds the slog logger the flags ask for.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	ho := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
