package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/events"
	"github.com/weir-dev/weir/store/guard"
)

// Failure policies: what a rule does while the store is failing.
const (
	OnErrorAllow = guard.Allow // admit the request (fail open)
	OnErrorDeny  = guard.Deny  // reject the request (fail closed)
	OnErrorLocal = guard.Local // decide with an in-process limiter: the limit divided by instances
)

// Missing-identity policies: what a rule does with a request that lacks
// the identity it counts by.
const (
	OnMissingSkip  = "skip"   // the rule does not apply to the request
	OnMissingDeny  = "deny"   // the request is refused with 403
	OnMissingUseIP = "use_ip" // the request is counted by its client IP
)

// Store types.
const (
	StoreMemory = "memory"
	StoreRedis  = "redis"
)

// Reporter receives the problems a check finds in a Config: Parse's, which
// places each at its line and column in the file, or a plain list for a
// Config built in Go.
type Reporter interface {
	// Add reports msg at the value of path, such as "rules[2].limit".
	Add(path, msg string)
	// AddKey reports msg at the key of path, for a problem with the
	// field's presence rather than its value.
	AddKey(path, msg string)
	// Where describes path's position, for messages such as "first at
	// line 3".
	Where(path string) string
}

func (w *walker) Add(path, msg string)     { w.addAt(path, msg) }
func (w *walker) AddKey(path, msg string)  { w.keyAt(path, msg) }
func (w *walker) Where(path string) string { return w.where(path) }

// Check reports to rep what is wrong with cfg's store, server and
// instance settings and with the rules' on_error, and fills in the store
// type and store.on_error (local) when they are left out. The rules
// themselves, the lists and the protect rules are the rules engine's to
// check (package policy).
func Check(cfg *Config, rep Reporter) {
	checkStore(cfg, rep)
	if cfg.Instances < 0 {
		rep.Add("instances", fmt.Sprintf("instances must be at least 1, got %d", cfg.Instances))
	}
	if cfg.InstancesFloor < 0 {
		rep.Add("instances_floor", fmt.Sprintf("instances_floor must be at least 1, got %d", cfg.InstancesFloor))
	}
	// server.grpc: off serves no gRPC, as weir serve --grpc off does.
	for _, s := range []struct {
		path, v string
		off     bool // "off" is allowed
	}{{"server.http", cfg.Server.HTTP, false}, {"server.grpc", cfg.Server.GRPC, true}, {"server.resp.addr", cfg.Server.RESP.Addr, false}} {
		if s.v == "" || s.off && s.v == GRPCOff {
			continue
		}
		if _, port, err := net.SplitHostPort(s.v); err != nil || !validPort(port) {
			or := ""
			if s.off {
				or = ", or off to serve none"
			}
			rep.Add(s.path, fmt.Sprintf("%s %s must be host:port or :port, such as :8080%s", lastName(s.path), quote(s.v), or))
		}
	}
	if t := cfg.Server.TLS; (t.Cert == "") != (t.Key == "") || (t.ClientCA != "" && t.Cert == "") {
		at := "server.tls.cert"
		if t.Cert == "" {
			at = "server.tls.key"
			if t.Key == "" {
				at = "server.tls.client_ca"
			}
		}
		rep.AddKey(at, "server.tls needs cert and key together (and client_ca only with them)")
	}
	switch cfg.Server.AuthHeaders {
	case "", AuthHeadersAuto, AuthHeadersOriginal, AuthHeadersForwarded:
	default:
		rep.Add("server.auth_headers", fmt.Sprintf("auth_headers %s is not a header family (want auto, original for X-Original-URI/Method/Host as nginx sends, or forwarded for X-Forwarded-Uri/Method/Host as Traefik and Caddy send)", quote(cfg.Server.AuthHeaders)))
	}
	if d := cfg.Server.EnvoyMaxOverridePeriod; d != 0 && (d < time.Second || d > algorithm.MaxPeriod*time.Microsecond) {
		shown := d.String()
		if d%(24*time.Hour) == 0 {
			shown = fmt.Sprintf("%dd", d/(24*time.Hour))
		}
		rep.Add("server.envoy_max_override_period", fmt.Sprintf("envoy_max_override_period %s is out of range (1s to 3660d, the longest period of a limit)", shown))
	}
	for i := range cfg.Rules {
		checkOnError(index("rules", i)+".on_error", cfg.Rules[i].OnError, rep)
	}
	checkEvents(cfg, rep)
}

// checkEvents checks the events section and the rules' events.
func checkEvents(cfg *Config, rep Reporter) {
	checkThresholds("events.thresholds", cfg.EventThresholds, rep)
	webhook := checkWebhook("events.webhook", cfg.EventWebhook, rep)
	if cfg.EventSecretEnv != "" && cfg.EventSecretFile != "" {
		rep.AddKey("events.secret_file", "events takes secret_env or secret_file, not both")
	}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		p := index("rules", i) + ".events"
		if !r.Events && (r.EventThresholds != nil || r.EventWebhook != "") {
			rep.Add(p, "thresholds and webhook need events on")
		}
		checkThresholds(p+".thresholds", r.EventThresholds, rep)
		if checkWebhook(p+".webhook", r.EventWebhook, rep) {
			webhook = true
		}
	}
	if webhook && cfg.EventSecretEnv == "" && cfg.EventSecretFile == "" {
		rep.AddKey("events.webhook", "webhooks are signed: events needs secret_env (the variable holding the secret) or secret_file")
	}
}

// checkThresholds checks a list of thresholds: ascending shares of the
// limit in (0, 1], at most events.MaxThresholds.
func checkThresholds(path string, ts []float64, rep Reporter) {
	if ts == nil {
		return
	}
	r := events.Rule{Thresholds: ts}
	if err := r.Check(); err != nil {
		rep.Add(path, strings.TrimPrefix(err.Error(), "events: "))
	}
}

// checkWebhook checks a webhook URL and reports whether there is one.
func checkWebhook(path, v string, rep Reporter) bool {
	if v == "" {
		return false
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		rep.Add(path, fmt.Sprintf("webhook %s must be an http:// or https:// URL", quote(redactURL(v))))
	}
	return true
}

// redactURL drops a URL's user information (a password) for a message.
func redactURL(v string) string {
	if u, err := url.Parse(v); err == nil && u.User != nil {
		u.User = nil
		return u.String()
	}
	return v
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 0 && n <= 65535
}

func checkStore(cfg *Config, rep Reporter) {
	s := &cfg.Store
	r := &s.Redis
	redisSet := len(r.Addrs) > 0 || r.MasterName != ""
	switch s.Type {
	case "":
		if redisSet {
			s.Type = StoreRedis
		} else {
			s.Type = StoreMemory
		}
	case StoreMemory:
		if redisSet {
			rep.Add("store.redis", "store.redis is set but store.type is memory; set type: redis or remove store.redis")
		}
	case StoreRedis:
		if len(r.Addrs) == 0 {
			rep.Add("store.type", "store.type redis needs store.redis.addrs")
		}
	default:
		rep.Add("store.type", fmt.Sprintf("unknown store type %s (want memory or redis)", quote(s.Type)))
	}
	for i, a := range r.Addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || !validPort(port) || port == "0" {
			rep.Add(index("store.redis.addrs", i), fmt.Sprintf("redis address %s must be host:port, such as 127.0.0.1:6379", quote(a)))
		}
	}
	if r.Password != "" && r.PasswordEnv != "" {
		rep.AddKey("store.redis.password_env", "password and password_env are exclusive; use one")
	}
	if (r.TLSCert == "") != (r.TLSKey == "") {
		at := "store.redis.tls_cert"
		if r.TLSCert == "" {
			at = "store.redis.tls_key"
		}
		rep.AddKey(at, "tls_cert and tls_key go together: set both or neither")
	}
	if r.DB < 0 {
		rep.Add("store.redis.db", fmt.Sprintf("db must be at least 0, got %d", r.DB))
	}
	if len(r.Addrs) > 1 && r.MasterName == "" && r.DB != 0 {
		rep.Add("store.redis.db", fmt.Sprintf("db %d cannot be used with Redis Cluster (several addrs without master_name), which has only db 0", r.DB))
	}
	if r.MaxInFlight < 0 {
		rep.Add("store.redis.max_in_flight", fmt.Sprintf("max_in_flight must be at least 1, got %d", r.MaxInFlight))
	}
	if r.Linger != nil && (*r.Linger < 0 || *r.Linger > MaxLinger) {
		rep.Add("store.redis.linger", fmt.Sprintf("linger must be 0 to %v, got %v", MaxLinger, *r.Linger))
	}
	if r.MaxBatch < 0 || r.MaxBatch > 1000 {
		rep.Add("store.redis.max_batch", fmt.Sprintf("max_batch must be 1 to 1000, got %d", r.MaxBatch))
	}
	if msg := checkRedisPrefix(r.Prefix); msg != "" {
		rep.Add("store.redis.prefix", msg)
	}
	if s.Timeout < 0 {
		rep.Add("store.timeout", fmt.Sprintf("timeout must be positive, got %v", s.Timeout))
	}
	checkOnError("store.on_error", s.OnError, rep)
	if s.OnError == "" {
		s.OnError = OnErrorLocal
	}
	if s.MaxKeys < 0 {
		rep.Add("store.max_keys", fmt.Sprintf("max_keys must be at least 1, got %d", s.MaxKeys))
	}
	if s.DenyCacheSize < 0 || s.DenyCacheSize > maxDenyCacheSize {
		rep.Add("store.deny_cache_size", fmt.Sprintf("deny_cache_size must be 1 to %d, got %d", maxDenyCacheSize, s.DenyCacheSize))
	}
	b := s.Breaker
	if b.Failures < 0 || b.MinRequests < 0 || b.FailureRatio < 0 || b.FailureRatio > 1 || b.Window < 0 || b.Cooldown < 0 {
		rep.Add("store.breaker", "breaker settings must not be negative, and failure_ratio must be at most 1")
	}
}

func checkOnError(path, v string, rep Reporter) {
	switch v {
	case "", OnErrorAllow, OnErrorDeny, OnErrorLocal:
		return
	}
	rep.Add(path, fmt.Sprintf("unknown on_error %s (want allow, deny or local)", quote(v)))
}

// checkRedisPrefix returns what is wrong with a store.redis.prefix, or "".
func checkRedisPrefix(p string) string {
	if len(p) > maxRedisPrefix {
		return fmt.Sprintf("prefix %s is %d bytes; the limit is %d", quote(p), len(p), maxRedisPrefix)
	}
	if strings.ContainsAny(p, "{}") {
		return fmt.Sprintf("prefix %s must not contain a brace: braces set the Redis Cluster hash tag of every key", quote(p))
	}
	for _, c := range p {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_-.:/", c)) {
			return fmt.Sprintf("prefix %s may hold only letters, digits and _ - . : /, not %q", quote(p), c)
		}
	}
	return ""
}
