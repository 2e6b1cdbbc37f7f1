package policy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
)

// Failure policies: what a rule does while the store is failing.
const (
	OnErrorAllow = "allow" // admit the request (fail open)
	OnErrorDeny  = "deny"  // reject the request (fail closed)
	OnErrorLocal = "local" // decide with an in-process limiter: the limit divided by instances
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

// reporter receives semantic problems: the YAML walker, which knows
// positions, or a plain list for a Config built in Go.
type reporter interface {
	addAt(path, msg string)
	keyAt(path, msg string)
	where(path string) string
}

// plain collects problems without positions.
type plain struct{ problems []Problem }

func (p *plain) addAt(path, msg string) {
	p.problems = append(p.problems, Problem{Path: path, Message: msg})
}
func (p *plain) keyAt(path, msg string)   { p.addAt(path, msg) }
func (p *plain) where(path string) string { return path }

// compiled is a validated Config in the form Check runs on.
type compiled struct {
	trusted             []netip.Prefix
	allowNets, denyNets []netip.Prefix
	allowVals, denyVals []valueSet
	rules               []*rule
	byName              map[string]*rule
	instances           int
	defaultOnError      string
}

// valueSet is an allow or deny list of identity values.
type valueSet struct {
	id     identity
	values map[string]bool
}

// rule is a compiled RuleConfig.
type rule struct {
	name      string
	methods   map[string]bool // nil: any
	host      string          // lower case; "" any
	hostWild  bool            // host is a "*." suffix
	dotHost   string          // "." + host, for hostWild
	path      *pathPattern    // nil: any path
	ids       []identity
	onMissing string
	tierBy    *identity
	tiers     []*tier // tiers[0] is the default
	tierNamed map[string]*tier
	shadow    bool
	onError   string
	info      RuleInfo

	// fixedID and fixedKey are the identity and key of a rule counting by
	// route or by a constant alone, which are the same for every request.
	fixedID, fixedKey string
}

// tier is one limit of a rule; an untiered rule has one, named "default".
type tier struct {
	name  string
	limit weir.Limit
	local weir.Limit // the limit the local fallback enforces
	quota int64      // what Result.Limit reports: Rate, or the burst of a bucket
}

var ruleNameOK = func(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return s != ""
}

// check validates cfg, reporting every problem to rep, and compiles it.
// The result is only usable when nothing was reported.
func check(cfg *Config, rep reporter) *compiled {
	c := &compiled{byName: map[string]*rule{}, instances: max(cfg.Instances, 1)}
	checkStore(cfg, rep)
	if cfg.Instances < 0 {
		rep.addAt("instances", fmt.Sprintf("instances must be at least 1, got %d", cfg.Instances))
	}
	c.defaultOnError = cfg.Store.OnError
	if c.defaultOnError == "" {
		c.defaultOnError = cfg.OnError
	}
	if c.defaultOnError == "" {
		c.defaultOnError = OnErrorLocal
	}
	for _, s := range []struct{ path, v string }{{"server.http", cfg.Server.HTTP}, {"server.grpc", cfg.Server.GRPC}} {
		if s.v == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(s.v); err != nil || !validPort(port) {
			rep.addAt(s.path, fmt.Sprintf("%s %s must be host:port or :port, such as :8080", lastName(s.path), quote(s.v)))
		}
	}
	prefixes := func(path string, list []string) []netip.Prefix {
		out := make([]netip.Prefix, 0, len(list))
		for i, s := range list {
			p, msg := parsePrefix(s)
			if msg != "" {
				rep.addAt(index(path, i), msg)
				continue
			}
			out = append(out, p)
		}
		return out
	}
	c.trusted = prefixes("trusted_proxies", cfg.TrustedProxies)
	c.allowNets = prefixes("allow", cfg.Allow)
	c.denyNets = prefixes("deny", cfg.Deny)
	for _, a := range c.allowNets {
		for _, d := range c.denyNets {
			if a == d {
				rep.addAt(index("allow", indexOfPrefix(cfg.Allow, a)), fmt.Sprintf("%s is in both allow and deny (deny wins; remove one)", a))
			}
		}
	}
	c.allowVals = valueSets("allow_values", cfg.AllowValues, rep)
	c.denyVals = valueSets("deny_values", cfg.DenyValues, rep)

	first := map[string]string{} // rule name → path of its first use
	for i := range cfg.Rules {
		rp := index("rules", i)
		name := cfg.Rules[i].Name
		fp, dup := first[name]
		if dup && name != "" {
			rep.addAt(rp+".name", fmt.Sprintf("duplicate rule name %s (first at %s)", quote(name), rep.where(fp+".name")))
		} else {
			first[name] = rp
		}
		r := checkRule(&cfg.Rules[i], rp, c, cfg, rep)
		if r == nil || dup {
			continue
		}
		c.byName[r.name] = r
		c.rules = append(c.rules, r)
	}
	return c
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 0 && n <= 65535
}

func indexOfPrefix(list []string, p netip.Prefix) int {
	for i, s := range list {
		if q, msg := parsePrefix(s); msg == "" && q == p {
			return i
		}
	}
	return 0
}

func checkStore(cfg *Config, rep reporter) {
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
			rep.addAt("store.redis", "store.redis is set but store.type is memory; set type: redis or remove store.redis")
		}
	case StoreRedis:
		if len(r.Addrs) == 0 {
			rep.addAt("store.type", "store.type redis needs store.redis.addrs")
		}
	default:
		rep.addAt("store.type", fmt.Sprintf("unknown store type %s (want memory or redis)", quote(s.Type)))
	}
	for i, a := range r.Addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || !validPort(port) || port == "0" {
			rep.addAt(index("store.redis.addrs", i), fmt.Sprintf("redis address %s must be host:port, such as 127.0.0.1:6379", quote(a)))
		}
	}
	if r.Password != "" && r.PasswordEnv != "" {
		rep.keyAt("store.redis.password_env", "password and password_env are exclusive; use one")
	}
	if r.DB < 0 {
		rep.addAt("store.redis.db", fmt.Sprintf("db must be at least 0, got %d", r.DB))
	}
	if len(r.Addrs) > 1 && r.MasterName == "" && r.DB != 0 {
		rep.addAt("store.redis.db", fmt.Sprintf("db %d cannot be used with Redis Cluster (several addrs without master_name), which has only db 0", r.DB))
	}
	if r.MaxInFlight < 0 {
		rep.addAt("store.redis.max_in_flight", fmt.Sprintf("max_in_flight must be at least 1, got %d", r.MaxInFlight))
	}
	if r.MaxBatch < 0 || r.MaxBatch > 1000 {
		rep.addAt("store.redis.max_batch", fmt.Sprintf("max_batch must be 1 to 1000, got %d", r.MaxBatch))
	}
	if s.Timeout < 0 {
		rep.addAt("store.timeout", fmt.Sprintf("timeout must be positive, got %v", s.Timeout))
	}
	checkOnError("store.on_error", s.OnError, rep)
	if s.MaxKeys < 0 {
		rep.addAt("store.max_keys", fmt.Sprintf("max_keys must be at least 1, got %d", s.MaxKeys))
	}
	b := s.Breaker
	if b.Failures < 0 || b.MinRequests < 0 || b.FailureRatio < 0 || b.FailureRatio > 1 || b.Window < 0 || b.Cooldown < 0 {
		rep.addAt("store.breaker", "breaker settings must not be negative, and failure_ratio must be at most 1")
	}
}

func checkOnError(path, v string, rep reporter) {
	switch v {
	case "", OnErrorAllow, OnErrorDeny, OnErrorLocal:
		return
	}
	rep.addAt(path, fmt.Sprintf("unknown on_error %s (want allow, deny or local)", quote(v)))
}

func valueSets(path string, lists []ValueList, rep reporter) []valueSet {
	var out []valueSet
	for i, vl := range lists {
		p := index(path, i)
		if vl.Identity == "" {
			rep.addAt(p, "an {identity, values} entry needs identity, such as header:X-API-Key")
			continue
		}
		id, err := parseIdentity(vl.Identity)
		if err != nil {
			rep.addAt(p+".identity", err.Error())
			continue
		}
		switch id.kind {
		case idHeader, idCookie, idQuery, idMethod:
		case idIP:
			rep.addAt(p+".identity", "list client addresses as CIDRs, not as {identity: ip}")
			continue
		default:
			rep.addAt(p+".identity", fmt.Sprintf("identity %s cannot be listed; use header, cookie, query or method", quote(vl.Identity)))
			continue
		}
		if len(vl.Values) == 0 {
			rep.addAt(p, "an {identity, values} entry needs at least one value")
			continue
		}
		set := make(map[string]bool, len(vl.Values))
		for _, v := range vl.Values {
			set[v] = true
		}
		out = append(out, valueSet{id: id, values: set})
	}
	return out
}

func checkRule(rc *RuleConfig, rp string, c *compiled, cfg *Config, rep reporter) *rule {
	r := &rule{name: rc.Name, shadow: rc.Shadow || cfg.Shadow}
	ok := true
	bad := func(path, msg string) { rep.addAt(path, msg); ok = false }
	switch {
	case rc.Name == "":
		bad(rp+".name", "rule needs a name")
	case len(rc.Name) > 64:
		bad(rp+".name", fmt.Sprintf("rule name %s is longer than 64 bytes", quote(rc.Name)))
	case !ruleNameOK(rc.Name):
		bad(rp+".name", fmt.Sprintf("rule name %s may only contain letters, digits, '.', '_' and '-'", quote(rc.Name)))
	}

	// match
	m := rc.Match
	for i, meth := range m.Methods {
		up := strings.ToUpper(strings.TrimSpace(meth))
		if !validToken(up) {
			bad(index(rp+".match.methods", i), fmt.Sprintf("invalid method %s", quote(meth)))
			continue
		}
		if r.methods == nil {
			r.methods = map[string]bool{}
		}
		r.methods[up] = true
		if up == http.MethodGet {
			r.methods[http.MethodHead] = true
		}
	}
	if m.Path != "" {
		pp, msg := compilePath(m.Path)
		if msg != "" {
			bad(rp+".match.path", msg)
		}
		r.path = pp
	}
	if m.Host != "" {
		h := strings.ToLower(m.Host)
		r.host, r.hostWild = strings.CutPrefix(h, "*.")
		r.dotHost = "." + r.host
		switch {
		case strings.ContainsAny(r.host, "/ *") || r.host == "":
			bad(rp+".match.host", fmt.Sprintf("host %s must be a host name such as api.example.com or *.example.com", quote(m.Host)))
		case strings.Contains(r.host, ":") && !strings.HasPrefix(r.host, "["):
			bad(rp+".match.host", fmt.Sprintf("host %s must not include a port", quote(m.Host)))
		}
	}

	// identity
	specs := rc.Identity
	if len(specs) == 0 {
		specs = []string{"ip"}
	}
	seen := map[string]bool{}
	for i, s := range specs {
		id, err := parseIdentity(s)
		if err != nil {
			bad(index(rp+".identity", i), err.Error())
			continue
		}
		if seen[s] {
			bad(index(rp+".identity", i), fmt.Sprintf("identity %s is listed twice", quote(s)))
			continue
		}
		seen[s] = true
		if id.kind == idRoute && m.Path == "" {
			bad(index(rp+".identity", i), "identity route needs match.path, whose pattern it counts by")
		}
		r.ids = append(r.ids, id)
	}
	r.onMissing = rc.OnMissing
	switch rc.OnMissing {
	case "":
		r.onMissing = OnMissingSkip
	case OnMissingSkip, OnMissingDeny, OnMissingUseIP:
	default:
		bad(rp+".on_missing", fmt.Sprintf("unknown on_missing %s (want skip, deny or use_ip)", quote(rc.OnMissing)))
	}
	checkOnError(rp+".on_error", rc.OnError, rep)
	r.onError = rc.OnError
	if r.onError == "" {
		r.onError = c.defaultOnError
	}
	if rc.Shadow {
		if rc.OnMissing == OnMissingDeny {
			bad(rp+".on_missing", "on_missing: deny cannot apply to a shadow rule, which never blocks")
		}
		if rc.OnError == OnErrorDeny {
			bad(rp+".on_error", "on_error: deny cannot apply to a shadow rule, which never blocks")
		}
	}

	// limits
	if rc.Tiers == nil {
		if rc.Limit == "" {
			bad(rp, fmt.Sprintf("rule %s needs a limit (such as limit: 100/m) or tiers", quote(rc.Name)))
		} else if t, tok := checkLimit(rp, limitSpec{rc.Limit, rc.Algorithm, rc.Burst, rc.Block, rc.MaxDelay, rc.DelayAfter}, c.instances, rep); tok {
			t.name = "default"
			r.tiers = []*tier{t}
		} else {
			ok = false
		}
	} else {
		if rc.Limit != "" {
			rep.keyAt(rp+".limit", "limit and tiers are exclusive; put this limit in tiers.default")
			ok = false
		}
		if rc.Burst != 0 {
			rep.keyAt(rp+".burst", "burst and tiers are exclusive; give each tier its own burst")
			ok = false
		}
		ok = checkTiers(rp, rc, r, c.instances, rep) && ok
	}
	if r.tierBy != nil && r.tierBy.kind == idRoute && m.Path == "" {
		bad(rp+".tiers.by", "tiers by route needs match.path, whose pattern it picks by")
	}
	if !ok {
		return nil
	}
	if len(r.ids) == 1 {
		switch id := r.ids[0]; id.kind {
		case idRoute:
			if r.path != nil {
				r.fixedID = r.path.str
			}
		case idConst:
			r.fixedID = id.arg
		}
		if r.fixedID != "" {
			r.fixedKey = weir.Key(r.name, r.fixedID)
		}
	}
	r.info = ruleInfo(rc, r, rp)
	return r
}

// compilePath compiles a path pattern, or returns an error message. A
// one-pattern http.ServeMux validates it, so that policy accepts exactly
// the patterns ServeMux does, with its messages; Check then matches with
// the pathPattern, which answers as that ServeMux would.
func compilePath(p string) (pp *pathPattern, msg string) {
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Sprintf("path %s must start with \"/\"; put methods in match.methods and the host in match.host", quote(p))
	}
	if strings.ContainsAny(p, " \t") {
		return nil, fmt.Sprintf("path %s must not contain spaces; put methods in match.methods and the host in match.host", quote(p))
	}
	defer func() {
		if e := recover(); e != nil {
			pp = nil
			m := fmt.Sprint(e)
			m = strings.TrimPrefix(m, "parsing "+quote(p)+": ")
			msg = fmt.Sprintf("invalid path pattern %s: %s", quote(p), m)
		}
	}()
	http.NewServeMux().Handle(p, http.NotFoundHandler())
	return parsePathPattern(p), ""
}

// limitSpec is a limit as a rule or tier writes it.
type limitSpec struct {
	limit, algorithm string
	burst            int64
	block, maxDelay  time.Duration
	delayAfter       int64
}

// checkLimit validates one limit at path (a rule or a tier).
func checkLimit(path string, s limitSpec, instances int, rep reporter) (*tier, bool) {
	ok := true
	l, err := weir.ParseLimit(s.limit)
	if err != nil {
		rep.addAt(path+".limit", limitMessage(err))
		ok = false
	}
	l.Algorithm = weir.GCRA
	if s.algorithm != "" {
		l.Algorithm = weir.Algorithm(s.algorithm)
		if _, known := l.Algorithm.Kind(); !known {
			rep.addAt(path+".algorithm", fmt.Sprintf("unknown algorithm %s (want fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra or concurrency)", quote(s.algorithm)))
			return nil, false
		}
	}
	burstPath := path + ".limit"
	if s.burst != 0 {
		burstPath = path + ".burst"
		if l.Burst != 0 {
			rep.keyAt(path+".burst", fmt.Sprintf("burst is given both in limit (%s) and as burst: %d; use one", quote(s.limit), s.burst))
			ok = false
		}
		l.Burst = s.burst
	}
	if !ok {
		return nil, false
	}
	bucket := l.Algorithm == weir.TokenBucket || l.Algorithm == weir.LeakyBucket || l.Algorithm == weir.GCRA
	if l.Burst != 0 && !bucket {
		rep.addAt(burstPath, fmt.Sprintf("burst applies only to token_bucket, leaky_bucket and gcra, not %s", l.Algorithm))
		ok = false
	}
	l.Block = s.block
	if s.block != 0 && l.Algorithm == weir.Concurrency {
		rep.addAt(path+".block", "block (the penalty box) does not apply to the concurrency algorithm")
		ok = false
	}
	l.MaxDelay, l.DelayAfter = s.maxDelay, s.delayAfter
	if (s.maxDelay != 0 || s.delayAfter != 0) && l.Algorithm != weir.LeakyBucket {
		p := path + ".max_delay"
		if s.maxDelay == 0 {
			p = path + ".delay_after"
		}
		rep.keyAt(p, fmt.Sprintf("max_delay and delay_after apply only to leaky_bucket, not %s", l.Algorithm))
		ok = false
	} else if s.delayAfter != 0 && s.maxDelay == 0 {
		rep.keyAt(path+".delay_after", "delay_after needs max_delay (shaping)")
		ok = false
	}
	if !ok {
		return nil, false
	}
	p, err := l.Compile()
	if err != nil {
		rep.addAt(path+".limit", limitMessage(err))
		return nil, false
	}
	return &tier{limit: l, local: scaleLimit(l, instances), quota: p.Cap}, true
}

// limitMessage words a weir limit error without the package prefix.
func limitMessage(err error) string {
	var le *weir.LimitError
	if errors.As(err, &le) {
		return fmt.Sprintf("invalid limit %s: %s", quote(le.Input), le.Reason)
	}
	return strings.TrimPrefix(err.Error(), "weir: ")
}

func checkTiers(rp string, rc *RuleConfig, r *rule, instances int, rep reporter) bool {
	tp := rp + ".tiers"
	ts := rc.Tiers
	ok := true
	if ts.By == "" {
		rep.addAt(tp, "tiers needs by, the identity that picks the tier, such as header:X-Plan")
		ok = false
	} else if id, err := parseIdentity(ts.By); err != nil {
		rep.addAt(tp+".by", err.Error())
		ok = false
	} else {
		r.tierBy = &id
	}
	r.tierNamed = map[string]*tier{}
	var def *tier
	hasDefault := false
	for _, tc := range ts.Tiers {
		p := tp + "." + tc.Name
		if tc.Name == "default" {
			hasDefault = true
		}
		if r.tierNamed[tc.Name] != nil {
			rep.keyAt(p, fmt.Sprintf("tier %s is given twice", quote(tc.Name)))
			ok = false
			continue
		}
		if tc.Limit == "" {
			rep.addAt(p, fmt.Sprintf("tier %s needs a limit, such as {limit: 100/m}", quote(tc.Name)))
			ok = false
			continue
		}
		spec := limitSpec{tc.Limit, tc.Algorithm, tc.Burst, tc.Block, tc.MaxDelay, tc.DelayAfter}
		if spec.algorithm == "" {
			spec.algorithm = rc.Algorithm
		}
		if spec.block == 0 {
			spec.block = rc.Block
		}
		if spec.maxDelay == 0 && spec.delayAfter == 0 {
			spec.maxDelay, spec.delayAfter = rc.MaxDelay, rc.DelayAfter
		}
		t, tok := checkLimit(p, spec, instances, rep)
		if !tok {
			ok = false
			continue
		}
		t.name = tc.Name
		r.tierNamed[tc.Name] = t
		if tc.Name == "default" {
			def = t
		} else {
			r.tiers = append(r.tiers, t)
		}
	}
	if !hasDefault {
		msg := "tiers needs a default tier, used when by has no value or names no tier"
		for _, tc := range ts.Tiers {
			if editDistance(strings.ToLower(tc.Name), "default") <= 2 {
				msg += fmt.Sprintf(" (is %s a misspelling of default?)", quote(tc.Name))
				break
			}
		}
		rep.addAt(tp, msg)
		return false
	}
	if def != nil {
		r.tiers = append([]*tier{def}, r.tiers...)
	}
	return ok
}

// scaleLimit is l divided among n instances, rounded up, at least 1: what
// the local fallback enforces in each.
func scaleLimit(l weir.Limit, n int) weir.Limit {
	if n <= 1 {
		return l
	}
	div := func(v int64) int64 { return max((v+int64(n)-1)/int64(n), 1) }
	s := l
	s.Rate = div(l.Rate)
	if l.Burst > 0 {
		s.Burst = div(l.Burst)
	}
	if l.DelayAfter > 0 {
		s.DelayAfter = div(l.DelayAfter)
	}
	if s.Validate() != nil {
		return l
	}
	return s
}
