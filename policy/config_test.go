package policy

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
)

// sketch is the config sketched in DESIGN.md.
const sketch = `
store:
  type: memory               # memory (default) | redis
  timeout: 50ms
  on_error: local
server: { http: ":8080", grpc: ":8081", admin_token_env: WEIR_ADMIN_TOKEN }
trusted_proxies: [10.0.0.0/8, 127.0.0.1/32]
rules:
  - name: login
    match: { methods: [POST], path: /api/login }
    identity: [ip]
    limit: 5/15m
    algorithm: sliding_log
    block: 15m
  - name: api
    match: { path: /api/ }
    identity: [header:X-API-Key]
    tiers:
      by: header:X-Plan
      default: { limit: 100/m, algorithm: gcra, burst: 20 }
      pro:     { limit: 5000/m, algorithm: gcra, burst: 500 }
    shadow: false
allow: [127.0.0.1/32]
deny:  [203.0.113.0/24]
`

func TestParseSketch(t *testing.T) {
	cfg, err := Parse([]byte(sketch), "weir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := &config.Config{
		Store:          config.StoreConfig{Type: "memory", Timeout: 50 * time.Millisecond, OnError: "local"},
		Server:         config.ServerConfig{HTTP: ":8080", GRPC: ":8081", AdminTokenEnv: "WEIR_ADMIN_TOKEN"},
		TrustedProxies: []string{"10.0.0.0/8", "127.0.0.1/32"},
		Rules: []config.RuleConfig{
			{Name: "login", Match: config.MatchConfig{Methods: []string{"POST"}, Path: "/api/login"}, Identity: []string{"ip"},
				Limit: "5/15m", Algorithm: "sliding_log", Block: 15 * time.Minute},
			{Name: "api", Match: config.MatchConfig{Path: "/api/"}, Identity: []string{"header:X-API-Key"},
				Tiers: &config.TiersConfig{By: "header:X-Plan", Tiers: []config.TierConfig{
					{Name: "default", Limit: "100/m", Algorithm: "gcra", Burst: 20},
					{Name: "pro", Limit: "5000/m", Algorithm: "gcra", Burst: 500},
				}}},
		},
		Allow: []string{"127.0.0.1/32"},
		Deny:  []string{"203.0.113.0/24"},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Parse:\n got %+v\nwant %+v", cfg, want)
	}
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	rules := p.Rules()
	if len(rules) != 2 || rules[0].Limit != "5/15m" || rules[0].Algorithm != "sliding_log" || rules[0].Block != "15m0s" ||
		rules[1].TierBy != "header:X-Plan" || len(rules[1].Tiers) != 2 || rules[1].Tiers[1].Limit != "5000/m burst 500" {
		t.Fatalf("Rules() = %+v", rules)
	}
}

func TestParseEverything(t *testing.T) {
	const doc = `
store:
  type: redis
  redis:
    addrs: 10.1.1.1:6379
    master_name: mymaster
    username: weir
    password_env: REDIS_PASSWORD
    tls: true
    db: 2
    max_in_flight: 4
    max_batch: 32
    linger: 1ms
  timeout: 20ms
  on_error: deny
  max_keys: 1000
  breaker: {failures: 3, failure_ratio: 0.25, min_requests: 10, window: 5s, cooldown: 2s}
headers: {legacy: true}
shadow: true
near_limit: 85%
instances: 4
x-anchors:
rules:
  - name: r1
    match: {methods: get, host: "*.example.com"}
    identity: header:X-User
    on_missing: use_ip
    limit: 10/s
    algorithm: leaky_bucket
    max_delay: 500ms
    delay_after: 2
    on_error: allow
    near_limit: 0.5
allow:
  - 10.0.0.1
  - {identity: header:X-API-Key, values: [internal]}
deny:
  - {identity: query:token, values: [revoked1, revoked2]}
`
	_, err := Parse([]byte(doc), "all.yaml")
	var ce *config.Error
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Message != `unknown field "x-anchors" in the top level (want one of store, server, trusted_proxies, client_ip_header, headers, shadow, near_limit, instances, instances_floor, rules, protect, system, allow, deny, prices, events)` {
		t.Fatalf("got %v", err)
	}
	cfg, err := Parse([]byte(strings.Replace(doc, "x-anchors:\n", "", 1)), "all.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lingerWant := time.Millisecond
	want := &config.Config{
		Store: config.StoreConfig{Type: "redis", Redis: config.RedisConfig{Addrs: []string{"10.1.1.1:6379"}, MasterName: "mymaster", Username: "weir", PasswordEnv: "REDIS_PASSWORD", TLS: true, DB: 2, MaxInFlight: 4, MaxBatch: 32, Linger: &lingerWant},
			Timeout: 20 * time.Millisecond, OnError: "deny", MaxKeys: 1000,
			Breaker: guard.BreakerConfig{Failures: 3, FailureRatio: 0.25, MinRequests: 10, Window: 5 * time.Second, Cooldown: 2 * time.Second}},
		Headers:   config.HeadersConfig{Legacy: true},
		Shadow:    true,
		NearLimit: "85%",
		Instances: 4,
		Rules: []config.RuleConfig{{Name: "r1", Match: config.MatchConfig{Methods: []string{"get"}, Host: "*.example.com"}, Identity: []string{"header:X-User"},
			OnMissing: "use_ip", Limit: "10/s", Algorithm: "leaky_bucket", MaxDelay: 500 * time.Millisecond, DelayAfter: 2, OnError: "allow", NearLimit: "0.5"}},
		Allow:       []string{"10.0.0.1"},
		AllowValues: []config.ValueList{{Identity: "header:X-API-Key", Values: []string{"internal"}}},
		DenyValues:  []config.ValueList{{Identity: "query:token", Values: []string{"revoked1", "revoked2"}}},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Parse:\n got %+v\nwant %+v", cfg, want)
	}
	t.Setenv("REDIS_PASSWORD", "s3cret")
	if got := cfg.Store.Redis.PasswordValue(); got != "s3cret" {
		t.Fatalf("PasswordValue = %q", got)
	}
}

// TestParseEmpty: an empty file is refused (it is most often one caught
// mid-rewrite); no rules at all must be written out as rules: [].
func TestParseEmpty(t *testing.T) {
	for _, doc := range []string{"rules: []\n", "# no rules yet\nrules: []\n"} {
		cfg, err := Parse([]byte(doc), "e.yaml")
		if err != nil || len(cfg.Rules) != 0 || cfg.Store.Type != "memory" || cfg.Store.OnError != "local" {
			t.Fatalf("%q: %+v, %v", doc, cfg, err)
		}
	}
	for _, doc := range []string{"", "  \n\n", "# nothing\n", "---\n", "~\n", "null\n", "# a\n---\n# b\n"} {
		cfg, err := Parse([]byte(doc), "e.yaml")
		var ce *config.Error
		if err == nil || !errors.As(err, &ce) {
			t.Fatalf("%q: want a config.Error, got %+v, %v", doc, cfg, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "e.yaml") || !strings.Contains(msg, "empty") || !strings.Contains(msg, "rules: []") {
			t.Fatalf("%q: the error does not say why: %v", doc, msg)
		}
	}
}

// TestParseAliases checks YAML anchors, aliases and merge keys.
func TestParseAliases(t *testing.T) {
	const doc = `
rules:
  - name: a
    match: &m {path: /a, methods: [POST]}
    limit: &l 5/m
  - name: b
    match: *m
    limit: *l
    tiers: &tiers
      by: header:X-Plan
      default: &def {limit: 10/m, algorithm: token_bucket}
      pro:
        <<: *def
        limit: 100/m
`
	_, err := Parse([]byte(doc), "a.yaml")
	want := "a.yaml:8:5: limit and tiers are exclusive; put this limit in tiers.default"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	cfg, err := Parse([]byte(strings.Replace(doc, "    limit: *l\n", "", 1)), "a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules[1].Match.Path != "/a" || cfg.Rules[1].Tiers.Tiers[1] != (config.TierConfig{Name: "pro", Limit: "100/m", Algorithm: "token_bucket"}) {
		t.Fatalf("%+v", cfg.Rules[1])
	}
}

func TestParseAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("x0: &a0 {type: memory}\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, "x%d: &a%d {<<: [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]}\n")
	}
	b.WriteString("store: *a9\n")
	done := make(chan error, 1)
	go func() {
		_, err := Parse([]byte(b.String()), "bomb.yaml")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "the document expands to too many nodes through aliases") {
			t.Fatalf("got %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("an alias bomb is still being expanded after 20s")
	}
}

// TestParseProblems is the table of bad configs: each gives exactly these
// problems, in this order, with line and column.
func TestParseProblems(t *testing.T) {
	rule := func(body string) string { return "rules:\n  - name: r\n" + body }
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"unknown top-level field", "rulez: []\n",
			[]string{`1:1: unknown field "rulez" in the top level (did you mean "rules"?)`}},
		{"unknown rule field", rule("    limt: 5/m\n"),
			[]string{`2:5: rule "r" needs a limit (such as limit: 100/m) or tiers`, `3:5: unknown field "limt" in rule (did you mean "limit"?)`}},
		{"unknown deep field", "store:\n  redis:\n    adrs: [a:1]\n",
			[]string{`3:5: unknown field "adrs" in store.redis (did you mean "addrs"?)`}},
		{"unknown tier field", rule("    tiers:\n      by: header:X-Plan\n      default: {limit: 5/m, brust: 3}\n"),
			[]string{`5:29: unknown field "brust" in tier "default" (did you mean "burst"?)`}},
		{"unknown match field", rule("    limit: 5/m\n    match: {paths: [/a]}\n"),
			[]string{`4:13: unknown field "paths" in match (did you mean "path"?)`}},
		{"bad limit", rule("    limit: 5/x\n"),
			[]string{`3:12: invalid limit "5/x": period "x" is not a duration (use s, m, h, d, 30s, 15m, 7d)`}},
		{"bad limit rate", rule("    limit: many/m\n"),
			[]string{`3:12: invalid limit "many/m": rate "many" is not a whole number`}},
		{"limit without slash", rule("    limit: 100\n"),
			[]string{`3:12: invalid limit "100": missing '/'; want RATE/PERIOD such as 100/m`}},
		{"unknown algorithm", rule("    limit: 5/m\n    algorithm: gcrA\n"),
			[]string{`4:16: unknown algorithm "gcrA" (did you mean "gcra"?)`}},
		{"burst on fixed_window", rule("    limit: 5/m\n    algorithm: fixed_window\n    burst: 10\n"),
			[]string{`5:12: burst applies only to token_bucket, leaky_bucket and gcra, not fixed_window`}},
		{"burst in limit on sliding_log", rule("    limit: 5/m burst 2\n    algorithm: sliding_log\n"),
			[]string{`3:12: burst applies only to token_bucket, leaky_bucket and gcra, not sliding_log`}},
		{"burst given twice", rule("    limit: 5/m burst 2\n    burst: 3\n"),
			[]string{`4:5: burst is given both in limit ("5/m burst 2") and as burst: 3; use one`}},
		{"max_delay on gcra", rule("    limit: 5/m\n    max_delay: 1s\n"),
			[]string{`4:5: max_delay and delay_after apply only to leaky_bucket, not gcra`}},
		{"bad block duration", rule("    limit: 5/m\n    block: 15 minutes\n"),
			[]string{`4:12: block "15 minutes" is not a duration (such as 500ms, 15m, 1h or 7d)`}},
		{"block without unit", rule("    limit: 5/m\n    block: 900\n"),
			[]string{`4:12: block "900" has no unit (such as 500ms, 15m, 1h or 7d)`}},
		{"negative timeout", "store:\n  timeout: -5ms\n",
			[]string{`2:12: timeout must be positive, got "-5ms"`}},
		{"bad CIDR", "trusted_proxies: [10.0.0.0/33]\n",
			[]string{`1:19: invalid CIDR "10.0.0.0/33" (want an address or address/bits, such as 10.0.0.0/8)`}},
		{"CIDR with host bits", "deny:\n  - 192.168.1.7/24\n",
			[]string{`2:5: CIDR "192.168.1.7/24" has host bits set (did you mean 192.168.1.0/24?)`}},
		{"CIDR in allow and deny", "allow: [203.0.113.0/24]\ndeny: [203.0.113.0/24]\n",
			[]string{`1:9: 203.0.113.0/24 is in both allow and deny (deny wins; remove one)`}},
		{"duplicate rule names", "rules:\n  - {name: a, limit: 5/m}\n  - {name: a, limit: 6/m}\n",
			[]string{`3:12: duplicate rule name "a" (first at line 2)`}},
		{"tiers without default", rule("    tiers:\n      by: header:X-Plan\n      pro: {limit: 5/m}\n"),
			[]string{`4:7: tiers needs a default tier, used when by has no value or names no tier`}},
		{"misspelt default tier", rule("    tiers:\n      by: header:X-Plan\n      defualt: {limit: 5/m}\n"),
			[]string{`4:7: tiers needs a default tier, used when by has no value or names no tier (is "defualt" a misspelling of default?)`}},
		{"tiers without by", rule("    tiers:\n      default: {limit: 5/m}\n"),
			[]string{`4:7: tiers needs by, the identity that picks the tier, such as header:X-Plan`}},
		{"tier without limit", rule("    tiers:\n      by: header:X-Plan\n      default: {algorithm: gcra}\n"),
			[]string{`5:16: tier "default" needs a limit, such as {limit: 100/m}`}},
		{"limit and tiers", rule("    limit: 5/m\n    tiers:\n      by: header:X-Plan\n      default: {limit: 5/m}\n"),
			[]string{`3:5: limit and tiers are exclusive; put this limit in tiers.default`}},
		{"unknown identity", rule("    limit: 5/m\n    identity: [ip, user]\n"),
			[]string{`4:20: unknown identity "user" (want ip, ip/BITS, header:NAME, trusted_header:NAME, cookie:NAME, query:NAME, method, route or const:VALUE)`}},
		{"header identity without name", rule("    limit: 5/m\n    identity: \"header:\"\n"),
			[]string{`4:15: identity "header:" needs a header name, as in header:X-API-Key`}},
		{"ip prefix too long", rule("    limit: 5/m\n    identity: ip/24/129\n"),
			[]string{`4:15: identity "ip/24/129": IPv6 prefix length "129" must be a whole number from 1 to 128`}},
		{"route without path", rule("    limit: 5/m\n    identity: route\n"),
			[]string{`4:15: identity route needs match.path, whose pattern it counts by`}},
		{"duplicate identity", rule("    limit: 5/m\n    identity: [ip, ip]\n"),
			[]string{`4:20: identity "ip" is listed twice`}},
		{"bad path pattern", rule("    limit: 5/m\n    match: {path: \"/users/{id\"}\n"),
			[]string{`4:19: invalid path pattern "/users/{id": at offset 7: bad wildcard segment (must end with '}')`}},
		{"path with method", rule("    limit: 5/m\n    match: {path: POST /login}\n"),
			[]string{`4:19: path "POST /login" must start with "/"; put methods in match.methods and the host in match.host`}},
		{"bad method", rule("    limit: 5/m\n    match: {methods: [\"GE T\"]}\n"),
			[]string{`4:23: invalid method "GE T"`}},
		{"shadow with on_missing deny", rule("    limit: 5/m\n    identity: header:X-Key\n    shadow: true\n    on_missing: deny\n"),
			[]string{`6:17: on_missing: deny cannot apply to a shadow rule, which never blocks`}},
		{"shadow with on_error deny", rule("    limit: 5/m\n    shadow: true\n    on_error: deny\n"),
			[]string{`5:15: on_error: deny cannot apply to a shadow rule, which never blocks`}},
		{"unknown on_error", "store:\n  on_error: ignore\n",
			[]string{`2:13: unknown on_error "ignore" (want allow, deny or local)`}},
		{"unknown on_missing", rule("    limit: 5/m\n    on_missing: ignore\n"),
			[]string{`4:17: unknown on_missing "ignore" (want skip, deny or use_ip)`}},
		{"unknown store type", "store: {type: mysql}\n",
			[]string{`1:15: unknown store type "mysql" (want memory or redis)`}},
		{"redis without addrs", "store: {type: redis}\n",
			[]string{`1:15: store.type redis needs store.redis.addrs`}},
		{"redis address without port", "store:\n  redis: {addrs: [localhost]}\n",
			[]string{`2:19: redis address "localhost" must be host:port, such as 127.0.0.1:6379`}},
		{"password and password_env", "store:\n  redis: {addrs: [\"a:1\"], password: x, password_env: P}\n",
			[]string{`2:40: password and password_env are exclusive; use one`}},
		{"db on a cluster", "store:\n  redis: {addrs: [\"a:1\", \"b:1\"], db: 3}\n",
			[]string{`2:38: db 3 cannot be used with Redis Cluster (several addrs without master_name), which has only db 0`}},
		{"max_batch too large", "store:\n  redis: {addrs: [\"a:1\"], max_batch: 5000}\n",
			[]string{`2:38: max_batch must be 1 to 1000, got 5000`}},
		{"prefix with a brace", "store:\n  redis: {addrs: [\"a:1\"], prefix: \"{blue}\"}\n",
			[]string{`2:35: prefix "{blue}" must not contain a brace: braces set the Redis Cluster hash tag of every key`}},
		{"prefix with a space", "store:\n  redis: {addrs: [\"a:1\"], prefix: \"blue green\"}\n",
			[]string{`2:35: prefix "blue green" may hold only letters, digits and _ - . : /, not ' '`}},
		{"prefix too long", "store:\n  redis: {addrs: [\"a:1\"], prefix: " + strings.Repeat("p", 65) + "}\n",
			[]string{`2:35: prefix "` + strings.Repeat("p", 65) + `" is 65 bytes; the limit is 64`}},
		{"max_in_flight zero", "store:\n  redis: {addrs: [\"a:1\"], max_in_flight: 0}\n",
			[]string{`2:42: max_in_flight must be at least 1, got 0`}},
		{"linger too long", "store:\n  redis: {addrs: [\"a:1\"], linger: 11ms}\n",
			[]string{`2:35: linger must be 0 to 10ms, got 11ms`}},
		{"bad bool", "shadow: yes\n",
			[]string{`1:9: shadow must be true or false, got "yes"`}},
		{"bad int", rule("    limit: 5/m\n    burst: ten\n"),
			[]string{`4:12: burst must be a whole number, got "ten"`}},
		{"instances zero", "instances: 0\n",
			[]string{`1:12: instances must be at least 1, got 0`}},
		{"rules not a list", "rules: {name: a}\n",
			[]string{`1:8: rules must be a list of rules, got a mapping`}},
		{"rule without name", "rules:\n  - limit: 5/m\n",
			[]string{`2:5: rule needs a name`}},
		{"bad rule name", "rules:\n  - {name: \"log in\", limit: 5/m}\n",
			[]string{`2:12: rule name "log in" may only contain letters, digits, '.', '_' and '-'`}},
		{"field given twice", rule("    limit: 5/m\n    limit: 6/m\n"),
			[]string{`4:5: field "limit" is given twice in rule (first at line 3)`}},
		{"bad value-list identity", "allow:\n  - {identity: ip, values: [1.2.3.4]}\n",
			[]string{`2:16: list client addresses as CIDRs, not as {identity: ip}`}},
		{"value list without values", "deny:\n  - {identity: header:X-Key}\n",
			[]string{`2:5: an {identity, values} entry needs at least one value`}},
		{"bad server address", "server: {http: \"8080\"}\n",
			[]string{`1:16: http "8080" must be host:port or :port, such as :8080`}},
		{"YAML syntax error", "rules: [a, b\n",
			[]string{`1: YAML syntax: did not find expected ',' or ']'`}},
		{"YAML syntax error on line 1", "a: b: c\n",
			[]string{`1: YAML syntax: mapping values are not allowed in this context`}},
		{"two documents", "rules: []\n---\nrules: []\n",
			[]string{`2:1: only one YAML document is allowed; remove the second "---"`}},
		{"many problems at once", "store: {type: redis}\nrules:\n  - {name: a, limit: 5/q}\n  - {name: a, limit: 5/m, algorithm: foo}\n",
			[]string{
				`1:15: store.type redis needs store.redis.addrs`,
				`3:22: invalid limit "5/q": period "q" is not a duration (use s, m, h, d, 30s, 15m, 7d)`,
				`4:12: duplicate rule name "a" (first at line 3)`,
				`4:38: unknown algorithm "foo" (want fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra or concurrency)`,
			}},
	}
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc), "w.yaml")
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("got %+v, %v; want a *config.Error", cfg, err)
			}
			var got []string
			for _, line := range ce.Lines() {
				got = append(got, strings.TrimPrefix(line, "w.yaml:"))
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("problems:\n got %q\nwant %q", got, c.want)
			}
			if err.Error() != strings.Join(ce.Lines(), "\n") {
				t.Fatalf("Error() = %q", err.Error())
			}
		})
	}
}

// TestNewValidates checks that a Config built in Go is validated by New,
// with field paths instead of positions.
func TestNewValidates(t *testing.T) {
	cfg := &config.Config{
		Deny: []string{"nope"},
		Rules: []config.RuleConfig{
			{Name: "a", Limit: "5/m"},
			{Name: "a", Limit: "5/m"},
			{Name: "b", Limit: "5/m", Algorithm: "fixed_window", Burst: 3},
		},
	}
	_, err := New(cfg, nil)
	want := "config: deny[0]: invalid CIDR \"nope\" (want an address or address/bits, such as 10.0.0.0/8)\n" +
		"config: rules[1].name: duplicate rule name \"a\" (first at rules[0].name)\n" +
		"config: rules[2].burst: burst applies only to token_bucket, leaky_bucket and gcra, not fixed_window"
	if err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
	if _, err := New(&config.Config{Store: config.StoreConfig{Type: "redis", Redis: config.RedisConfig{Addrs: []string{"a:1"}}}}, nil); err == nil {
		t.Fatal("New accepted a redis config without a store")
	}
}

func TestPasswordNeverPrinted(t *testing.T) {
	cfg, err := Parse([]byte("store:\n  redis: {addrs: [\"a:1\"], password: hunter2}\n"), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Store.Redis.PasswordValue() != "hunter2" {
		t.Fatal("password lost")
	}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("cfg", "redis", cfg.Store.Redis, "store", cfg.Store)
	for _, s := range []string{fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg.Store.Redis), buf.String()} {
		if strings.Contains(s, "hunter2") {
			t.Fatalf("password printed: %s", s)
		}
	}
}
