package envoyrls

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/yamlnode"
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
	merge   bool // files may share a domain (LoadOptions.MergeDomains)
	// reserveOK: descriptors may say reserve: (LoadOptions.Reserve).
	reserveOK bool
}

type domainConfig struct {
	name     string
	file     string
	line     int
	root     level
	override string // the rule path of its limit overrides: "domain.(override)"
}

// overridePath is the one rule path of every limit override in the
// domain, whatever the request's entries.
func (d *domainConfig) overridePath() string { return d.override }

// level is one list of descriptors: the candidates for one request entry.
type level struct {
	exact    map[entryKey]*node // key and value both given
	defaults map[string]*node   // key only: matches any value
	// wildcards holds, in file order, the descriptors whose key_value
	// (or key, without a value) holds a '*' anywhere.
	wildcards []*node
}

type entryKey struct{ key, value string }

func (l *level) empty() bool {
	return len(l.exact) == 0 && len(l.defaults) == 0 && len(l.wildcards) == 0
}

type node struct {
	debit      bool // debit: true, applied to its rule
	key, value string
	// parts is a wildcard's key_value split at each '*' (wildcard.go);
	// nil when the descriptor is no wildcard.
	parts    []string
	wildcard bool
	share    bool // share_threshold: every value matching the wildcard shares one counter
	// valueToMetric: value_to_metric, which (as upstream builds its
	// stats) drops the rule's metadata from responses when it changes
	// the stats key.
	valueToMetric bool
	line          int
	rule          *rule
	children      level
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
	override  bool // a request's own limit (Envoy's limit override), not the config's
	debit     bool // weir's debit: true: every matching call counts its hits, into debt if need be
	// reserve is the descriptor's reserve: (reserve.go): the hits a
	// request-path call takes and keeps as a reservation; 0 for none.
	reserve int64
	// metadata is the descriptor's metadata:, returned in the response's
	// dynamic metadata when the descriptor passes (WithDynamicMetadata).
	// nil when the descriptor has detailed_metric, as upstream loses it.
	metadata *structpb.Struct

	limit   weir.Limit
	maxCost int64 // the largest cost the limit can ever admit at once
	rpu     uint32
	unit    rlspb.RateLimitResponse_RateLimit_Unit
	mult    uint32
	// current is the rule's current_limit, built on first use and then
	// shared, read-only, by every response that reports the rule.
	current atomic.Pointer[rlspb.RateLimitResponse_RateLimit]
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
	Debit           bool       // debit: every call counts its hits_addend, past the limit if need be
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
			Unlimited: r.unlimited, Shadow: r.shadow, Quota: r.quota, Debit: r.debit, File: r.file, Line: r.line,
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
func LoadDir(dir string) (*Config, error) { return LoadDirWith(dir, LoadOptions{}) }

// parser holds the state of loading one file.
type parser struct {
	file   string
	domain string
	rules  []*rule
	depth  int
	// reserveOK: reserve: is allowed (weir serve --envoy-reserve).
	reserveOK bool
}

func (c *Config) add(data []byte, filename string) error {
	p := &parser{file: filename, reserveOK: c.reserveOK}
	d, err := p.load(c, data)
	if err != nil {
		// Every problem is a yamlnode error carrying its line.
		e := yamlnode.All(err)[0]
		return &ConfigError{File: filename, Line: e.Line, Msg: e.Msg}
	}
	c.domains[d.name] = d
	c.files = append(c.files, filename)
	c.rules = append(c.rules, p.rules...)
	return nil
}

// load reads one file's domain; the error is the first problem found.
func (p *parser) load(c *Config, data []byte) (*domainConfig, error) {
	root, err := yamlnode.Decode(data)
	if err != nil {
		e := yamlnode.All(err)[0]
		switch {
		case errors.Is(err, yamlnode.ErrEmpty):
			e.Msg = "the file is empty; it needs a domain and descriptors"
		case errors.Is(e, yamlnode.ErrExtraDocument):
			e.Msg = "a second YAML document; put each domain in its own file"
		default:
			e.Msg = "bad YAML: " + e.Msg
		}
		return nil, e
	}
	if root.Kind != yaml.MappingNode {
		return nil, yamlnode.Errorf(root, "the top level must be a mapping with domain and descriptors")
	}
	f, err := yamlnode.Mapping(root, topFields)
	if err != nil {
		return nil, err
	}
	dn := f.Get("domain")
	if dn == nil {
		return nil, yamlnode.Errorf(root, "domain is missing")
	}
	domain, err := yamlnode.String(dn, "domain")
	if err != nil {
		return nil, err
	}
	if domain == "" {
		return nil, yamlnode.Errorf(dn, "domain is empty")
	}
	if prev := c.domains[domain]; prev != nil && c.merge {
		p.domain = domain
		return prev, p.mergeInto(prev, f.Get("descriptors"))
	} else if prev != nil {
		return nil, yamlnode.Errorf(dn, "domain %q is already defined in %s:%d", domain, prev.file, prev.line)
	}
	p.domain = domain
	d := &domainConfig{name: domain, file: p.file, line: dn.Line, override: domain + ".(override)"}
	if dl := f.Get("descriptors"); dl != nil {
		if err := p.level(&d.root, dl, domain); err != nil {
			return nil, err
		}
	}
	return d, nil
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

// The mappings of the format and their fields.
var (
	topFields = yamlnode.Fields{What: "the top level", Names: []string{"domain", "descriptors"}, Hints: misplaced}

	descriptorFields = yamlnode.Fields{What: "descriptor", Hints: misplaced, Names: []string{
		"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric",
		"value_to_metric", "share_threshold", "quota_mode", "debit", "metadata", "reserve",
	}}

	rateLimitFields = yamlnode.Fields{What: "rate_limit", Hints: misplaced, Names: []string{
		"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"unit_multiplier", "limit", "algorithm", "burst",
	}}

	replacesFields = yamlnode.Fields{What: "replaces entry", Names: []string{"name"}, Hints: misplaced}
)

// maxDepth bounds how deep descriptors nest; Envoy's descriptors are a
// handful of entries long.
const maxDepth = 64

// level loads a descriptors list into l. path names l for stats and errors.
func (p *parser) level(l *level, n *yaml.Node, path string) error {
	if yamlnode.IsNull(n) {
		return nil
	}
	if p.depth++; p.depth > maxDepth {
		return yamlnode.Errorf(n, "descriptors nest deeper than %d levels", maxDepth)
	}
	defer func() { p.depth-- }()
	if n.Kind != yaml.SequenceNode {
		return yamlnode.Errorf(n, "descriptors must be a list, got %s", yamlnode.Describe(n))
	}
	for _, item := range n.Content {
		item = yamlnode.Resolve(item)
		if item.Kind != yaml.MappingNode {
			return yamlnode.Errorf(item, "each entry of descriptors must be a mapping with a key, got %s", yamlnode.Describe(item))
		}
		if err := p.descriptor(l, item, path); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(l *level, n *yaml.Node, parent string) error {
	f, err := yamlnode.Mapping(n, descriptorFields)
	if err != nil {
		return err
	}
	nd := &node{line: n.Line}
	kn := f.Get("key")
	if kn == nil {
		return yamlnode.Errorf(n, "descriptor has no key")
	}
	if nd.key, err = yamlnode.String(kn, "key"); err != nil {
		return err
	}
	if nd.key == "" {
		return yamlnode.Errorf(kn, "descriptor key is empty")
	}
	if vn := f.Get("value"); vn != nil {
		if nd.value, err = yamlnode.String(vn, "value"); err != nil {
			return err
		}
	}
	full := nd.key // the descriptor's key_value, as upstream matches it
	if nd.value != "" {
		full += "_" + nd.value
	}
	if strings.Contains(full, "*") {
		nd.wildcard, nd.parts = true, splitStar(full)
	}
	path := parent + "." + full
	var share, shadow, quota bool
	for _, b := range []struct {
		field string
		dst   *bool
	}{{"shadow_mode", &shadow}, {"quota_mode", &quota}, {"share_threshold", &share}, {"debit", &nd.debit}} {
		if vn := f.Get(b.field); vn != nil {
			if *b.dst, err = yamlnode.BoolYAML11(vn, b.field); err != nil {
				return err
			}
		}
	}
	var detailed bool
	for _, b := range []struct {
		field string
		dst   *bool
	}{{"detailed_metric", &detailed}, {"value_to_metric", &nd.valueToMetric}} { // metrics only
		if vn := f.Get(b.field); vn != nil {
			if *b.dst, err = yamlnode.BoolYAML11(vn, b.field); err != nil {
				return err
			}
		}
	}
	meta, err := metadataOf(f.Get("metadata"))
	if err != nil {
		return err
	}
	if share && !nd.wildcard {
		return yamlnode.Errorf(f.Get("share_threshold"), "share_threshold needs a wildcard value (with a '*'), and descriptor %q has none", path)
	}
	nd.share = share

	// Register the node at its level, refusing a second key+value there.
	if nd.value == "" {
		if prev := l.defaults[nd.key]; prev != nil {
			return yamlnode.Errorf(kn, "duplicate descriptor: key %q without a value is already defined at line %d", nd.key, prev.line)
		}
		if l.defaults == nil {
			l.defaults = map[string]*node{}
		}
		l.defaults[nd.key] = nd
		if nd.wildcard {
			l.wildcards = append(l.wildcards, nd) // a '*' in the key itself
		}
	} else {
		ek := entryKey{nd.key, nd.value}
		if prev := l.exact[ek]; prev != nil {
			return yamlnode.Errorf(kn, "duplicate descriptor: key %q with value %q is already defined at line %d", nd.key, nd.value, prev.line)
		}
		if l.exact == nil {
			l.exact = map[entryKey]*node{}
		}
		l.exact[ek] = nd
		if nd.wildcard {
			l.wildcards = append(l.wildcards, nd)
		}
	}

	if rn := f.Get("rate_limit"); rn != nil {
		r, err := p.rateLimit(rn, path)
		if err != nil {
			return err
		}
		if r != nil {
			r.shadow, r.quota = shadow, quota
			if !detailed {
				r.metadata = meta
			}
			if err := debitOf(r, nd, f.Get("debit")); err != nil {
				return err
			}
			if err := p.reserveOf(r, f.Get("reserve")); err != nil {
				return err
			}
			nd.rule = r
			p.rules = append(p.rules, r)
		}
	} else if nd.debit {
		return yamlnode.Errorf(f.Get("debit"), "debit needs a rate_limit beside it, and descriptor %q has none", path)
	}
	if rn := f.Get("reserve"); rn != nil && nd.rule == nil {
		return yamlnode.Errorf(rn, "reserve needs a rate_limit and debit: true beside it, and descriptor %q has no rate_limit", path)
	}
	if dn := f.Get("descriptors"); dn != nil {
		if err := p.level(&nd.children, dn, path); err != nil {
			return err
		}
	}
	return nil
}

// debitOf applies a descriptor's debit: true (weir's extension of the
// format) to its rule: every matching call then counts its hits_addend,
// past the limit if need be, as upstream counts response-path calls. The
// rule's algorithm must support debt.
func debitOf(r *rule, nd *node, vn *yaml.Node) error {
	if !nd.debit {
		return nil
	}
	if r.unlimited || r.deny {
		return yamlnode.Errorf(vn, "debit needs a limit to count against, and %s has none", r.path)
	}
	p, err := r.limit.Compile()
	if err == nil && !p.Debts() {
		return yamlnode.Errorf(vn, "debit is not defined for %s (%s); use %s", r.path, r.limit.Algorithm, algorithm.JoinNames(algorithm.Supporting(algorithm.FeatureDebt), "or"))
	}
	r.debit = true
	return nil
}

// algorithms lists those usable from Envoy: not those whose admitted
// requests hold leases (concurrency), which need a release that the rate
// limit protocol cannot send.
var algorithms = func() []string {
	var out []string
	for _, s := range algorithm.Specs() {
		if s.Supports&algorithm.FeatureLeases == 0 {
			out = append(out, s.Name)
		}
	}
	return out
}()

func (p *parser) rateLimit(n *yaml.Node, path string) (*rule, error) {
	if yamlnode.IsNull(n) {
		return nil, nil // "rate_limit:" with nothing: no limit, as upstream
	}
	f, err := yamlnode.Mapping(n, rateLimitFields)
	if err != nil {
		return nil, err
	}
	r := &rule{domain: p.domain, path: path, file: p.file, line: n.Line}
	if vn := f.Get("name"); vn != nil {
		if r.name, err = yamlnode.String(vn, "name"); err != nil {
			return nil, err
		}
	}
	if rn := f.Get("replaces"); !yamlnode.IsNull(rn) {
		if r.replaces, err = replacesOf(rn, r.name); err != nil {
			return nil, err
		}
	}
	if un := f.Get("unlimited"); un != nil {
		if r.unlimited, err = yamlnode.BoolYAML11(un, "unlimited"); err != nil {
			return nil, err
		}
	}
	if r.unlimited {
		for _, k := range []string{"unit", "requests_per_unit", "unit_multiplier", "limit", "algorithm", "burst"} {
			if vn := f.Get(k); vn != nil {
				return nil, yamlnode.Errorf(vn, "an unlimited rate_limit must not set %s", k)
			}
		}
		return r, nil
	}

	var l weir.Limit
	if ln := f.Get("limit"); ln != nil {
		l, err = r.limitOf(ln, f)
	} else {
		l, err = r.unitsOf(n, f)
	}
	if err != nil {
		return nil, err
	}
	l.Algorithm = weir.FixedWindow
	if err := algorithmAndBurst(&l, f); err != nil {
		return nil, err
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
			return nil, yamlnode.Errorf(n, "rate_limit of %s: %s", path, le.Reason)
		}
		return nil, yamlnode.Errorf(n, "rate_limit of %s: %v", path, err)
	}
	r.maxCost = params.MaxCost()
	return r, nil
}

// replacesOf reads a rate_limit's replaces list: the names of the rules it
// replaces, none empty and none its own name (self).
func replacesOf(rn *yaml.Node, self string) ([]string, error) {
	if rn.Kind != yaml.SequenceNode {
		return nil, yamlnode.Errorf(rn, "replaces must be a list of {name: ...}, got %s", yamlnode.Describe(rn))
	}
	var names []string
	for _, item := range rn.Content {
		item = yamlnode.Resolve(item)
		if item.Kind != yaml.MappingNode {
			return nil, yamlnode.Errorf(item, "each entry of replaces must be a mapping {name: ...}, got %s", yamlnode.Describe(item))
		}
		rf, err := yamlnode.Mapping(item, replacesFields)
		if err != nil {
			return nil, err
		}
		name := ""
		if nn := rf.Get("name"); nn != nil {
			if name, err = yamlnode.String(nn, "name"); err != nil {
				return nil, err
			}
		}
		if name == "" {
			return nil, yamlnode.Errorf(item, "replaces entry has an empty name")
		}
		if name == self {
			return nil, yamlnode.Errorf(item, "rate_limit %q replaces itself", name)
		}
		names = append(names, name)
	}
	return names, nil
}

// limitOf reads weir's short form, limit: "100/minute", which excludes unit,
// requests_per_unit and unit_multiplier, and sets r's reported rate and unit.
func (r *rule) limitOf(ln *yaml.Node, f yamlnode.Entries) (weir.Limit, error) {
	var l weir.Limit
	for _, k := range []string{"unit", "requests_per_unit", "unit_multiplier"} {
		if vn := f.Get(k); vn != nil {
			return l, yamlnode.Errorf(vn, "give either limit or unit and requests_per_unit, not both (%s is set)", k)
		}
	}
	s, err := yamlnode.String(ln, "limit")
	if err != nil {
		return l, err
	}
	pl, err := weir.ParseLimit(s)
	if err != nil {
		var le *weir.LimitError
		if errors.As(err, &le) {
			return l, yamlnode.Errorf(ln, "invalid limit %q: %s", le.Input, le.Reason)
		}
		return l, yamlnode.Errorf(ln, "%s", strings.TrimPrefix(err.Error(), "weir: "))
	}
	if pl.Rate > math.MaxUint32 {
		return l, yamlnode.Errorf(ln, "limit %q: the rate must fit requests_per_unit (at most %d)", s, uint32(math.MaxUint32))
	}
	if pl.Period%time.Second != 0 {
		return l, yamlnode.Errorf(ln, "limit %q: the period must be a whole number of seconds to be reported to Envoy", s)
	}
	l.Rate, l.Period, l.Burst = pl.Rate, pl.Period, pl.Burst
	r.rpu = uint32(pl.Rate)
	r.unit, r.mult = unitOf(pl.Period)
	return l, nil
}

// unitsOf reads Envoy's form, unit, requests_per_unit and unit_multiplier,
// of the rate_limit n, and sets r's reported rate and unit.
func (r *rule) unitsOf(n *yaml.Node, f yamlnode.Entries) (weir.Limit, error) {
	var l weir.Limit
	un := f.Get("unit")
	if un == nil {
		return l, yamlnode.Errorf(n, "rate_limit needs a unit (%s) and requests_per_unit, or unlimited: true", unitList)
	}
	us, err := yamlnode.String(un, "unit")
	if err != nil {
		return l, err
	}
	ui, ok := unitInfo[strings.ToLower(us)]
	if !ok {
		return l, yamlnode.Errorf(un, "unknown unit %q (want %s)", us, unitList)
	}
	rn := f.Get("requests_per_unit")
	if rn == nil {
		return l, yamlnode.Errorf(n, "rate_limit needs requests_per_unit")
	}
	rpu, err := yamlnode.Int(rn, "requests_per_unit")
	if err != nil {
		return l, err
	}
	if rpu < 0 || rpu > math.MaxUint32 {
		return l, yamlnode.Errorf(rn, "requests_per_unit %d is out of range (0 to %d; 0 blocks every request)", rpu, uint32(math.MaxUint32))
	}
	r.rpu, r.unit, r.mult = uint32(rpu), ui.pb, 1
	if mn := f.Get("unit_multiplier"); mn != nil {
		m, err := yamlnode.Int(mn, "unit_multiplier")
		if err != nil {
			return l, err
		}
		if m < 1 || m > math.MaxUint32 {
			return l, yamlnode.Errorf(mn, "unit_multiplier %d is out of range (at least 1)", m)
		}
		r.mult = uint32(m)
	}
	if time.Duration(r.mult) > math.MaxInt64/ui.d {
		return l, yamlnode.Errorf(f.Get("unit_multiplier"), "unit_multiplier %d makes the period too long", r.mult)
	}
	l.Rate = rpu
	l.Period = ui.d * time.Duration(r.mult)
	return l, nil
}

// algorithmAndBurst applies a rate_limit's algorithm and burst fields to l.
func algorithmAndBurst(l *weir.Limit, f yamlnode.Entries) error {
	if an := f.Get("algorithm"); an != nil {
		a, err := yamlnode.String(an, "algorithm")
		if err != nil {
			return err
		}
		if !slices.Contains(algorithms, a) {
			if a == string(weir.Concurrency) {
				return yamlnode.Errorf(an, "algorithm concurrency cannot be used from Envoy: the protocol has no way to release a slot")
			}
			return yamlnode.Errorf(an, "unknown algorithm %q (want %s)", a, strings.Join(algorithms, ", "))
		}
		l.Algorithm = weir.Algorithm(a)
	}
	if bn := f.Get("burst"); bn != nil {
		b, err := yamlnode.Int(bn, "burst")
		if err != nil {
			return err
		}
		if b <= 0 {
			return yamlnode.Errorf(bn, "burst must be positive, got %d", b)
		}
		if l.Burst != 0 {
			return yamlnode.Errorf(bn, "burst is given twice, in limit and in burst")
		}
		l.Burst = b
	}
	return nil
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
