package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// weir serve stands in for envoyproxy/ratelimit (the peer) in deployments
// made for it, such as Envoy Gateway's: run as /bin/ratelimit, or with
// --envoy-compat, it reads the peer's environment variables. peerVars is
// the whole translation: every variable the peer reads, with what weir
// does with it. A variable weir cannot honour is named at start-up; one
// that would change decisions makes weir refuse to start.

// peerVar is one of the peer's environment variables.
type peerVar struct {
	name string
	def  string // the peer's default
	// how says what weir does with it, for the start-up notice and docs.
	how string
	// apply turns the value (the default when unset) into weir serve
	// flags; nil means "ignored, named at start-up when set".
	apply func(e *peerEnv, v string, set bool)
}

// peerEnv is one translation under way.
type peerEnv struct {
	lookup  func(string) (string, bool)
	hasFlag func(string) bool
	args    []string
	notes   []string // honoured differently or not at all, decisions unchanged
	refuse  []string // would change decisions: weir does not start
}

func (e *peerEnv) get(name string) string {
	if v, ok := e.lookup(name); ok {
		return v
	}
	return peerDefaults[name]
}

// peerDefaults are the peer's defaults by name.
var peerDefaults = map[string]string{}

func init() {
	for _, p := range peerVars {
		peerDefaults[p.name] = p.def
	}
}

func (e *peerEnv) isSet(name string) bool { _, ok := e.lookup(name); return ok }

func (e *peerEnv) bool(name string) bool {
	v := e.get(name)
	b, err := strconv.ParseBool(v)
	if err != nil {
		e.refuse = append(e.refuse, fmt.Sprintf("%s=%q: want true or false", name, v))
	}
	return b
}

func (e *peerEnv) flag(name, value string) { e.args = append(e.args, "--"+name+"="+value) }

// note names a variable weir does not use, when it is set.
func note(e *peerEnv, name, how string) {
	e.notes = append(e.notes, name+": "+how)
}

// boolFlag maps a true/false variable to a weir serve flag another part
// of weir defines; until it does, true is refused (it changes decisions).
func boolFlag(flag string) func(*peerEnv, string, bool) {
	return func(e *peerEnv, v string, set bool) {
		if !set {
			return
		}
		b, err := strconv.ParseBool(v)
		switch {
		case err != nil:
			e.refuse = append(e.refuse, fmt.Sprintf("%q: want true or false", v))
		case e.hasFlag(flag):
			e.flag(flag, strconv.FormatBool(b))
		case b:
			e.refuse = append(e.refuse, fmt.Sprintf("=true: this weir has no --%s", flag))
		}
	}
}

// refuseIfTrue refuses a true value: weir cannot do it.
func refuseIfTrue(why string) func(*peerEnv, string, bool) {
	return func(e *peerEnv, v string, set bool) {
		if !set {
			return
		}
		if b, err := strconv.ParseBool(v); err != nil || b {
			e.refuse = append(e.refuse, fmt.Sprintf("=%q: %s", v, why))
		}
	}
}

// refuseIfSet refuses any non-empty value.
func refuseIfSet(why string) func(*peerEnv, string, bool) {
	return func(e *peerEnv, v string, set bool) {
		if set && v != "" {
			e.refuse = append(e.refuse, fmt.Sprintf("=%q: %s", v, why))
		}
	}
}

// group marks a variable read by another's apply.
func group(*peerEnv, string, bool) {}

const (
	unusedTuning = "tuning of the peer's own implementation; weir's own applies, decisions unchanged"
	unusedStats  = "weir emits no statsd; its metrics are Prometheus's, at /metrics (and USE_PROMETHEUS's address)"
	configOnly   = "set in a weir.yaml given with WEIR_CONFIG instead"
)

// peerVars is every variable of the peer's settings, in its order.
var peerVars = []peerVar{
	// Listeners.
	{"HOST", "0.0.0.0", "--http HOST:PORT", group},
	{"PORT", "8080", "--http HOST:PORT (API, /healthcheck, /metrics)", func(e *peerEnv, v string, _ bool) {
		e.flag("http", net.JoinHostPort(e.get("HOST"), v))
	}},
	{"DEBUG_HOST", "0.0.0.0", "not served: weir has no debug listener (Go's profiler: --pprof)", nil},
	{"DEBUG_PORT", "6070", "not served: weir has no debug listener (Go's profiler: --pprof)", nil},
	{"GRPC_UDS", "", "refused: weir listens on TCP only", refuseIfSet("weir's gRPC listens on TCP only (GRPC_HOST, GRPC_PORT)")},
	{"GRPC_HOST", "0.0.0.0", "--grpc GRPC_HOST:GRPC_PORT", group},
	{"GRPC_PORT", "8081", "--grpc GRPC_HOST:GRPC_PORT", func(e *peerEnv, v string, _ bool) {
		e.flag("grpc", net.JoinHostPort(e.get("GRPC_HOST"), v))
	}},
	{"GRPC_MAX_CONNECTION_AGE", "24h", unusedTuning, nil},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1h", unusedTuning, nil},
	{"GRPC_SERVER_USE_TLS", "false", "--tls-cert, --tls-key, --tls-grpc-only: TLS on gRPC, HTTP stays plaintext", func(e *peerEnv, _ string, _ bool) {
		if !e.bool("GRPC_SERVER_USE_TLS") {
			return
		}
		e.flag("tls-cert", e.get("GRPC_SERVER_TLS_CERT"))
		e.flag("tls-key", e.get("GRPC_SERVER_TLS_KEY"))
		e.flag("tls-grpc-only", "true")
		if ca := e.get("GRPC_CLIENT_TLS_CACERT"); ca != "" {
			e.flag("tls-client-ca", ca)
		}
	}},
	{"GRPC_SERVER_TLS_CERT", "", "--tls-cert (with GRPC_SERVER_USE_TLS)", group},
	{"GRPC_SERVER_TLS_KEY", "", "--tls-key (with GRPC_SERVER_USE_TLS)", group},
	{"GRPC_CLIENT_TLS_CACERT", "", "--tls-client-ca: gRPC clients need a certificate from this CA", group},
	{"GRPC_SERVER_TLS_CA_CERT", "", "not read by the peer either (its client CA is GRPC_CLIENT_TLS_CACERT); ignored alike", group},
	{"GRPC_CLIENT_TLS_SAN", "", "refused: weir does not match client certificate names", refuseIfSet("weir checks that client certificates chain to the CA, not their names")},
	{"LOG_LEVEL", "WARN", "--log-level (trace is debug; fatal and panic are error)", func(e *peerEnv, v string, _ bool) {
		switch l := strings.ToLower(v); l {
		case "trace", "debug":
			e.flag("log-level", "debug")
		case "info", "error":
			e.flag("log-level", l)
		case "warn", "warning":
			e.flag("log-level", "warn")
		case "fatal", "panic":
			e.flag("log-level", "error")
		default:
			e.refuse = append(e.refuse, fmt.Sprintf("LOG_LEVEL=%q: want trace, debug, info, warn, error, fatal or panic", v))
		}
	}},
	{"LOG_FORMAT", "text", "--log-format (weir's own record fields)", func(e *peerEnv, v string, _ bool) { e.flag("log-format", strings.ToLower(v)) }},

	// Where the rate limit config comes from.
	{"CONFIG_TYPE", "FILE", "FILE: --envoy-config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY; GRPC_XDS_SOTW: --envoy-xds", func(e *peerEnv, v string, _ bool) {
		switch strings.ToUpper(v) {
		case "FILE":
			e.flag("envoy-config", filepath.Join(e.get("RUNTIME_ROOT"), e.get("RUNTIME_SUBDIRECTORY"), e.get("RUNTIME_APPDIRECTORY")))
			if e.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED") {
				note(e, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "with CONFIG_TYPE=FILE weir does not start without a config, so it is healthy with one")
			}
		case "GRPC_XDS_SOTW":
			e.flag("envoy-xds", e.get("CONFIG_GRPC_XDS_SERVER_URL"))
			e.flag("envoy-xds-node", e.get("CONFIG_GRPC_XDS_NODE_ID"))
			e.flag("envoy-xds-node-metadata", e.get("CONFIG_GRPC_XDS_NODE_METADATA"))
			e.flag("envoy-xds-headers", e.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"))
			e.flag("envoy-xds-retry-min", e.get("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"))
			e.flag("envoy-xds-retry-max", e.get("XDS_CLIENT_BACKOFF_MAX_INTERVAL"))
			if n := e.get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"); n != "" {
				e.flag("envoy-xds-max-message-bytes", n)
			}
			if e.bool("CONFIG_GRPC_XDS_SERVER_USE_TLS") {
				e.flag("envoy-xds-tls", "true")
				e.flag("envoy-xds-cert", e.get("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"))
				e.flag("envoy-xds-key", e.get("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"))
				e.flag("envoy-xds-ca", e.get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"))
				e.flag("envoy-xds-server-name", e.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN"))
			}
			// The peer does not start serving before its first config
			// unless forced; weir serves, unhealthy, until it has one.
			if !e.bool("FORCE_START_WITHOUT_INITIAL_CONFIG") || e.bool("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED") {
				e.flag("envoy-await-config", "true")
			}
		default:
			e.refuse = append(e.refuse, fmt.Sprintf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", v))
		}
	}},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "false", "false: GET /healthcheck is 500 until the first xDS config (--envoy-await-config)", group},
	{"CONFIG_GRPC_XDS_NODE_ID", "default", "--envoy-xds-node", group},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "", "--envoy-xds-node-metadata", group},
	{"CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", "--envoy-xds", group},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", "weir retries by XDS_CLIENT_BACKOFF_* alone", nil},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", "--envoy-xds-headers", group},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", "--envoy-xds-tls", group},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", "--envoy-xds-cert", group},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", "--envoy-xds-key", group},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", "--envoy-xds-ca", group},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", "--envoy-xds-server-name", group},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", "--envoy-xds-retry-min", group},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", "--envoy-xds-retry-max", group},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", "weir's jitter is fixed (half to all of the wait)", nil},
	{"XDS_CLIENT_BACKOFF_JITTER", "true", "weir's jitter is fixed (half to all of the wait)", nil},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", "--envoy-xds-max-message-bytes", group},

	// Stats.
	{"USE_DOG_STATSD", "false", "refused when true: " + unusedStats, refuseIfTrue(unusedStats)},
	{"USE_DOG_STATSD_MOGRIFIERS", "", unusedStats, nil},
	{"USE_STATSD", "true", "refused when set to true: " + unusedStats + "; unset, named at start-up", func(e *peerEnv, v string, set bool) {
		if !set {
			note(e, "USE_STATSD", "unset (the peer's default is true): "+unusedStats)
			return
		}
		refuseIfTrue(unusedStats+"; set USE_STATSD=false")(e, v, set)
	}},
	{"STATSD_HOST", "localhost", unusedStats, nil},
	{"STATSD_PORT", "8125", unusedStats, nil},
	{"EXTRA_TAGS", "", unusedStats, nil},
	{"STATS_FLUSH_INTERVAL", "10s", unusedStats, nil},
	{"DISABLE_STATS", "false", "weir's /metrics is always on", nil},
	{"USE_PROMETHEUS", "false", "true: --metrics-addr PROMETHEUS_ADDR --metrics-path PROMETHEUS_PATH, serving weir's own metrics (weir_*)", func(e *peerEnv, _ string, _ bool) {
		if e.bool("USE_PROMETHEUS") {
			e.flag("metrics-addr", e.get("PROMETHEUS_ADDR"))
			e.flag("metrics-path", e.get("PROMETHEUS_PATH"))
		}
	}},
	{"PROMETHEUS_ADDR", ":9090", "--metrics-addr (with USE_PROMETHEUS)", group},
	{"PROMETHEUS_PATH", "/metrics", "--metrics-path (with USE_PROMETHEUS)", group},
	{"PROMETHEUS_MAPPER_YAML", "", "weir's metric names are its own (weir_*), not the mapped statsd names", nil},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false", "weir's latencies are histograms in seconds", nil},

	// The config directory.
	{"RUNTIME_ROOT", "/srv/runtime_data/current", "--envoy-config RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY (CONFIG_TYPE=FILE)", group},
	{"RUNTIME_SUBDIRECTORY", "", "part of --envoy-config", group},
	{"RUNTIME_APPDIRECTORY", "config", "part of --envoy-config", group},
	{"RUNTIME_IGNOREDOTFILES", "false", "weir always skips dot files", nil},
	{"RUNTIME_WATCH_ROOT", "true", "weir reloads the directory on SIGHUP and when it changes", nil},

	// The store.
	{"EXPIRATION_JITTER_MAX_SECONDS", "300", unusedTuning, nil},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", "weir's deny cache plays this part, always on", nil},
	{"NEAR_LIMIT_RATIO", "0.8", "weir counts near-limit decisions at 80% (weir_near_limit_total); decisions unchanged", nil},
	{"CACHE_KEY_PREFIX", "", "refused: weir's Redis key prefix is store.redis.prefix, " + configOnly, refuseIfSet("weir's Redis key prefix is store.redis.prefix, " + configOnly)},
	{"BACKEND_TYPE", "redis", "redis only; memcache is refused", func(e *peerEnv, v string, _ bool) {
		if !strings.EqualFold(v, "redis") {
			e.refuse = append(e.refuse, fmt.Sprintf("BACKEND_TYPE=%q: weir keeps its counters in Redis only", v))
		}
	}},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", "refused when true: the peer then counts none of a call's descriptors when one is over; weir counts each descriptor by its own limit, as the peer's default does", refuseIfTrue("weir's algorithms decide what an over-limit request spends")},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "false", "--envoy-response-headers", boolFlag("envoy-response-headers")},
	{"LIMIT_LIMIT_HEADER", "RateLimit-Limit", "refused unless the default", refuseIfNot("RateLimit-Limit")},
	{"LIMIT_REMAINING_HEADER", "RateLimit-Remaining", "refused unless the default", refuseIfNot("RateLimit-Remaining")},
	{"LIMIT_RESET_HEADER", "RateLimit-Reset", "refused unless the default", refuseIfNot("RateLimit-Reset")},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", "true: --envoy-await-config", group},

	// Redis.
	{"REDIS_SOCKET_TYPE", "unix", "tcp; unix is refused (REDIS_URL host:port)", group},
	{"REDIS_TYPE", "SINGLE", "SINGLE, SENTINEL (REDIS_URL master,host:port,...) or CLUSTER, as --redis", group},
	{"REDIS_URL", "/var/run/nutcracker/ratelimit.sock", "--redis, with REDIS_AUTH and REDIS_TLS", func(e *peerEnv, v string, _ bool) { peerRedis(e) }},
	{"REDIS_POOL_SIZE", "10", unusedTuning, nil},
	{"REDIS_AUTH", "", "in --redis: password, or user:password", group},
	{"REDIS_TLS", "false", "in --redis: rediss://", group},
	{"REDIS_TLS_CLIENT_CERT", "", "--redis-tls-cert (with REDIS_TLS; with REDIS_TLS_CLIENT_KEY)", group},
	{"REDIS_TLS_CLIENT_KEY", "", "--redis-tls-key (with REDIS_TLS; with REDIS_TLS_CLIENT_CERT)", group},
	{"REDIS_TLS_CACERT", "", "--redis-tls-ca (with REDIS_TLS): Redis's certificates must chain to it", group},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", "--redis-tls-skip-hostname-verification (with REDIS_TLS): the chain is checked, not the name", group},
	{"REDIS_PIPELINE_WINDOW", "0", unusedTuning, nil},
	{"REDIS_PIPELINE_LIMIT", "0", unusedTuning, nil},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "1", unusedTuning, nil},
	{"REDIS_PERSECOND", "false", "true is named at start-up: per-second counters stay in REDIS_URL's Redis, decisions unchanged", func(e *peerEnv, _ string, set bool) {
		if set && e.bool("REDIS_PERSECOND") {
			note(e, "REDIS_PERSECOND", "weir keeps per-second counters in REDIS_URL's Redis too; REDIS_PERSECOND_* are not used")
		}
	}},
	{"REDIS_PERSECOND_SOCKET_TYPE", "unix", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_TYPE", "SINGLE", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_POOL_SIZE", "10", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_AUTH", "", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_TLS", "false", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_SENTINEL_AUTH", "", "refused: weir authenticates to Redis, not to Sentinels", refuseIfSet("weir authenticates to the Redis servers, not to Sentinels")},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "0", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "0", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false", "/healthcheck does not follow Redis (on_error decides meanwhile); /healthz/store does", nil},
	{"REDIS_TIMEOUT", "10s", "--store-timeout, the deadline of every Redis call (then on_error decides); unset, the peer's 10s too, unless WEIR_STORE_TIMEOUT or WEIR_CONFIG's weir.yaml (store.timeout, else 50ms) gives weir's own", peerTimeout},
	{"REDIS_PERSECOND_TIMEOUT", "10s", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", unusedTuning, nil},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", "not used (REDIS_PERSECOND)", nil},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "1s", "weir starts without waiting for Redis and reconnects on its own", nil},
	{"REDIS_STARTUP_MAX_INTERVAL", "30s", "weir starts without waiting for Redis and reconnects on its own", nil},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "0", "weir starts without waiting for Redis and reconnects on its own", nil},

	// Memcache: refused through BACKEND_TYPE; named when set.
	{"MEMCACHE_HOST_PORT", "", "not used (BACKEND_TYPE=memcache is refused)", nil},
	{"MEMCACHE_MAX_IDLE_CONNS", "2", "not used", nil},
	{"MEMCACHE_SRV", "", "not used", nil},
	{"MEMCACHE_SRV_REFRESH", "0", "not used", nil},
	{"MEMCACHE_TLS", "false", "not used", nil},
	{"MEMCACHE_TLS_CLIENT_CERT", "", "not used", nil},
	{"MEMCACHE_TLS_CLIENT_KEY", "", "not used", nil},
	{"MEMCACHE_TLS_CACERT", "", "not used", nil},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", "not used", nil},

	// Decisions.
	{"SHADOW_MODE", "false", "--envoy-shadow-mode", boolFlag("envoy-shadow-mode")},
	{"QUOTA_MODE", "false", "--envoy-quota-mode", boolFlag("envoy-quota-mode")},
	{"RESPONSE_DYNAMIC_METADATA", "false", "--envoy-dynamic-metadata", boolFlag("envoy-dynamic-metadata")},
	{"MERGE_DOMAIN_CONFIG", "false", "--envoy-merge-domains", boolFlag("envoy-merge-domains")},

	// Traces.
	{"TRACING_ENABLED", "false", "weir traces when the OTEL_* variables ask (OTEL_EXPORTER_OTLP_ENDPOINT, which Envoy Gateway sets with it)", nil},
	{"TRACING_SERVICE_NAME", "RateLimit", "OTEL_SERVICE_NAME instead", nil},
	{"TRACING_SERVICE_NAMESPACE", "", "OTEL_RESOURCE_ATTRIBUTES instead", nil},
	{"TRACING_SERVICE_INSTANCE_ID", "", "OTEL_RESOURCE_ATTRIBUTES instead", nil},
	{"TRACING_EXPORTER_PROTOCOL", "http", "OTEL_EXPORTER_OTLP_PROTOCOL instead", nil},
	{"TRACING_SAMPLING_RATE", "1", "OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG instead", nil},
}

// refuseIfNot refuses any value but def.
func refuseIfNot(def string) func(*peerEnv, string, bool) {
	return func(e *peerEnv, v string, set bool) {
		if set && v != def {
			e.refuse = append(e.refuse, fmt.Sprintf("=%q: weir's header is %s", v, def))
		}
	}
}

// peerRedis builds --redis from REDIS_*.
func peerRedis(e *peerEnv) {
	if st := strings.ToLower(e.get("REDIS_SOCKET_TYPE")); st != "tcp" || strings.HasPrefix(e.get("REDIS_URL"), "/") {
		if !e.isSet("REDIS_URL") && !e.isSet("REDIS_SOCKET_TYPE") {
			e.refuse = append(e.refuse, "REDIS_URL is unset (the peer's default is a Unix socket): weir needs REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port")
		} else {
			e.refuse = append(e.refuse, fmt.Sprintf("REDIS_SOCKET_TYPE=%q with REDIS_URL %q: weir connects to Redis over TCP only (REDIS_SOCKET_TYPE=tcp, REDIS_URL=host:port)", e.get("REDIS_SOCKET_TYPE"), e.get("REDIS_URL")))
		}
		return
	}
	tlsOn := e.bool("REDIS_TLS")
	peerRedisTLS(e, tlsOn)
	addrs := strings.Split(e.get("REDIS_URL"), ",")
	auth := e.get("REDIS_AUTH")
	var user *url.Userinfo
	if auth != "" {
		if u, p, ok := strings.Cut(auth, ":"); ok {
			user = url.UserPassword(u, p)
		} else {
			user = url.UserPassword("", auth)
		}
	}
	switch t := strings.ToUpper(e.get("REDIS_TYPE")); t {
	case "SINGLE":
		u := url.URL{Scheme: "redis", Host: addrs[0], User: user}
		if tlsOn {
			u.Scheme = "rediss"
		}
		e.flag("redis", u.String())
	case "SENTINEL":
		if len(addrs) < 2 {
			e.refuse = append(e.refuse, "REDIS_TYPE=SENTINEL: REDIS_URL wants master-name,sentinel-host:port,...")
			return
		}
		if tlsOn && e.get("REDIS_TLS_CACERT") == "" && e.get("REDIS_TLS_CLIENT_CERT") == "" {
			// weir's TLS to Sentinel is turned on by its files.
			e.refuse = append(e.refuse, "REDIS_TLS=true with REDIS_TYPE=SENTINEL: weir needs REDIS_TLS_CACERT (or REDIS_TLS_CLIENT_CERT) to speak TLS to Sentinel, or "+configOnly)
			return
		}
		u := url.URL{Scheme: "redis+sentinel", Host: strings.Join(addrs[1:], ","), Path: "/" + addrs[0], User: user}
		e.flag("redis", u.String())
	case "CLUSTER":
		if auth == "" && !tlsOn {
			e.flag("redis", strings.Join(addrs, ","))
			return
		}
		// Seed nodes with the password and TLS every node shares.
		u := url.URL{Scheme: "redis", Host: strings.Join(addrs, ","), User: user}
		if tlsOn {
			u.Scheme = "rediss"
		}
		e.flag("redis", u.String())
	default:
		e.refuse = append(e.refuse, fmt.Sprintf("REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", t))
	}
}

// peerRedisTLS maps the REDIS_TLS_* files onto --redis-tls-*. As the
// peer, it reads them only with REDIS_TLS=true; without, they are named
// at start-up as not used.
func peerRedisTLS(e *peerEnv, tlsOn bool) {
	ca, cert, key := e.get("REDIS_TLS_CACERT"), e.get("REDIS_TLS_CLIENT_CERT"), e.get("REDIS_TLS_CLIENT_KEY")
	anyName := e.bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	if !tlsOn {
		for _, n := range []string{"REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"} {
			if e.isSet(n) {
				note(e, n, "not used: REDIS_TLS is not true (the peer reads it only with REDIS_TLS=true)")
			}
		}
		return
	}
	if (cert == "") != (key == "") {
		e.refuse = append(e.refuse, fmt.Sprintf("REDIS_TLS_CLIENT_CERT=%q with REDIS_TLS_CLIENT_KEY=%q: a client certificate needs its key, and a key its certificate", cert, key))
		return
	}
	for _, f := range [][2]string{{"redis-tls-ca", ca}, {"redis-tls-cert", cert}, {"redis-tls-key", key}} {
		if f[1] != "" {
			e.flag(f[0], f[1])
		}
	}
	if anyName {
		e.flag("redis-tls-skip-hostname-verification", "true")
	}
}

// peerTimeout maps REDIS_TIMEOUT onto --store-timeout: the peer's
// timeout of Redis connections and I/O, weir's deadline of every store
// call. Unset, it is the peer's default, 10s: a Redis that is slow but
// alive (load, a failover) keeps deciding by its counters, as the peer
// does, instead of handing decisions to on_error after weir's own 50ms;
// Envoy's filter timeout bounds how long Envoy waits either way. A weir
// setting wins: WEIR_STORE_TIMEOUT, or a weir.yaml given with WEIR_CONFIG
// (its store.timeout, else 50ms).
func peerTimeout(e *peerEnv, v string, set bool) {
	if !set {
		_, cfg := e.lookup("WEIR_CONFIG")
		_, own := e.lookup(envName("store-timeout"))
		if !cfg && !own {
			e.flag("store-timeout", peerRedisTimeout.String())
		}
		return
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil || d < 0:
		e.refuse = append(e.refuse, fmt.Sprintf("=%q: want a duration such as 100ms or 10s", v))
	case d == 0:
		note(e, "REDIS_TIMEOUT", "0 (no timeout for the peer): weir keeps a deadline, the peer's default 10s")
		e.flag("store-timeout", peerRedisTimeout.String())
	default:
		e.flag("store-timeout", d.String())
	}
}

// peerRedisTimeout is the peer's default REDIS_TIMEOUT.
const peerRedisTimeout = 10 * time.Second

// translatePeerEnv turns the peer's environment into weir serve flags.
// hasFlag reports whether weir serve defines a flag. The error names
// every variable that would change decisions and that weir cannot honour.
func translatePeerEnv(lookup func(string) (string, bool), hasFlag func(string) bool) (args, notes []string, err error) {
	e := &peerEnv{lookup: lookup, hasFlag: hasFlag}
	for _, p := range peerVars {
		v, set := lookup(p.name)
		if !set {
			v = p.def
		}
		if p.apply == nil {
			if set {
				note(e, p.name, p.how)
			}
			continue
		}
		n := len(e.refuse)
		p.apply(e, v, set)
		for i := n; i < len(e.refuse); i++ {
			if strings.HasPrefix(e.refuse[i], "=") || strings.HasPrefix(e.refuse[i], "\"") {
				e.refuse[i] = p.name + e.refuse[i]
			}
		}
	}
	if e.bool("GRPC_SERVER_USE_TLS") && e.get("GRPC_SERVER_TLS_CA_CERT") != "" {
		note(e, "GRPC_SERVER_TLS_CA_CERT", "not read by envoyproxy/ratelimit (its client CA is GRPC_CLIENT_TLS_CACERT), so weir ignores it too")
	}
	if len(e.refuse) > 0 {
		// A variable read twice (GRPC_SERVER_USE_TLS) is named once.
		slices.Sort(e.refuse)
		e.refuse = slices.Compact(e.refuse)
		return e.args, e.notes, fmt.Errorf("as envoyproxy/ratelimit, cannot honour: %s", strings.Join(e.refuse, "; "))
	}
	return e.args, e.notes, nil
}

// peerRole reports whether args (weir serve's) or the environment ask
// for --envoy-compat, before the flags are parsed.
func peerRole(args []string, lookup func(string) (string, bool)) bool {
	for _, a := range args {
		if a == "--" {
			break
		}
		switch a {
		case "--envoy-compat", "-envoy-compat", "--envoy-compat=true", "-envoy-compat=true":
			return true
		}
	}
	v, ok := lookup(envName("envoy-compat"))
	b, _ := strconv.ParseBool(v)
	return ok && b
}

// peerArgs returns weir serve's arguments in the peer's role: the
// translated environment first, so that the command line wins, and the
// start-up notices, which parseServeArgs writes once it knows the log
// format. On err weir must not start; args are then those translated so
// far, from which parseServeArgs learns the log format to say why in.
func peerArgs(fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) (all, notes []string, err error) {
	pargs, notes, err := translatePeerEnv(lookup, func(name string) bool { return fs.Lookup(name) != nil })
	return append(pargs, args...), notes, err
}

// peerNotices writes the start-up notices of the peer's role: plain lines,
// or under --log-format json one WARN record each, with the variable and
// what weir does with it as attributes.
func peerNotices(stderr io.Writer, log *slog.Logger, jsonLog bool, notes []string) {
	for _, n := range notes {
		if jsonLog {
			name, how, _ := strings.Cut(n, ": ")
			log.Warn("weir serve: envoy-compat: not honoured as envoyproxy/ratelimit does", "variable", name, "detail", how)
			continue
		}
		fmt.Fprintln(stderr, "weir serve: envoy-compat: not honoured as envoyproxy/ratelimit does:", n)
	}
}

// asPeer rewrites the process's arguments when weir runs under the
// peer's name (Envoy Gateway's Deployment runs /bin/ratelimit).
// envoyproxy/ratelimit reads no arguments at all, and deployments made
// for it pass some (Envoy AI Gateway's passes
// --quotaRateLimitServiceAddr): under that name weir keeps the
// arguments that are weir serve's flags and drops the others, each
// named on stderr, rather than refuse to start.
func asPeer(argv []string, stderr io.Writer) []string {
	if len(argv) == 0 {
		return nil
	}
	if filepath.Base(argv[0]) != "ratelimit" {
		return argv[1:]
	}
	fs, _ := newServeFlagSet(io.Discard)
	out := []string{"serve", "--envoy-compat"}
	args := argv[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, hasValue := flagName(a)
		f := fs.Lookup(name)
		if f == nil {
			const msg = "weir serve: envoy-compat: argument ignored, as envoyproxy/ratelimit ignores its arguments (not a weir serve flag)"
			if strings.EqualFold(os.Getenv("LOG_FORMAT"), "json") {
				earlyLogger(stderr, "json").Warn(msg, "argument", a)
			} else {
				fmt.Fprintf(stderr, "%s: %q\n", msg, a)
			}
			continue
		}
		out = append(out, a)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) && i+1 < len(args) {
			i++
			out = append(out, args[i]) // the flag's value
		}
	}
	return out
}

// flagName returns the name of a command-line flag argument ("--x=1",
// "-x"), whether it carries its value, and "" for an argument that is
// not a flag.
func flagName(a string) (name string, hasValue bool) {
	if len(a) < 2 || a[0] != '-' || a == "--" {
		return "", false
	}
	a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	name, _, hasValue = strings.Cut(a, "=")
	return name, hasValue
}
