package envoyrls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/weir-dev/weir"
)

// y builds a file from lines, so that line numbers are easy to read.
func y(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

// rl is a file with one descriptor "a" whose rate_limit has the given lines.
func rl(lines ...string) string {
	out := []string{"domain: d", "descriptors:", "  - key: a", "    rate_limit:"}
	for _, l := range lines {
		out = append(out, "      "+l)
	}
	return y(out...)
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"empty file", "", "f.yaml: the file is empty; it needs a domain and descriptors"},
		{"no domain", y("descriptors: []"), "f.yaml:1: domain is missing"},
		{"empty domain", y(`domain: ""`, "descriptors: []"), "f.yaml:1: domain is empty"},
		{"no key", y("domain: d", "descriptors:", "  - value: x"), "f.yaml:3: descriptor has no key"},
		{"empty key", y("domain: d", "descriptors:", `  - key: ""`), "f.yaml:3: descriptor key is empty"},
		{"bad unit", rl("unit: fortnight", "requests_per_unit: 1"), `f.yaml:5: unknown unit "fortnight" (want second, minute, hour, day, week, month or year)`},
		{"duplicate key and value", y("domain: d", "descriptors:", "  - key: a", "    value: v", "  - key: a", "    value: v"),
			`f.yaml:5: duplicate descriptor: key "a" with value "v" is already defined at line 3`},
		{"duplicate key", y("domain: d", "descriptors:", "  - key: a", "  - key: a"),
			`f.yaml:4: duplicate descriptor: key "a" without a value is already defined at line 3`},
		{"duplicate nested", y("domain: d", "descriptors:", "  - key: a", "    descriptors:", "      - key: b", "        value: '*'", "      - key: b", "        value: '*'"),
			`f.yaml:7: duplicate descriptor: key "b" with value "*" is already defined at line 5`},
		{"unknown field", y("domain: d", "descriptors:", "  - key: a", "    ratelimit:", "      unit: second"),
			`f.yaml:4: unknown field "ratelimit" in descriptor (did you mean "rate_limit"?)`},
		{"unknown field in rate_limit", rl("unit: second", "requestsperunit: 5"),
			`f.yaml:6: unknown field "requestsperunit" in rate_limit (did you mean "requests_per_unit"?)`},
		{"unknown top-level field", y("domain: d", "extra: 1"), `f.yaml:2: unknown field "extra" in the top level (want one of domain, descriptors)`},
		{"misplaced shadow_mode", rl("unit: second", "requests_per_unit: 1", "shadow_mode: true"),
			`f.yaml:7: unknown field "shadow_mode" in rate_limit: shadow_mode belongs to the descriptor, beside rate_limit, not inside it`},
		{"unlimited with unit", rl("unlimited: true", "unit: second"), "f.yaml:6: an unlimited rate_limit must not set unit"},
		{"unlimited with requests_per_unit", rl("unlimited: true", "requests_per_unit: 4"), "f.yaml:6: an unlimited rate_limit must not set requests_per_unit"},
		{"unlimited with limit", rl("limit: 5/m", "unlimited: true"), "f.yaml:5: an unlimited rate_limit must not set limit"},
		{"replaces itself", rl("name: x", "replaces:", "  - name: x", "unit: second", "requests_per_unit: 1"), `f.yaml:7: rate_limit "x" replaces itself`},
		{"empty replaces", rl("replaces:", `  - name: ""`, "unit: second", "requests_per_unit: 1"), "f.yaml:6: replaces entry has an empty name"},
		{"replaces not a list", rl("unit: second", "requests_per_unit: 1", "replaces: x"), `f.yaml:7: replaces must be a list of {name: ...}, got "x"`},
		{"negative requests_per_unit", rl("unit: second", "requests_per_unit: -1"), "f.yaml:6: requests_per_unit -1 is out of range (0 to 4294967295; 0 blocks every request)"},
		{"huge requests_per_unit", rl("unit: second", "requests_per_unit: 4294967296"), "f.yaml:6: requests_per_unit 4294967296 is out of range (0 to 4294967295; 0 blocks every request)"},
		{"fractional requests_per_unit", rl("unit: second", "requests_per_unit: 1.5"), `f.yaml:6: requests_per_unit must be a whole number, got "1.5"`},
		{"quoted requests_per_unit", rl("unit: second", `requests_per_unit: "5"`), `f.yaml:6: requests_per_unit must be a whole number, got "5"`},
		{"missing requests_per_unit", rl("unit: second"), "f.yaml:5: rate_limit needs requests_per_unit"},
		{"missing unit", rl("requests_per_unit: 3"), "f.yaml:5: rate_limit needs a unit (second, minute, hour, day, week, month or year) and requests_per_unit, or unlimited: true"},
		{"zero unit_multiplier", rl("unit: second", "requests_per_unit: 3", "unit_multiplier: 0"), "f.yaml:7: unit_multiplier 0 is out of range (at least 1)"},
		{"huge unit_multiplier", rl("unit: year", "unit_multiplier: 4294967295", "requests_per_unit: 1"), "f.yaml:6: unit_multiplier 4294967295 makes the period too long"},
		{"limit and unit", rl("limit: 100/30s", "unit: second"), "f.yaml:6: give either limit or unit and requests_per_unit, not both (unit is set)"},
		{"bad limit", rl("limit: 100/fortnight"), `f.yaml:5: invalid limit "100/fortnight": period "fortnight" is not a duration (use s, m, h, d, 30s, 15m, 7d)`},
		{"sub-second limit", rl("limit: 100/1500ms"), `f.yaml:5: limit "100/1500ms": the period must be a whole number of seconds to be reported to Envoy`},
		{"bad algorithm", rl("limit: 100/m", "algorithm: leaky"), `f.yaml:6: unknown algorithm "leaky" (want fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra)`},
		{"concurrency", rl("limit: 100/m", "algorithm: concurrency"), "f.yaml:6: algorithm concurrency cannot be used from Envoy: the protocol has no way to release a slot"},
		{"burst on a window", rl("limit: 100/m", "burst: 5"), "f.yaml:5: rate_limit of d.a: burst applies to token_bucket, leaky_bucket and gcra, not fixed_window"},
		{"zero burst", rl("limit: 100/m", "algorithm: gcra", "burst: 0"), "f.yaml:7: burst must be positive, got 0"},
		{"burst twice", rl("limit: 100/m burst 5", "algorithm: gcra", "burst: 6"), "f.yaml:7: burst is given twice, in limit and in burst"},
		{"bad bool", y("domain: d", "descriptors:", "  - key: a", "    shadow_mode: maybe"), `f.yaml:4: shadow_mode must be true or false, got "maybe"`},
		{"quoted bool", y("domain: d", "descriptors:", "  - key: a", `    shadow_mode: "yes"`), `f.yaml:4: shadow_mode must be true or false, got "yes"`},
		{"share without wildcard", y("domain: d", "descriptors:", "  - key: a", "    value: x", "    share_threshold: true"),
			`f.yaml:5: share_threshold needs a wildcard value (with a '*'), and descriptor "d.a_x" has none`},
		{"repeated field", y("domain: d", "descriptors:", "  - key: a", "    key: b"), `f.yaml:4: field "key" is given twice in descriptor (first at line 3)`},
		{"descriptor not a mapping", y("domain: d", "descriptors: [a]"), `f.yaml:2: each entry of descriptors must be a mapping with a key, got "a"`},
		{"descriptors not a list", y("domain: d", "descriptors: {key: a}"), "f.yaml:2: descriptors must be a list, got a mapping"},
		{"domain not a value", y("domain: [d]"), "f.yaml:1: domain must be a single value, not a list"},
		{"rate_limit not a mapping", y("domain: d", "descriptors:", "  - key: a", "    rate_limit: 5"), `f.yaml:4: rate_limit must be a mapping, got "5"`},
		{"two documents", y("domain: d", "---", "domain: e"), "f.yaml:2: a second YAML document; put each domain in its own file"},
		{"top level not a mapping", y("- a"), "f.yaml:1: the top level must be a mapping with domain and descriptors"},
		{"alias cycle", y("domain: d", "descriptors: &x", "  - key: a", "    descriptors: *x"), "f.yaml:4: bad YAML: anchor 'x' value contains itself"},
		{"bad yaml", y("domain: d", "descriptors: [", "  - key"), "f.yaml:2: bad YAML: did not find expected node content"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml), "f.yaml")
			if err == nil || err.Error() != c.want {
				t.Fatalf("Parse(%q)\n got  %v\n want %s", c.yaml, err, c.want)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.File != "f.yaml" {
				t.Fatalf("error %T is not a *ConfigError naming the file", err)
			}
		})
	}
}

// TestConfigYAML: what internal/yamlnode does for the Envoy format. A
// problem in the YAML itself carries its line (an alias cycle, a tag its
// value contradicts, an alias bomb), and merge keys work as in weir.yaml
// and in upstream's YAML loader.
func TestConfigYAML(t *testing.T) {
	for _, c := range []struct{ name, yaml, want string }{
		{"contradicted tag", y("domain: d", "descriptors:", "  - key: a", "    shadow_mode: !!bool yes"), "f.yaml:4: bad YAML: cannot decode !!str `yes` as a !!bool"},
		{"empty int tag", rl("unit: second", "requests_per_unit: !!int"), "f.yaml:6: bad YAML: cannot decode !!null `` as a !!int"},
		{"merge of a scalar", y("domain: d", "descriptors:", "  - {<<: x, key: a}"), "f.yaml:3: a merge (<<) needs a mapping or a list of mappings"},
		{"a key for anchors only", y("domain: d", "base: &b {unit: second, requests_per_unit: 2}", "descriptors: []"),
			`f.yaml:2: unknown field "base" in the top level (want one of domain, descriptors)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml), "f.yaml")
			if err == nil || err.Error() != c.want {
				t.Fatalf("Parse(%q)\n got  %v\n want %s", c.yaml, err, c.want)
			}
		})
	}

	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: a\n    value: &v0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, "  - key: a%d\n    value: &v%d [*v%d, *v%d, *v%d, *v%d, *v%d, *v%d, *v%d, *v%d, *v%d, *v%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	_, err := Parse([]byte(b.String()), "f.yaml")
	if err == nil || !strings.HasPrefix(err.Error(), "f.yaml:14: bad YAML: the document expands to too many nodes through aliases") {
		t.Fatalf("alias bomb: %v", err)
	}

	cfg, err := Parse([]byte(y(
		"domain: d",
		"descriptors:",
		"  - &base",
		"    key: a",
		"    shadow_mode: true",
		"    rate_limit: &rl {unit: minute, requests_per_unit: 5, name: five}",
		"  - <<: *base",
		"    key: b",
		"    rate_limit: {<<: *rl, requests_per_unit: 7, name: seven}",
	)), "f.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules := cfg.Rules()
	if len(rules) != 2 || rules[1].Path != "d.b" || !rules[1].Shadow || rules[1].RequestsPerUnit != 7 || rules[1].Unit != "minute" || rules[1].Name != "seven" || rules[1].Line != 9 {
		t.Fatalf("rules %+v", rules)
	}
}

func TestDeepNesting(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\n")
	indent := ""
	for i := range maxDepth + 1 {
		fmt.Fprintf(&b, "%sdescriptors:\n%s  - key: k%d\n", indent, indent, i)
		indent += "    "
	}
	_, err := Parse([]byte(b.String()), "f.yaml")
	if want := fmt.Sprintf("f.yaml:%d: descriptors nest deeper than 64 levels", 2*maxDepth+3); err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := LoadDir(dir); err == nil || err.Error() != "envoyrls: no .yaml or .yml files in "+dir {
		t.Fatalf("empty dir: %v", err)
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing dir: %v", err)
	}
	write("a.yaml", y("domain: one", "descriptors:", "  - key: k", "    rate_limit: {unit: second, requests_per_unit: 1}"))
	write("b.yml", y("domain: two"))
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Domains(), ","); got != "one,two" {
		t.Fatalf("domains = %s", got)
	}
	if got := cfg.Files(); len(got) != 2 || got[0] != filepath.Join(dir, "a.yaml") {
		t.Fatalf("files = %v", got)
	}
	write("c.yaml", y("# the same domain again", "domain: one"))
	_, err = LoadDir(dir)
	want := filepath.Join(dir, "c.yaml") + `:2: domain "one" is already defined in ` + filepath.Join(dir, "a.yaml") + ":1"
	if err == nil || err.Error() != want {
		t.Fatalf("duplicate domain:\n got  %v\n want %s", err, want)
	}
}

func TestParseAcceptsUpstreamSpellings(t *testing.T) {
	cfg := mustParse(t, y(
		"domain: d",
		"descriptors:",
		"  - key: port",
		"    value: 80", // a number, read as text
		"    detailed_metric: yes",
		"    value_to_metric: off",
		"    rate_limit:",
		"      unit: SECOND", // any case
		"      requests_per_unit: 0x10",
		"  - key: empty", // a rate_limit with nothing in it is no limit
		"    rate_limit:",
		"  - &anchor", // aliases resolve
		"    key: anchored",
		"    rate_limit: {unit: Day, requests_per_unit: 2}",
		"  - key: nested",
		"    descriptors:",
		"  - key: wk",
		"    rate_limit: {unit: week, requests_per_unit: 1, name: weekly}",
		"  - key: mo",
		"    rate_limit: {unit: month, requests_per_unit: 1}",
		"  - key: yr",
		"    rate_limit: {unit: year, requests_per_unit: 1}",
	))
	rules := cfg.Rules()
	want := []struct {
		path, unit string
		rpu        uint32
		period     time.Duration
	}{
		{"d.port_80", "second", 16, time.Second},
		{"d.anchored", "day", 2, 24 * time.Hour},
		{"d.wk", "week", 1, 7 * 24 * time.Hour},
		{"d.mo", "month", 1, 30 * 24 * time.Hour},
		{"d.yr", "year", 1, 365 * 24 * time.Hour},
	}
	if len(rules) != len(want) {
		t.Fatalf("rules = %+v", rules)
	}
	for i, w := range want {
		r := rules[i]
		if r.Path != w.path || r.Unit != w.unit || r.RequestsPerUnit != w.rpu || r.Limit.Period != w.period ||
			r.Limit.Algorithm != weir.FixedWindow || r.UnitMultiplier != 1 || r.File != "test.yaml" || r.Line == 0 {
			t.Errorf("rule %d = %+v, want %+v", i, r, w)
		}
	}
	if rules[2].Name != "weekly" {
		t.Errorf("name = %q", rules[2].Name)
	}
	d := cfg.domains["d"]
	if r, _, _ := d.match(desc("port", "80").Entries); r == nil || r.rpu != 16 {
		t.Fatalf("port=80 matched %+v", r)
	}
	if r, _, _ := d.match(desc("empty", "x").Entries); r != nil {
		t.Fatalf("an empty rate_limit matched %+v", r)
	}
}

func TestRulesListing(t *testing.T) {
	cfg := mustParse(t, replacesYAML+y(
		"  - key: shadowed",
		"    shadow_mode: true",
		"    quota_mode: true",
		"    rate_limit: {limit: 10/90m, algorithm: token_bucket, burst: 4}",
	))
	rules := cfg.Rules()
	if len(rules) != 4 {
		t.Fatalf("rules = %+v", rules)
	}
	if r := rules[0]; r.Path != "example7.key_1_value_1.user_bkthomps" || r.Name != "specific_limit" || r.RequestsPerUnit != 5 {
		t.Errorf("rule 0 = %+v", r)
	}
	if r := rules[1]; len(r.Replaces) != 1 || r.Replaces[0] != "specific_limit" {
		t.Errorf("rule 1 = %+v", r)
	}
	if r := rules[2]; !r.Unlimited || r.Unit != "" || r.Limit != (weir.Limit{}) {
		t.Errorf("rule 2 = %+v", r)
	}
	r := rules[3]
	wantLimit := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: 90 * time.Minute, Burst: 4}
	if !r.Shadow || !r.Quota || r.Unit != "minute" || r.UnitMultiplier != 90 || r.RequestsPerUnit != 10 || r.Limit != wantLimit {
		t.Errorf("rule 3 = %+v", r)
	}
	var nilCfg *Config
	if nilCfg.Rules() != nil || nilCfg.Domains() != nil || nilCfg.Files() != nil {
		t.Error("a nil Config should list nothing")
	}
}

func TestUnitOf(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		unit string
		mult uint32
	}{
		{time.Second, "SECOND", 1}, {30 * time.Second, "SECOND", 30}, {time.Minute, "MINUTE", 1},
		{90 * time.Minute, "MINUTE", 90}, {2 * time.Hour, "HOUR", 2}, {7 * 24 * time.Hour, "DAY", 7},
	} {
		u, m := unitOf(c.d)
		if u.String() != c.unit || m != c.mult {
			t.Errorf("unitOf(%v) = %v × %d, want %s × %d", c.d, u, m, c.unit, c.mult)
		}
	}
}

// The example shipped in examples/envoy must load, and behave as its
// comments say.
func TestExampleConfig(t *testing.T) {
	cfg, err := LoadDir(filepath.Join("..", "..", "..", "examples", "envoy", "config"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Rules()) < 6 {
		t.Fatalf("the example has only %d rules", len(cfg.Rules()))
	}
	d := cfg.domains["edge"]
	if d == nil {
		t.Fatalf("the example has no domain edge: %v", cfg.Domains())
	}
	for _, c := range []struct {
		entries []string
		check   func(r *rule) bool
	}{
		{[]string{"remote_address", "10.1.2.3"}, func(r *rule) bool { return r != nil && r.rpu == 10 && r.unit.String() == "SECOND" }},
		{[]string{"remote_address", "10.1.2.3", "path", "/api/login"}, func(r *rule) bool { return r != nil && r.unit.String() == "MINUTE" }},
		{[]string{"remote_address", "192.0.2.9"}, func(r *rule) bool { return r != nil && r.deny }},
		{[]string{"api_key", "anything"}, func(r *rule) bool { return r != nil && r.shadow }},
		{[]string{"internal", "healthcheck"}, func(r *rule) bool { return r != nil && r.unlimited }},
	} {
		r, _, _ := d.match(entries(c.entries...))
		if !c.check(r) {
			t.Errorf("%v matched %+v", c.entries, r)
		}
	}
}

func entries(kv ...string) []*rlcommon.RateLimitDescriptor_Entry { return desc(kv...).Entries }
