package envoyrls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir"
)

// ConfigError reports a configuration file that cannot be loaded. It names
// the file and, when known, the line of the offending value.
type ConfigError struct {
	File string
	Line int // 0 when the error concerns the whole file
	Msg  string
}

// Error implements error as "file:line: message".
func (e *ConfigError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Config is a loaded set of envoyproxy/ratelimit configuration files: one
// descriptor tree per domain. It is immutable once loaded and safe for
// concurrent use; a Service swaps whole Configs to reload.
type Config struct {
	domains map[string]*domainConfig
	files   []string
	rules   []*rule
}

type domainConfig struct {
	name string
	file string
	line int
	root level
}

// level is one list of descriptors: the candidates for one request entry.
type level struct {
	exact     map[entryKey]*node // key and value both given
	defaults  map[string]*node   // key only: matches any value
	wildcards []*node            // value ending in '*', in file order
}

type entryKey struct{ key, value string }

func (l *level) empty() bool {
	return len(l.exact) == 0 && len(l.defaults) == 0 && len(l.wildcards) == 0
}

type node struct {
	key, value string
	prefix     string // a wildcard's value without its trailing '*'
	wildcard   bool
	share      bool // share_threshold: every value matching the wildcard shares one counter
	line       int
	rule       *rule
	children   level
}

// rule is one rate_limit block, compiled.
type rule struct {
	domain    string
	path      string // "domain.key_value.key", as envoyproxy/ratelimit names its stats
	file      string
	line      int
	name      string
	replaces  []string
	unlimited bool
	shadow    bool
	quota     bool
	deny      bool // requests_per_unit: 0 blocks every request

	limit   weir.Limit
	maxCost int64 // the largest cost the limit can ever admit at once
	rpu     uint32
	unit    rlspb.RateLimitResponse_RateLimit_Unit
	mult    uint32
}

// A Rule describes one rate_limit block of a loaded Config, for listing.
type Rule struct {
	Domain          string     // the file's domain
	Path            string     // domain and descriptor path, as "domain.key_value.key"
	Name            string     // the rate_limit's name, if any
	Replaces        []string   // names of the rules this one replaces
	Unlimited       bool       // never limited
	Shadow          bool       // decided and reported, never enforced
	Quota           bool       // quota_mode
	RequestsPerUnit uint32     // 0 blocks every request
	Unit            string     // second, minute, hour, day, week, month or year
	UnitMultiplier  uint32     // the period is Unit × UnitMultiplier
	Limit           weir.Limit // what weir enforces; zero when Unlimited
	File            string     // the file that defines the rule
	Line            int        // the line of its rate_limit
}

// unitInfo maps the unit names of the file format to the protocol's enum
// and to a duration. Month and year are 30 and 365 days, as upstream.
var unitInfo = map[string]struct {
	pb rlspb.RateLimitResponse_RateLimit_Unit
	d  time.Duration
}{
	"second": {rlspb.RateLimitResponse_RateLimit_SECOND, time.Second},
	"minute": {rlspb.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	"hour":   {rlspb.RateLimitResponse_RateLimit_HOUR, time.Hour},
	"day":    {rlspb.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	"week":   {rlspb.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	"month":  {rlspb.RateLimitResponse_RateLimit_MONTH, 30 * 24 * time.Hour},
	"year":   {rlspb.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// unitDuration returns the length of one unit, or 0 for UNKNOWN.
func unitDuration(u rlspb.RateLimitResponse_RateLimit_Unit) time.Duration {
	for _, ui := range unitInfo {
		if ui.pb == u {
			return ui.d
		}
	}
	return 0
}

const unitList = "second, minute, hour, day, week, month or year"

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	ds := make([]string, 0, len(c.domains))
	for d := range c.domains {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	return ds
}

// Files returns the files the Config was loaded from, in load order.
func (c *Config) Files() []string {
	if c == nil {
		return nil
	}
	return slices.Clone(c.files)
}

// Rules lists every rate_limit block, in file order.
func (c *Config) Rules() []Rule {
	if c == nil {
		return nil
	}
	out := make([]Rule, 0, len(c.rules))
	for _, r := range c.rules {
		ru := Rule{
			Domain: r.domain, Path: r.path, Name: r.name, Replaces: slices.Clone(r.replaces),
			Unlimited: r.unlimited, Shadow: r.shadow, Quota: r.quota, File: r.file, Line: r.line,
		}
		if !r.unlimited {
			ru.RequestsPerUnit, ru.UnitMultiplier, ru.Limit = r.rpu, r.mult, r.limit
			ru.Unit = strings.ToLower(r.unit.String())
		}
		out = append(out, ru)
	}
	return out
}

// Parse loads one configuration file's contents. filename is used in error
// messages only.
func Parse(data []byte, filename string) (*Config, error) {
	c := &Config{domains: map[string]*domainConfig{}}
	if err := c.add(data, filename); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadFiles loads several configuration files into one Config. A domain may
// appear in only one of them.
func LoadFiles(paths ...string) (*Config, error) {
	c := &Config{domains: map[string]*domainConfig{}}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("envoyrls: %w", err)
		}
		if err := c.add(data, p); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// LoadDir loads every *.yaml and *.yml file directly inside dir (not in
// subdirectories, and skipping names that start with a dot), in name
// order. This is envoyproxy/ratelimit's runtime config directory, usually
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
func LoadDir(dir string) (*Config, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: %w", err)
	}
	var paths []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p) // follows symlinks, as runtime directories use them
		if err != nil {
			return nil, fmt.Errorf("envoyrls: %w", err)
		}
		if fi.Mode().IsRegular() {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("envoyrls: no .yaml or .yml files in %s", dir)
	}
	sort.Strings(paths)
	return LoadFiles(paths...)
}

// parser holds the state of loading one file.
type parser struct {
	file   string
	domain string
	rules  []*rule
	depth  int
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &ConfigError{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...)}
}

func (c *Config) add(data []byte, filename string) error {
	p := &parser{file: filename}
	// Decoding into a plain value first lets the YAML library refuse alias
	// cycles and alias bombs before the tree walk expands aliases.
	// Type errors (a repeated key, say) are left for the walk to report.
	var plain any
	var typeErr *yaml.TypeError
	if err := yaml.Unmarshal(data, &plain); err != nil && !errors.As(err, &typeErr) {
		return p.syntaxError(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return p.errorf(nil, "the file is empty; it needs a domain and descriptors")
		}
		return p.syntaxError(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return p.errorf(&extra, "a second YAML document; put each domain in its own file")
	} else if !errors.Is(err, io.EOF) {
		return p.syntaxError(err)
	}
	root := resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		return p.errorf(root, "the top level must be a mapping with domain and descriptors")
	}
	fields, err := p.fields(root, "the top level", []string{"domain", "descriptors"})
	if err != nil {
		return err
	}
	dn, ok := fields["domain"]
	if !ok {
		return p.errorf(root, "domain is missing")
	}
	domain, err := p.str(dn, "domain")
	if err != nil {
		return err
	}
	if domain == "" {
		return p.errorf(dn, "domain is empty")
	}
	if prev := c.domains[domain]; prev != nil {
		return p.errorf(dn, "domain %q is already defined in %s:%d", domain, prev.file, prev.line)
	}
	p.domain = domain
	d := &domainConfig{name: domain, file: filename, line: dn.Line}
	if dl, ok := fields["descriptors"]; ok {
		if err := p.level(&d.root, dl, domain); err != nil {
			return err
		}
	}
	c.domains[domain] = d
	c.files = append(c.files, filename)
	c.rules = append(c.rules, p.rules...)
	return nil
}

// syntaxError turns the YAML parser's "yaml: line N: message" into a
// ConfigError carrying the line.
func (p *parser) syntaxError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, m, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(n); err == nil {
				return &ConfigError{File: p.file, Line: line, Msg: "bad YAML: " + m}
			}
		}
	}
	return &ConfigError{File: p.file, Msg: "bad YAML: " + msg}
}

// resolve follows YAML aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// misplaced explains fields that belong to another level of the format.
var misplaced = map[string]string{
	"shadow_mode":       "shadow_mode belongs to the descriptor, beside rate_limit, not inside it",
	"quota_mode":        "quota_mode belongs to the descriptor, beside rate_limit, not inside it",
	"detailed_metric":   "detailed_metric belongs to the descriptor, beside rate_limit, not inside it",
	"unit":              "unit belongs inside rate_limit",
	"requests_per_unit": "requests_per_unit belongs inside rate_limit",
	"unlimited":         "unlimited belongs inside rate_limit",
	"replaces":          "replaces belongs inside rate_limit",
	"name":              "name belongs inside rate_limit",
	"key":               "key belongs to a descriptor",
	"value":             "value belongs to a descriptor",
}

// fields returns a mapping's values by key, rejecting unknown and repeated
// keys with their line.
func (p *parser) fields(n *yaml.Node, what string, allowed []string) (map[string]*yaml.Node, error) {
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	lines := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := resolve(n.Content[i]), resolve(n.Content[i+1])
		if kn.Kind != yaml.ScalarNode {
			return nil, p.errorf(kn, "%s has a key that is not a plain name", what)
		}
		k := kn.Value
		if !slices.Contains(allowed, k) {
			if hint, ok := misplaced[k]; ok {
				return nil, p.errorf(kn, "unknown field %q in %s: %s", k, what, hint)
			}
			return nil, p.errorf(kn, "unknown field %q in %s (want %s)", k, what, strings.Join(allowed, ", "))
		}
		if first, dup := lines[k]; dup {
			return nil, p.errorf(kn, "field %q given twice in %s (first at line %d)", k, what, first)
		}
		lines[k] = kn.Line
		out[k] = vn
	}
	return out, nil
}

// str reads a scalar as text. YAML null is the empty string, and numbers
// or booleans keep their text, as envoyproxy/ratelimit reads them.
func (p *parser) str(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", p.errorf(n, "%s must be a single value, not a %s", field, kindName(n))
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

// boolean reads true or false. Unquoted YAML 1.1 spellings (yes, no, on,
// off) are accepted too, since the upstream loader reads YAML 1.1.
func (p *parser) boolean(n *yaml.Node, field string) (bool, error) {
	if n.Kind == yaml.ScalarNode {
		switch {
		case n.Tag == "!!null":
			return false, nil
		case n.Tag == "!!bool":
			var b bool
			if err := n.Decode(&b); err == nil {
				return b, nil
			}
		case n.Style == 0:
			switch n.Value {
			case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON":
				return true, nil
			case "n", "N", "no", "No", "NO", "off", "Off", "OFF":
				return false, nil
			}
		}
	}
	return false, p.errorf(n, "%s must be true or false, got %s", field, show(n))
}

// integer reads a whole number.
func (p *parser) integer(n *yaml.Node, field string) (int64, error) {
	var v int64
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		return 0, p.errorf(n, "%s must be a whole number, got %s", field, show(n))
	}
	return v, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "value"
}

// show renders a node for an error message.
func show(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode {
		return "a " + kindName(n)
	}
	if n.Tag == "!!null" {
		return "nothing"
	}
	return strconv.Quote(n.Value)
}

var descriptorFields = []string{
	"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric",
	"value_to_metric", "share_threshold", "quota_mode",
}

// maxDepth bounds how deep descriptors nest; Envoy's descriptors are a
// handful of entries long.
const maxDepth = 64

// level loads a descriptors list into l. path names l for stats and errors.
func (p *parser) level(l *level, n *yaml.Node, path string) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if p.depth++; p.depth > maxDepth {
		return p.errorf(n, "descriptors nest deeper than %d levels", maxDepth)
	}
	defer func() { p.depth-- }()
	if n.Kind != yaml.SequenceNode {
		return p.errorf(n, "descriptors must be a list, got %s", show(n))
	}
	for _, item := range n.Content {
		item = resolve(item)
		if item.Kind != yaml.MappingNode {
			return p.errorf(item, "each entry of descriptors must be a mapping with a key, got %s", show(item))
		}
		if err := p.descriptor(l, item, path); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(l *level, n *yaml.Node, parent string) error {
	f, err := p.fields(n, "descriptor", descriptorFields)
	if err != nil {
		return err
	}
	nd := &node{line: n.Line}
	kn, ok := f["key"]
	if !ok {
		return p.errorf(n, "descriptor has no key")
	}
	if nd.key, err = p.str(kn, "key"); err != nil {
		return err
	}
	if nd.key == "" {
		return p.errorf(kn, "descriptor key is empty")
	}
	if vn, ok := f["value"]; ok {
		if nd.value, err = p.str(vn, "value"); err != nil {
			return err
		}
	}
	nd.prefix, nd.wildcard = strings.CutSuffix(nd.value, "*")
	path := parent + "." + nd.key
	if nd.value != "" {
		path += "_" + nd.value
	}
	var share, shadow, quota bool
	for _, b := range []struct {
		field string
		dst   *bool
	}{{"shadow_mode", &shadow}, {"quota_mode", &quota}, {"share_threshold", &share}} {
		if vn, ok := f[b.field]; ok {
			if *b.dst, err = p.boolean(vn, b.field); err != nil {
				return err
			}
		}
	}
	for _, field := range []string{"detailed_metric", "value_to_metric"} { // metrics only: accepted
		if vn, ok := f[field]; ok {
			if _, err := p.boolean(vn, field); err != nil {
				return err
			}
		}
	}
	if share && !nd.wildcard {
		return p.errorf(f["share_threshold"], "share_threshold needs a wildcard value ending in '*', and descriptor %q has none", path)
	}
	nd.share = share

	// Register the node at its level, refusing a second key+value there.
	if nd.value == "" {
		if prev := l.defaults[nd.key]; prev != nil {
			return p.errorf(kn, "duplicate descriptor: key %q without a value is already defined at line %d", nd.key, prev.line)
		}
		if l.defaults == nil {
			l.defaults = map[string]*node{}
		}
		l.defaults[nd.key] = nd
	} else {
		ek := entryKey{nd.key, nd.value}
		if prev := l.exact[ek]; prev != nil {
			return p.errorf(kn, "duplicate descriptor: key %q with value %q is already defined at line %d", nd.key, nd.value, prev.line)
		}
		if l.exact == nil {
			l.exact = map[entryKey]*node{}
		}
		l.exact[ek] = nd
		if nd.wildcard {
			l.wildcards = append(l.wildcards, nd)
		}
	}

	if rn, ok := f["rate_limit"]; ok {
		r, err := p.rateLimit(rn, path)
		if err != nil {
			return err
		}
		if r != nil {
			r.shadow, r.quota = shadow, quota
			nd.rule = r
			p.rules = append(p.rules, r)
		}
	}
	if dn, ok := f["descriptors"]; ok {
		if err := p.level(&nd.children, dn, path); err != nil {
			return err
		}
	}
	return nil
}

var rateLimitFields = []string{
	"unit", "requests_per_unit", "unlimited", "name", "replaces",
	"unit_multiplier", "limit", "algorithm", "burst",
}

// algorithms lists those usable from Envoy. concurrency is not: its leases
// need a release that the rate limit protocol cannot send.
var algorithms = []string{"fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra"}

func (p *parser) rateLimit(n *yaml.Node, path string) (*rule, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil // "rate_limit:" with nothing: no limit, as upstream
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.errorf(n, "rate_limit must be a mapping, got %s", show(n))
	}
	f, err := p.fields(n, "rate_limit", rateLimitFields)
	if err != nil {
		return nil, err
	}
	r := &rule{domain: p.domain, path: path, file: p.file, line: n.Line}
	if vn, ok := f["name"]; ok {
		if r.name, err = p.str(vn, "name"); err != nil {
			return nil, err
		}
	}
	if rn, ok := f["replaces"]; ok && !(rn.Kind == yaml.ScalarNode && rn.Tag == "!!null") {
		if rn.Kind != yaml.SequenceNode {
			return nil, p.errorf(rn, "replaces must be a list of {name: ...}, got %s", show(rn))
		}
		for _, item := range rn.Content {
			item = resolve(item)
			if item.Kind != yaml.MappingNode {
				return nil, p.errorf(item, "each entry of replaces must be a mapping {name: ...}, got %s", show(item))
			}
			rf, err := p.fields(item, "replaces entry", []string{"name"})
			if err != nil {
				return nil, err
			}
			name := ""
			if nn, ok := rf["name"]; ok {
				if name, err = p.str(nn, "name"); err != nil {
					return nil, err
				}
			}
			if name == "" {
				return nil, p.errorf(item, "replaces entry has an empty name")
			}
			if name == r.name {
				return nil, p.errorf(item, "rate_limit %q replaces itself", name)
			}
			r.replaces = append(r.replaces, name)
		}
	}
	if un, ok := f["unlimited"]; ok {
		if r.unlimited, err = p.boolean(un, "unlimited"); err != nil {
			return nil, err
		}
	}
	if r.unlimited {
		for _, k := range []string{"unit", "requests_per_unit", "unit_multiplier", "limit", "algorithm", "burst"} {
			if vn, ok := f[k]; ok {
				return nil, p.errorf(vn, "an unlimited rate_limit must not set %s", k)
			}
		}
		return r, nil
	}

	l := weir.Limit{Algorithm: weir.FixedWindow}
	if ln, ok := f["limit"]; ok {
		for _, k := range []string{"unit", "requests_per_unit", "unit_multiplier"} {
			if vn, ok := f[k]; ok {
				return nil, p.errorf(vn, "give either limit or unit and requests_per_unit, not both (%s is set)", k)
			}
		}
		s, err := p.str(ln, "limit")
		if err != nil {
			return nil, err
		}
		pl, err := weir.ParseLimit(s)
		if err != nil {
			return nil, p.errorf(ln, "%v", err)
		}
		if pl.Rate > math.MaxUint32 {
			return nil, p.errorf(ln, "limit %q: the rate must fit requests_per_unit (at most %d)", s, uint32(math.MaxUint32))
		}
		if pl.Period%time.Second != 0 {
			return nil, p.errorf(ln, "limit %q: the period must be a whole number of seconds to be reported to Envoy", s)
		}
		l.Rate, l.Period, l.Burst = pl.Rate, pl.Period, pl.Burst
		r.rpu = uint32(pl.Rate)
		r.unit, r.mult = unitOf(pl.Period)
	} else {
		un, ok := f["unit"]
		if !ok {
			return nil, p.errorf(n, "rate_limit needs a unit (%s) and requests_per_unit, or unlimited: true", unitList)
		}
		us, err := p.str(un, "unit")
		if err != nil {
			return nil, err
		}
		ui, ok := unitInfo[strings.ToLower(us)]
		if !ok {
			return nil, p.errorf(un, "unknown unit %q (want %s)", us, unitList)
		}
		rn, ok := f["requests_per_unit"]
		if !ok {
			return nil, p.errorf(n, "rate_limit needs requests_per_unit")
		}
		rpu, err := p.integer(rn, "requests_per_unit")
		if err != nil {
			return nil, err
		}
		if rpu < 0 || rpu > math.MaxUint32 {
			return nil, p.errorf(rn, "requests_per_unit %d is out of range (0 to %d; 0 blocks every request)", rpu, uint32(math.MaxUint32))
		}
		r.rpu, r.unit, r.mult = uint32(rpu), ui.pb, 1
		if mn, ok := f["unit_multiplier"]; ok {
			m, err := p.integer(mn, "unit_multiplier")
			if err != nil {
				return nil, err
			}
			if m < 1 || m > math.MaxUint32 {
				return nil, p.errorf(mn, "unit_multiplier %d is out of range (at least 1)", m)
			}
			r.mult = uint32(m)
		}
		if time.Duration(r.mult) > math.MaxInt64/ui.d {
			return nil, p.errorf(f["unit_multiplier"], "unit_multiplier %d makes the period too long", r.mult)
		}
		l.Rate = rpu
		l.Period = ui.d * time.Duration(r.mult)
	}
	if an, ok := f["algorithm"]; ok {
		a, err := p.str(an, "algorithm")
		if err != nil {
			return nil, err
		}
		if !slices.Contains(algorithms, a) {
			if a == string(weir.Concurrency) {
				return nil, p.errorf(an, "algorithm concurrency cannot be used from Envoy: the protocol has no way to release a slot")
			}
			return nil, p.errorf(an, "unknown algorithm %q (want %s)", a, strings.Join(algorithms, ", "))
		}
		l.Algorithm = weir.Algorithm(a)
	}
	if bn, ok := f["burst"]; ok {
		b, err := p.integer(bn, "burst")
		if err != nil {
			return nil, err
		}
		if b <= 0 {
			return nil, p.errorf(bn, "burst must be positive, got %d", b)
		}
		if l.Burst != 0 {
			return nil, p.errorf(bn, "burst is given twice, in limit and in burst")
		}
		l.Burst = b
	}
	r.limit = l
	if l.Rate == 0 {
		r.deny = true
		return r, nil
	}
	params, err := l.Compile()
	if err != nil {
		var le *weir.LimitError
		if errors.As(err, &le) {
			return nil, p.errorf(n, "rate_limit of %s: %s", path, le.Reason)
		}
		return nil, p.errorf(n, "rate_limit of %s: %v", path, err)
	}
	r.maxCost = params.MaxCost()
	return r, nil
}

// unitOf expresses a whole-second period as the largest of second, minute,
// hour and day that divides it, times a multiplier.
func unitOf(d time.Duration) (rlspb.RateLimitResponse_RateLimit_Unit, uint32) {
	for _, u := range []string{"day", "hour", "minute", "second"} {
		ui := unitInfo[u]
		if d%ui.d == 0 && d/ui.d <= math.MaxUint32 {
			return ui.pb, uint32(d / ui.d)
		}
	}
	return rlspb.RateLimitResponse_RateLimit_SECOND, uint32(min(d/time.Second, math.MaxUint32))
}
