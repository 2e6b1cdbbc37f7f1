// Package config is weir.yaml's schema: the Config types, their YAML
// decoding (Parse) and the checks of the store and server sections
// (Check). Package policy checks the rules and runs them.
package config

import (
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/protect"
	"github.com/weir-dev/weir/store/guard"
)

// Config is weir.yaml, the file docs/configuration.md describes. Parse and
// LoadFile fill it in from YAML and validate it; a Config built in Go is
// validated by New.
type Config struct {
	Store  StoreConfig
	Server ServerConfig
	// TrustedProxies lists the CIDRs of the proxies in front of weir, whose
	// X-Forwarded-For and X-Real-IP headers are believed (see ClientIP).
	TrustedProxies []string
	// ClientIPHeader names the header that carries the client address
	// from the trusted proxies (see clientip.From): "auto" (or empty, the
	// default), "X-Forwarded-For", "X-Real-IP", or any header a proxy
	// sets, such as CF-Connecting-IP or True-Client-IP.
	ClientIPHeader string
	Headers        HeadersConfig
	// Shadow makes every rule a shadow rule: evaluated and reported, never
	// blocking.
	Shadow bool
	// NearLimit is the share of a limit at or past which an admitted
	// decision counts as near the limit (see NearLimit): a percentage such
	// as "80%" or a fraction such as "0.8", above 0 and at most 100%;
	// "off" or 0 turns it off. Empty means DefaultNearLimit. A rule's own
	// near_limit overrides it.
	NearLimit string
	// Instances is how many weir instances (or application replicas) share
	// the store; the local fallback enforces each limit divided by it,
	// rounded up. 0 means 1.
	Instances int
	// InstancesAuto (the file's instances: auto) takes the instance count
	// from the fleet registry weir serve keeps in Redis instead of
	// Instances: every instance that reported within the last seconds
	// (docs/operations.md gives the reaction times), never fewer than
	// InstancesFloor. A Policy gets the live count through WithInstances;
	// without it (a library, or no Redis) the floor is the count.
	InstancesAuto bool
	// InstancesFloor is the least instance count instances: auto uses
	// (0 means 1), so that a fleet still learning of its members, or an
	// unreadable registry, never makes each instance's share too large.
	InstancesFloor int
	// Rules are the rate-limit rules, in the order they are evaluated.
	Rules []RuleConfig
	// Protect are the overload-protection rules (concurrency limits,
	// priority shedding, breakers), applied in order to the requests the
	// rate limits admitted; System protects the whole process.
	Protect []ProtectConfig
	System  SystemConfig
	// Allow and Deny list the CIDRs (or bare addresses) of clients that are
	// never limited, or always refused with 403. Deny wins over Allow.
	Allow, Deny []string
	// AllowValues and DenyValues list identity values that are never
	// limited, or always refused: the file's {identity, values} entries in
	// allow and deny.
	AllowValues, DenyValues []ValueList
	// Prices is the price table that budget and cost_expr rules price
	// token usage by; nil for none.
	Prices *PricesConfig
	// EventWebhook (events.webhook) is the URL weir serve posts the
	// events of rules with events to, unless a rule names its own; ""
	// for none. EventSecretEnv names the environment variable, or
	// EventSecretFile the file, holding the secret webhooks are signed
	// with; one of them is required with any webhook.
	EventWebhook, EventSecretEnv, EventSecretFile string
	// EventThresholds (events.thresholds) are the shares of the limit
	// whose crossing a rule with events records, unless it lists its own;
	// nil means 0.8, 0.95 and 1.0.
	EventThresholds []float64
}

// StoreConfig is the store section: where limiter state lives and what
// happens when it cannot be reached.
type StoreConfig struct {
	// Type is "memory" or "redis". Left empty, Parse and New set it:
	// "redis" when Redis.Addrs is set, else "memory".
	Type  string
	Redis RedisConfig
	// Timeout is the deadline of every store call (default 50ms).
	Timeout time.Duration
	// OnError is the default failure policy of every rule: "allow",
	// "deny" or "local" (the default, which Check fills in).
	OnError string
	// Breaker tunes the circuit breaker around the store.
	Breaker guard.BreakerConfig
	// MaxKeys bounds the memory store (default memstore.DefaultMaxKeys).
	MaxKeys int
	// DenyCache turns the exact local deny cache in front of the Redis
	// store on (nil or true, the default) or off (false):
	// store.deny_cache. See package store/denycache.
	DenyCache *bool
	// DenyCacheSize bounds the deny cache's entries (default
	// denycache.DefaultSize, 100,000): store.deny_cache_size.
	DenyCacheSize int
}

// maxDenyCacheSize bounds store.deny_cache_size (denycache.MaxSize).
const maxDenyCacheSize = 100_000_000

// DenyCacheOn reports whether the deny cache is on: unless deny_cache is
// false.
func (s StoreConfig) DenyCacheOn() bool { return s.DenyCache == nil || *s.DenyCache }

// RedisConfig is store.redis. Several Addrs without MasterName mean Redis
// Cluster; MasterName means Sentinel, with Addrs the sentinels.
type RedisConfig struct {
	Addrs      []string
	MasterName string
	Username   string
	// Password is never logged: String and LogValue redact it. Prefer
	// PasswordEnv, which names an environment variable holding it.
	Password    string `json:"-"`
	PasswordEnv string
	TLS         bool
	// TLSCA, TLSCert and TLSKey are PEM files: the CA that the servers'
	// certificates must chain to (default: the system's roots), and a
	// client certificate and key for servers that require one
	// (tls-auth-clients). Any of them turns TLS on. The client
	// certificate is re-read when its files change.
	TLSCA, TLSCert, TLSKey string
	// TLSServerName is the name the servers' certificates must carry
	// (default: the host dialled).
	TLSServerName string
	DB            int
	// MaxInFlight and MaxBatch tune how the store coalesces decisions on
	// a standalone or Sentinel Redis: at most MaxInFlight calls out at
	// once, and decisions that come meanwhile leave together, up to
	// MaxBatch per call (MaxBatch 1: every decision alone). Zero takes
	// redisstore's defaults (2 and 64).
	MaxInFlight int
	MaxBatch    int
	// Linger is how long a decision that finds a call to Redis free waits
	// for others to go with it (redisstore.Config.Linger): bigger calls
	// cost Redis less per decision, for up to Linger more latency. Nil
	// takes DefaultLinger; 0 never waits; at most MaxLinger.
	Linger *time.Duration
	// Prefix starts the name of every key weir writes in Redis: the
	// limiter state, and weir serve's penalty-box index, fleet reports
	// and stored rules (default "weir"). Deployments that share a Redis
	// need different prefixes to share nothing. At most 64 characters of
	// letters, digits and _ - . : /; no braces (they would set the
	// cluster hash tag).
	Prefix string
}

// DefaultLinger is store.redis.linger when unset: a decision that finds a
// call to Redis free, less than 1ms after the decision before it, waits up
// to 1ms for company. Under weir serve's flood it made calls 1.5-2x bigger
// and cut Redis CPU per decision by about a fifth, where 200µs changed
// nothing (docs/benchmarks.md, "Floods").
const DefaultLinger = time.Millisecond

// MaxLinger bounds store.redis.linger (redisstore.MaxLinger).
const MaxLinger = 10 * time.Millisecond

// LingerValue returns Linger, or DefaultLinger if unset.
func (r RedisConfig) LingerValue() time.Duration {
	if r.Linger == nil {
		return DefaultLinger
	}
	return *r.Linger
}

// InstancesAuto, as instances, takes the instance count from the fleet
// registry (Config.InstancesAuto).
const InstancesAuto = "auto"

// maxRedisPrefix is the longest store.redis.prefix.
const maxRedisPrefix = 64

// PasswordValue returns Password, or the value of the environment variable
// PasswordEnv names.
func (r RedisConfig) PasswordValue() string {
	if r.PasswordEnv != "" {
		return os.Getenv(r.PasswordEnv)
	}
	return r.Password
}

// TLSOn reports whether connections to Redis use TLS: tls, or any of the
// TLS files or the server name, is set.
func (r RedisConfig) TLSOn() bool {
	return r.TLS || r.TLSCA != "" || r.TLSCert != "" || r.TLSKey != "" || r.TLSServerName != ""
}

// String renders r with the password redacted.
func (r RedisConfig) String() string {
	pw := ""
	if r.Password != "" {
		pw = "[redacted]"
	}
	return fmt.Sprintf("{Addrs:%v MasterName:%s Username:%s Password:%s PasswordEnv:%s TLS:%t DB:%d MaxInFlight:%d MaxBatch:%d Linger:%v Prefix:%s}",
		r.Addrs, r.MasterName, r.Username, pw, r.PasswordEnv, r.TLS, r.DB, r.MaxInFlight, r.MaxBatch, r.LingerValue(), r.Prefix)
}

// GoString is String, so that %#v does not leak the password either.
func (r RedisConfig) GoString() string { return "config.RedisConfig" + r.String() }

// LogValue implements slog.LogValuer with the password redacted.
func (r RedisConfig) LogValue() slog.Value {
	attrs := []slog.Attr{slog.Any("addrs", r.Addrs)}
	if r.MasterName != "" {
		attrs = append(attrs, slog.String("master_name", r.MasterName))
	}
	if r.Username != "" {
		attrs = append(attrs, slog.String("username", r.Username))
	}
	if r.Password != "" {
		attrs = append(attrs, slog.String("password", "[redacted]"))
	}
	if r.PasswordEnv != "" {
		attrs = append(attrs, slog.String("password_env", r.PasswordEnv))
	}
	attrs = append(attrs, slog.Bool("tls", r.TLSOn()), slog.Int("db", r.DB))
	if r.MaxInFlight != 0 {
		attrs = append(attrs, slog.Int("max_in_flight", r.MaxInFlight))
	}
	if r.MaxBatch != 0 {
		attrs = append(attrs, slog.Int("max_batch", r.MaxBatch))
	}
	if r.Linger != nil {
		attrs = append(attrs, slog.Duration("linger", *r.Linger))
	}
	if r.Prefix != "" {
		attrs = append(attrs, slog.String("prefix", r.Prefix))
	}
	return slog.GroupValue(attrs...)
}

// GRPCOff, as server.grpc, serves no gRPC.
const GRPCOff = "off"

// ServerConfig is the server section, read by weir serve.
type ServerConfig struct {
	HTTP string // listen address of the HTTP API (default ":8080")
	GRPC string // listen address of the Envoy gRPC service (default ":8081"); GRPCOff for none
	// AdminTokenEnv names the environment variable holding the admin API's
	// bearer token; without it the admin API is off.
	AdminTokenEnv string
	// TLS, when its Cert and Key are set, makes the HTTP and gRPC
	// listeners speak TLS only.
	TLS ServerTLSConfig
	// AuthHeaders names the header family that describes the original
	// request on GET /v1/auth: AuthHeadersAuto (or empty, the default),
	// AuthHeadersOriginal or AuthHeadersForwarded.
	AuthHeaders string
	// EnvoyMaxOverridePeriod is the longest period (unit times
	// unit_multiplier) an Envoy limit override may have; a longer one is
	// refused as a bad request. 0 means a day.
	EnvoyMaxOverridePeriod time.Duration
	// RESP is server.resp: the Redis-protocol listener, off unless its
	// Addr is set.
	RESP ServerRESPConfig
}

// ServerRESPConfig is server.resp: weir serve answering CL.THROTTLE, GCRA
// and WEIR.CHECK over the Redis protocol.
type ServerRESPConfig struct {
	// Addr is the listen address, such as ":6380"; empty for none.
	Addr string
	// Token, when set, must be given with AUTH before any other command.
	Token string
	// TLS says whether the listener speaks TLS with server.tls's
	// certificate; nil follows server.tls (TLS when it names a
	// certificate).
	TLS *bool
}

// ServerTLSConfig is server.tls: PEM files for weir serve's listeners,
// re-read when they change (no restart when cert-manager rotates them).
type ServerTLSConfig struct {
	Cert, Key string
	// ClientCA, when set, turns on mutual TLS: clients must present a
	// certificate that chains to it.
	ClientCA string
}

// Header families of GET /v1/auth (ServerConfig.AuthHeaders).
const (
	// AuthHeadersAuto takes whichever family the auth request carries and
	// refuses one carrying both that disagree on the URI, method or host.
	AuthHeadersAuto = "auto"
	// AuthHeadersOriginal reads X-Original-URI, X-Original-Method and
	// X-Original-Host, as nginx's auth_request is configured to send, and
	// ignores X-Forwarded-Uri, -Method and -Host.
	AuthHeadersOriginal = "original"
	// AuthHeadersForwarded reads X-Forwarded-Uri, X-Forwarded-Method and
	// X-Forwarded-Host, as Traefik's forwardAuth and Caddy's forward_auth
	// send, and ignores X-Original-URI, -Method and -Host.
	AuthHeadersForwarded = "forwarded"
)

// HeadersConfig is the headers section: which rate-limit headers responses carry.
type HeadersConfig struct {
	// Legacy adds X-RateLimit-Limit, -Remaining and -Reset to the IETF
	// draft's RateLimit and RateLimit-Policy.
	Legacy bool
}

// RuleConfig is one entry of rules.
type RuleConfig struct {
	// Name identifies the rule in keys, headers, metrics and the APIs:
	// letters, digits, '.', '_' and '-'.
	Name  string
	Match MatchConfig
	// Identity is what the rule counts by: one spec such as "ip" or
	// "header:X-API-Key", or several for a composite key. Empty means ip.
	Identity []string
	// OnMissing is what a request without the identity gets: "skip" (the
	// rule does not apply, the default), "deny" (403) or "use_ip" (count it
	// by client IP instead).
	OnMissing string
	// Limit is the limit in weir.ParseLimit syntax, such as "5/15m"; empty
	// when Tiers is set.
	Limit     string
	Algorithm string // default gcra
	Burst     int64
	// Block is the penalty box: after a rejection the identity stays
	// rejected this long.
	Block time.Duration
	// BlockList is block written as a list, [1m, 10m, 1h]: escalating
	// penalty boxes (weir.Limit.Escalate), Block being the first; nil
	// for a single box.
	BlockList []time.Duration
	// ForgetAfter is how long after a box ends an escalating penalty's
	// history lasts (weir.Limit.ForgetAfter).
	ForgetAfter time.Duration
	// Timezone and ResetAt place a calendar limit's windows (10000/month,
	// /week, or /day with either set): an IANA zone name ("" is UTC) and
	// the local time of day a window starts, "HH:MM" or "HH:MM:SS". Tiers
	// inherit them.
	Timezone string
	ResetAt  string
	// Warmup is a token_bucket's or gcra's cold start
	// (weir.Limit.Warmup); tiers inherit it.
	Warmup time.Duration
	// MaxDelay and DelayAfter make a leaky_bucket shape instead of police
	// (weir.Limit's fields of the same names).
	MaxDelay   time.Duration
	DelayAfter int64
	// Buckets splits a sliding_window's period into this many sub-windows
	// (weir.Limit.Buckets): 2 to 60, dividing the period into whole
	// microseconds; 0 for the plain window.
	Buckets int64
	// Tiers picks the limit by a request attribute; nil for one limit.
	Tiers *TiersConfig
	// Shadow evaluates and reports the rule but never blocks.
	Shadow bool
	// NearLimit overrides the global near_limit for this rule, in the same
	// syntax; empty inherits it.
	NearLimit string
	// OnError overrides the global failure policy for this rule.
	OnError string
	// LocalBudget (local_budget: N) lets an instance take up to this many
	// units of the limit at once from the store and spend them locally
	// (package store/localbudget): one store call per LocalBudget
	// decisions on a hot key. Only fixed_window and sliding_window accept
	// it, without block; 0 (the default) is off. docs/algorithms.md states
	// what it costs in under-admission. lease: N, its former name, still
	// works.
	LocalBudget int64
	// budgetKey is the key LocalBudget was written with: "local_budget",
	// or "lease", the former name; validation messages use it.
	budgetKey string
	// Cost is what one request costs (the estimate it takes before the
	// handler runs): "header:NAME" or "query:NAME" (a whole number the
	// request carries, 0 up to the most the limit can admit at once; absent
	// is 1), or a constant such as "5". Empty is 1. The handler settles the
	// real cost with httplimit.Charge.
	Cost string
	// Count, when set, counts only the responses it names: the request
	// peeks before the handler (rejected if the key is used up) and is
	// debited after it when its status is listed.
	Count *CountConfig
	// Budget makes the rule count money: "10 USD/month", "25 EUR/day"
	// (an amount with at most 6 decimals, the currency of prices, and a
	// period as in limit, with timezone and reset_at). The rule counts
	// micro-units in a fixed_window; a request's estimate is priced from
	// its usage estimate (policy.WithUsage) and settled from its reported
	// usage (Charges.Usage). Exclusive with limit, tiers, cost and count.
	Budget string
	// CostExpr prices a request's usage with a CEL expression of type int
	// (docs/budgets.md lists its variables) instead of the price table's
	// sum; empty: the table's sum for a budget rule.
	CostExpr string
	// Events (events: on, or a mapping) makes the rule's decisions record
	// threshold events: EventThresholds (nil: the global ones) and the
	// first refusal in a window, delivered to EventWebhook (""; the
	// global one).
	Events          bool
	EventThresholds []float64
	EventWebhook    string
}

// LocalBudgetKey is the key LocalBudget was written with: "local_budget",
// "lease" (its former name), or "" for a Config built in Go.
func (r *RuleConfig) LocalBudgetKey() string { return r.budgetKey }

// CountConfig says which responses a rule counts (count: in weir.yaml).
type CountConfig struct {
	// Status lists the response statuses that count, such as [401, 403].
	Status []int
}

// MatchConfig selects the requests a rule applies to. Empty fields match
// everything.
type MatchConfig struct {
	// Methods lists HTTP methods; GET also matches HEAD, as in http.ServeMux.
	Methods []string
	// Path is a Go 1.22 http.ServeMux path pattern: "/api/login" (exact),
	// "/api/" (the subtree), "/users/{id}", "/files/{path...}", "/{$}".
	Path string
	// Host matches the request's host, port ignored: "api.example.com", or
	// "*.example.com" for any subdomain.
	Host string
}

// TiersConfig is a rule's tiers: the value of By picks a tier by name, and
// a request without a value, or with one that names no tier, gets the tier
// named "default".
type TiersConfig struct {
	By    string       // an identity spec, such as header:X-Plan
	Tiers []TierConfig // in file order; one is named "default"
}

// TierConfig is one tier. Algorithm and Block default to the rule's (a
// rule's block list and forget_after too, when the tier sets no block).
type TierConfig struct {
	Name       string
	Limit      string
	Algorithm  string
	Burst      int64
	Block      time.Duration
	MaxDelay   time.Duration
	DelayAfter int64
	Buckets    int64
}

// ValueList is an allow or deny entry that lists identity values, such as
// {identity: header:X-API-Key, values: [k1, k2]}.
type ValueList struct {
	Identity string
	Values   []string
}

// Problem is one thing wrong with a config, with where it is when the
// config came from YAML (Line and Column count from 1; 0 when unknown).
type Problem struct {
	Line, Column int
	// Path names the field, such as "rules[2].limit".
	Path    string
	Message string
}

// Error lists every problem found in a config.
type Error struct {
	File     string
	Problems []Problem
}

// Error renders one problem per line as "file:line:col: message", the
// form editors and CI annotate.
func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.format(e.File))
	}
	return b.String()
}

func (p Problem) format(file string) string {
	if file == "" {
		file = "config"
	}
	switch {
	case p.Line > 0 && p.Column > 0:
		return fmt.Sprintf("%s:%d:%d: %s", file, p.Line, p.Column, p.Message)
	case p.Line > 0:
		return fmt.Sprintf("%s:%d: %s", file, p.Line, p.Message)
	case p.Path != "":
		return fmt.Sprintf("%s: %s: %s", file, p.Path, p.Message)
	}
	return fmt.Sprintf("%s: %s", file, p.Message)
}

// Lines returns Error's lines, one per problem.
func (e *Error) Lines() []string {
	out := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p.format(e.File)
	}
	return out
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].Line != ps[j].Line {
			return ps[i].Line < ps[j].Line
		}
		return ps[i].Column < ps[j].Column
	})
}

// Empty reports whether e is the refusal of an empty file (Parse).
func (e *Error) Empty() bool {
	return len(e.Problems) == 1 && e.Problems[0].Message == emptyConfig
}

// Parse decodes a weir.yaml held in data and checks it (Check), then runs
// each of checks on it; filename is used in error messages. On failure
// the error is an *Error that lists every problem found, each with its
// line and column. policy.Parse and policy.LoadFile add the rules
// engine's checks: use them to load a file.
func Parse(data []byte, filename string, checks ...func(*Config, Reporter)) (*Config, error) {
	w := newWalker()
	cfg := w.document(data)
	if cfg != nil {
		Check(cfg, w)
		for _, c := range checks {
			c(cfg, w)
		}
	}
	if len(w.problems) > 0 {
		sortProblems(w.problems)
		return nil, &Error{File: filename, Problems: w.problems}
	}
	return cfg, nil
}

func quote(s string) string { return strconv.Quote(s) }

// ProtectConfig is one entry of protect: overload protection for the
// requests it matches (package protect). Concurrency or Adaptive sets a
// concurrency limit, Breaker a circuit breaker; a rule may have both.
type ProtectConfig struct {
	// Name identifies the rule in rejections ({"protect": name}), metrics
	// and the dashboard: letters, digits, '.', '_' and '-'.
	Name  string
	Match MatchConfig
	// Concurrency is a fixed limit of requests in flight; the file's
	// concurrency: adaptive sets Adaptive instead, a limit learned from
	// latency between MinConcurrency (default 1) and MaxConcurrency
	// (default 1000).
	Concurrency                    int
	Adaptive                       bool
	MinConcurrency, MaxConcurrency int
	// Priority names where a request's priority comes from: "header:NAME",
	// whose value is critical, normal or sheddable (anything else is
	// normal). Empty: every request is normal, and none is critical.
	Priority string
	// MaxWait is how long a critical request that finds the limit full
	// waits for the next slot freed; 0: under an adaptive limit, the
	// unloaded latency the limit measured, otherwise no wait.
	MaxWait time.Duration
	// Reserve is the share of the limit only critical requests may use,
	// such as "20%" or "0.2"; below 100%.
	Reserve string
	// Breaker adds a circuit breaker.
	Breaker *protect.BreakerConfig
	// Shadow counts and reports what the rule would shed, and sheds
	// nothing. The top-level shadow makes every protect rule a shadow one.
	Shadow bool
}

// SystemConfig is the system section: protection of the whole process,
// applied to every request before the protect rules.
type SystemConfig struct {
	// MaxCPU is the process's CPU use, as a share of GOMAXPROCS such as
	// "85%", above which requests are admitted only while in flight stays
	// under the measured throughput × minimum latency (BBR-style). Empty:
	// off.
	MaxCPU string
	// MaxInFlight caps the requests in flight; 0: no cap.
	MaxInFlight int
}
