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

	"github.com/weir-dev/weir/server"
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
	logLevel, logFormat                    string
	pprof                                  string
	shutdownTimeout                        time.Duration
}

func newServeFlagSet(stderr io.Writer) (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("weir serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &serveFlags{}
	fs.StringVar(&f.config, "config", "", "weir.yaml with the store, rules and server settings; reloaded when it changes and on SIGHUP (default: built-in demo rules on the memory store)")
	fs.StringVar(&f.envoyConfig, "envoy-config", "", "directory of envoyproxy/ratelimit YAML files to serve over gRPC ShouldRateLimit and POST /v1/check; reloaded on SIGHUP")
	fs.StringVar(&f.http, "http", "", `HTTP listen address for the API, /v1/auth, metrics and the dashboard (default: server.http in the config, else ":8080")`)
	fs.StringVar(&f.grpc, "grpc", "", `gRPC listen address for Envoy's rate limit service and gRPC health, or "off" (default: server.grpc in the config, else ":8081")`)
	fs.StringVar(&f.redis, "redis", "", "keep state in Redis at this URL instead of what the config says: redis://[user:pass@]host:port/db, rediss://..., redis+sentinel://host:port,host:port/master, or host:port,host:port,... for a cluster")
	fs.StringVar(&f.adminTokenEnv, "admin-token-env", "", "name of the environment variable holding the admin API's bearer token (default: server.admin_token_env in the config, else WEIR_ADMIN_TOKEN); without a token the admin API is off")
	fs.StringVar(&f.instanceID, "instance-id", "", "this instance's name in the dashboard's fleet view (default: hostname-pid)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&f.pprof, "pprof", "", `serve Go's profiler (/debug/pprof/) on this address, e.g. "127.0.0.1:6060"; off by default, never on a public address`)
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", server.DefaultShutdownTimeout, "on SIGTERM or SIGINT, how long to let in-flight requests finish")
	// Every flag's help names its environment variable.
	fs.VisitAll(func(fl *flag.Flag) { fl.Usage += " [$" + envName(fl.Name) + "]" })
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: weir serve [flags]

Runs the rate-limit service. With no flags it starts on the in-memory store
with built-in demo rules: HTTP on :8080 (API and dashboard at /) and gRPC on
:8081, and prints where to look.

  POST /v1/check               decide {"rule","key","hits"}, or Envoy-style {"domain","descriptors"}
  GET  /v1/auth                nginx auth_request, Traefik ForwardAuth, Caddy forward_auth (?status=429)
  GET  /v1/rules, /v1/top      the rules in force; the most limited identities
  GET  /v1/dashboard/snapshot  the dashboard's data
  GET  /metrics, /healthz, /readyz
  /v1/state, /v1/blocked, PUT /v1/rules   the admin API (Authorization: Bearer $WEIR_ADMIN_TOKEN)

SIGHUP reloads the config files; SIGTERM and SIGINT drain in-flight requests
and exit 0.

Every flag can also be set by an environment variable: WEIR_ and the flag's
name in capitals with '-' as '_' (--redis is WEIR_REDIS). A flag on the
command line wins over its variable.

Flags:
`)
		fs.PrintDefaults()
		fmt.Fprint(stderr, `
Examples:
  weir serve
  weir serve --config weir.yaml --redis redis://127.0.0.1:6379
  WEIR_ADMIN_TOKEN=s3cret weir serve --config weir.yaml --envoy-config /etc/ratelimit/config
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
	fs, f := newServeFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "weir serve: unexpected argument %q (flags start with --)\n", fs.Arg(0))
		return 2
	}
	if err := applyEnv(fs, lookup); err != nil {
		fmt.Fprintln(stderr, "weir serve:", err)
		return 2
	}
	log, err := newLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		fmt.Fprintln(stderr, "weir serve:", err)
		return 2
	}

	opts := []server.Option{
		server.WithLogger(log),
		server.WithVersion(strings.TrimSuffix(version, "-dev")),
		server.WithShutdownTimeout(f.shutdownTimeout),
		server.WithLookupEnv(lookup),
	}
	if f.config != "" {
		opts = append(opts, server.WithConfigFile(f.config))
	}
	if f.envoyConfig != "" {
		opts = append(opts, server.WithEnvoyConfigDir(f.envoyConfig))
	}
	if f.redis != "" {
		opts = append(opts, server.WithRedisURL(f.redis))
	}
	if f.http != "" {
		opts = append(opts, server.WithHTTPAddr(f.http))
	}
	if f.grpc != "" {
		opts = append(opts, server.WithGRPCAddr(f.grpc))
	}
	if f.adminTokenEnv != "" {
		opts = append(opts, server.WithAdminTokenEnv(f.adminTokenEnv))
	}
	if f.instanceID != "" {
		opts = append(opts, server.WithInstanceID(f.instanceID))
	}
	if _, set := lookup("GOGC"); !set {
		// The service's heap is small and its allocation rate high: a
		// GC target of 400% halves GC work (and the goroutine stacks it
		// shrinks and requests regrow) for a few MB. GOGC still wins.
		debug.SetGCPercent(400)
	}
	srv, err := server.New(opts...)
	if err != nil {
		fmt.Fprintln(stderr, "weir serve:", err)
		return 1
	}
	if f.pprof != "" {
		pl, err := net.Listen("tcp", f.pprof)
		if err != nil {
			srv.Close()
			fmt.Fprintf(stderr, "weir serve: --pprof %s: %v\n", f.pprof, err)
			return 1
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		ps := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go ps.Serve(pl)
		defer ps.Close()
	}
	hl, err := net.Listen("tcp", srv.HTTPAddr())
	if err != nil {
		srv.Close()
		fmt.Fprintf(stderr, "weir serve: HTTP on %s: %v\n", srv.HTTPAddr(), err)
		return 1
	}
	var gl net.Listener
	if a := srv.GRPCAddr(); a != "" {
		if gl, err = net.Listen("tcp", a); err != nil {
			hl.Close()
			srv.Close()
			fmt.Fprintf(stderr, "weir serve: gRPC on %s: %v\n", a, err)
			return 1
		}
	}
	grpcDesc := "gRPC off"
	if gl != nil {
		grpcDesc = "gRPC " + displayAddr(gl.Addr().String(), false)
	}
	fmt.Fprintf(stdout, "weir: serving on http://%s (dashboard), %s, store %s\n",
		displayAddr(hl.Addr().String(), true), grpcDesc, srv.StoreDescription())
	log.Info("weir serve started", "http", hl.Addr().String(), "grpc", grpcDesc, "store", srv.StoreDescription(),
		"admin_api", srv.AdminEnabled(), "instance", srv.InstanceID(), "rules", len(srv.Policy().Rules()))

	go func() {
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
	}()
	if err := srv.Serve(ctx, hl, gl); err != nil {
		fmt.Fprintln(stderr, "weir serve:", err)
		return 1
	}
	log.Info("weir serve stopped")
	return 0
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
