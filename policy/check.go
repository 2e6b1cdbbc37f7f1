package policy

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/internal/price"
	"github.com/weir-dev/weir/internal/yamlnode"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/protect"
	"github.com/weir-dev/weir/store/localbudget"
)

// reporter receives semantic problems: the YAML walker, which knows
// positions, or a plain list for a Config built in Go.
type reporter interface {
	addAt(path, msg string)
	keyAt(path, msg string)
	where(path string) string
}

// plain collects problems without positions, for New.
type plain struct{ problems []config.Problem }

func (p *plain) addAt(path, msg string) {
	p.problems = append(p.problems, config.Problem{Path: path, Message: msg})
}
func (p *plain) keyAt(path, msg string)   { p.addAt(path, msg) }
func (p *plain) where(path string) string { return path }

// plain is a config.Reporter too, for config.Check.
func (p *plain) Add(path, msg string)     { p.addAt(path, msg) }
func (p *plain) AddKey(path, msg string)  { p.keyAt(path, msg) }
func (p *plain) Where(path string) string { return p.where(path) }

// positioned adapts Parse's config.Reporter, which places problems at
// their lines and columns.
type positioned struct{ rep config.Reporter }

func (p positioned) addAt(path, msg string)   { p.rep.Add(path, msg) }
func (p positioned) keyAt(path, msg string)   { p.rep.AddKey(path, msg) }
func (p positioned) where(path string) string { return p.rep.Where(path) }

// compiled is a validated Config in the form Check runs on.
type compiled struct {
	trusted             []netip.Prefix
	ipHeader            string // canonical client_ip_header
	allowNets, denyNets []netip.Prefix
	allowVals, denyVals []valueSet
	rules               []*rule
	byName              map[string]*rule
	instances           int  // the static count, or auto's floor
	auto                bool // instances: auto
	defaultOnError      string
	nearLimit           float64 // the global near_limit; 0 off
	protects            []*protectRule
	system              *protect.Config // nil: no system section
	prices              *price.Table    // nil: no prices section
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
	nearLimit float64 // 0: off
	lease     int64   // units taken at once (store/localbudget); 0: off
	info      RuleInfo

	// cost and count: what a request costs and which responses count
	// (cost.go); nil for the common rule, which costs 1 and counts all.
	cost  *costSpec
	count []int
	// price prices a budget or cost_expr rule's usage (budget.go); nil
	// for other rules.
	price *pricer

	// fixedID and fixedKey are the identity and key of a rule counting by
	// route or by a constant alone, which are the same for every request.
	fixedID, fixedKey string
}

// settles reports whether r settles after the handler: a cost or a count.
func (r *rule) settles() bool { return r.cost != nil || r.count != nil || r.price != nil }

// tier is one limit of a rule; an untiered rule has one, named "default".
type tier struct {
	name  string
	limit weir.Limit
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
func check(cfg *config.Config, rep reporter) *compiled {
	c := &compiled{byName: map[string]*rule{}, instances: max(cfg.Instances, 1)}
	if cfg.InstancesAuto {
		c.auto, c.instances = true, max(cfg.InstancesFloor, 1)
	}
	c.nearLimit = checkNearLimit("near_limit", cfg.NearLimit, DefaultNearLimit, rep)
	c.defaultOnError = cfg.Store.OnError
	if c.defaultOnError == "" {
		c.defaultOnError = config.OnErrorLocal
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
	if h, ok := clientip.CanonicalHeader(cfg.ClientIPHeader); ok {
		c.ipHeader = h
	} else {
		rep.addAt("client_ip_header", fmt.Sprintf("client_ip_header %s is not a header name (want auto, X-Forwarded-For, X-Real-IP or the header your proxy sets, such as CF-Connecting-IP)", quote(cfg.ClientIPHeader)))
	}
	c.allowNets = prefixes("allow", cfg.Allow)
	c.denyNets = prefixes("deny", cfg.Deny)
	for _, a := range c.allowNets {
		for _, d := range c.denyNets {
			if a == d {
				rep.addAt(index("allow", indexOfPrefix(cfg.Allow, a)), fmt.Sprintf("%s is in both allow and deny (deny wins; remove one)", a))
			}
		}
	}
	c.prices = checkPrices(cfg.Prices, rep)
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
	checkProtect(cfg, c, rep)
	return c
}

func indexOfPrefix(list []string, p netip.Prefix) int {
	for i, s := range list {
		if q, msg := parsePrefix(s); msg == "" && q == p {
			return i
		}
	}
	return 0
}

func valueSets(path string, lists []config.ValueList, rep reporter) []valueSet {
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

func checkRule(rc *config.RuleConfig, rp string, c *compiled, cfg *config.Config, rep reporter) *rule {
	r := &rule{name: rc.Name, shadow: rc.Shadow || cfg.Shadow}
	ok := checkRuleName(rc.Name, rp, rep)
	var nlOK bool
	r.nearLimit, nlOK = parseNearLimit(rc.NearLimit, c.nearLimit)
	if !nlOK {
		rep.addAt(rp+".near_limit", nearLimitMsg(rc.NearLimit))
		ok = false
	}
	if rc.Budget != "" || rc.CostExpr != "" {
		own := *rc // the budget sets the limit the checks below read
		rc = &own
		ok = r.checkBudget(rc, rp, c, rep) && ok
	}
	ok = r.checkMatch(rc.Match, rp, rep) && ok
	ok = r.checkIdentities(rc, rp, c.trusted, rep) && ok
	ok = r.checkFailure(rc, rp, c, rep) && ok
	ok = r.checkLimits(rc, rp, rep) && ok
	ok = ok && r.checkLease(rc, rp, rep)
	ok = ok && r.checkCost(rc, rp, rep)
	if !ok {
		return nil
	}
	r.fixKey()
	r.info = ruleInfo(rc, r, rp)
	return r
}

// checkLease checks the rule's local budget against every tier's limit: an
// algorithm that takes it (the algorithm table's FieldLease), no block,
// and no more than the rate.
func (r *rule) checkLease(rc *config.RuleConfig, rp string, rep reporter) bool {
	if rc.LocalBudget == 0 {
		return true
	}
	// Messages name the key as written: local_budget, or lease, its
	// former name.
	key, noun := rc.LocalBudgetKey(), "a local budget"
	if key == "" {
		key = "local_budget"
	} else if key == "lease" {
		noun = "a lease"
	}
	at := rp + "." + key
	if rc.LocalBudget < 0 {
		rep.addAt(at, fmt.Sprintf("%s must be at least 1 (or 0 for none), got %d", key, rc.LocalBudget))
		return false
	}
	if rc.Cost != "" || rc.Count != nil {
		// A unit of a local budget is one request; a cost or a count settles
		// with debits and refunds in the store, which a budget does not hold.
		rep.addAt(at, fmt.Sprintf("%s %d and cost or count do not combine: %s spends one unit per request", key, rc.LocalBudget, noun))
		return false
	}
	for _, t := range r.tiers {
		l := t.limit
		of := ""
		if len(r.tiers) > 1 || r.tierBy != nil {
			of = " of tier " + quote(t.name)
		}
		switch {
		case !localbudget.Supports(l.Algorithm):
			rep.addAt(at, fmt.Sprintf("%s %d: %s applies only to %s, not %s%s (a bucket refills with time, so a unit spent later than it was taken could add to a later burst)",
				key, rc.LocalBudget, noun, algorithm.JoinNames(algorithm.Taking(algorithm.FieldLease), "and"), l.Algorithm, of))
		case l.Block != 0:
			rep.addAt(at, fmt.Sprintf("%s %d and block %v%s do not combine: units taken before a rejection would still be spent while the penalty box holds the key", key, rc.LocalBudget, l.Block, of))
		case rc.LocalBudget > l.Rate:
			rep.addAt(at, fmt.Sprintf("%s %d is over the limit's rate %d%s; %s takes part of the limit", key, rc.LocalBudget, l.Rate, of, noun))
		default:
			continue
		}
		return false
	}
	r.lease = rc.LocalBudget
	return true
}

// checkRuleName reports a rule name that is missing, too long or holds
// characters other than letters, digits, '.', '_' and '-'.
func checkRuleName(name, rp string, rep reporter) bool {
	switch {
	case name == "":
		rep.addAt(rp+".name", "rule needs a name")
	case len(name) > 64:
		rep.addAt(rp+".name", fmt.Sprintf("rule name %s is longer than 64 bytes", quote(name)))
	case !ruleNameOK(name):
		rep.addAt(rp+".name", fmt.Sprintf("rule name %s may only contain letters, digits, '.', '_' and '-'", quote(name)))
	default:
		return true
	}
	return false
}

// checkMatch compiles the rule's match section: methods, path and host.
func (r *rule) checkMatch(m config.MatchConfig, rp string, rep reporter) bool {
	ok := true
	bad := func(path, msg string) { rep.addAt(path, msg); ok = false }
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
	return ok
}

// checkIdentities parses the rule's identity list (ip when empty).
func (r *rule) checkIdentities(rc *config.RuleConfig, rp string, trusted []netip.Prefix, rep reporter) bool {
	ok := true
	bad := func(path, msg string) { rep.addAt(path, msg); ok = false }
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
		if id.kind == idRoute && rc.Match.Path == "" {
			bad(index(rp+".identity", i), "identity route needs match.path, whose pattern it counts by")
		}
		if id.kind == idTrustedHeader && len(trusted) == 0 {
			bad(index(rp+".identity", i), fmt.Sprintf("identity %s reads its header only from trusted_proxies, and weir.yaml lists none", quote(s)))
		}
		r.ids = append(r.ids, id)
	}
	return ok
}

// checkFailure sets what the rule does when its identity is missing
// (on_missing) and when the store fails (on_error).
func (r *rule) checkFailure(rc *config.RuleConfig, rp string, c *compiled, rep reporter) bool {
	ok := true
	bad := func(path, msg string) { rep.addAt(path, msg); ok = false }
	r.onMissing = rc.OnMissing
	switch rc.OnMissing {
	case "":
		r.onMissing = config.OnMissingSkip
	case config.OnMissingSkip, config.OnMissingDeny, config.OnMissingUseIP:
	default:
		bad(rp+".on_missing", fmt.Sprintf("unknown on_missing %s (want skip, deny or use_ip)", quote(rc.OnMissing)))
	}
	r.onError = rc.OnError
	if r.onError == "" {
		r.onError = c.defaultOnError
	}
	if rc.Shadow {
		if rc.OnMissing == config.OnMissingDeny {
			bad(rp+".on_missing", "on_missing: deny cannot apply to a shadow rule, which never blocks")
		}
		if rc.OnError == config.OnErrorDeny {
			bad(rp+".on_error", "on_error: deny cannot apply to a shadow rule, which never blocks")
		}
	}
	return ok
}

// checkLimits compiles the rule's limit, or its tiers.
func (r *rule) checkLimits(rc *config.RuleConfig, rp string, rep reporter) bool {
	ok := true
	if rc.Tiers == nil {
		if rc.Limit == "" {
			rep.addAt(rp, fmt.Sprintf("rule %s needs a limit (such as limit: 100/m) or tiers", quote(rc.Name)))
			ok = false
		} else if t, tok := checkLimit(rp, limitSpec{rc.Limit, rc.Algorithm, rc.Burst, rc.Block, rc.MaxDelay, rc.DelayAfter, rc.Buckets, rc.BlockList, rc.ForgetAfter, rc.Timezone, rc.ResetAt, rc.Warmup}, rep); tok {
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
		if rc.Buckets != 0 {
			rep.keyAt(rp+".buckets", "buckets and tiers are exclusive; give each tier its own buckets")
			ok = false
		}
		ok = checkTiers(rp, rc, r, rep) && ok
	}
	if r.tierBy != nil && r.tierBy.kind == idRoute && rc.Match.Path == "" {
		rep.addAt(rp+".tiers.by", "tiers by route needs match.path, whose pattern it picks by")
		ok = false
	}
	return ok
}

// fixKey precomputes the store key of a rule whose only identity is its
// route or a constant: the same for every request.
func (r *rule) fixKey() {
	if len(r.ids) != 1 {
		return
	}
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
	buckets          int64
	blocks           []time.Duration // block as a list: escalating boxes
	forgetAfter      time.Duration
	timezone         string // a calendar window's zone and start of day
	resetAt          string
	warmup           time.Duration
}

// checkLimit validates one limit at path (a rule or a tier). It gathers
// the limit from the rule's keys and lets weir.Limit.Compile validate it;
// Compile's error names the setting at fault, and limitProblem points it
// at the key that holds it.
func checkLimit(path string, s limitSpec, rep reporter) (*tier, bool) {
	ok := true
	l, err := weir.ParseLimit(s.limit)
	if err != nil {
		rep.addAt(path+".limit", limitMessage(err))
		ok = false
	}
	l.Algorithm = weir.GCRA
	if !s.applyCalendar(path, &l, rep) {
		return nil, false
	}
	if s.algorithm != "" {
		l.Algorithm = weir.Algorithm(s.algorithm)
		if _, known := l.Algorithm.Kind(); !known {
			rep.addAt(path+".algorithm", unknownAlgorithm(s.algorithm))
			return nil, false
		}
	}
	// Burst and buckets may be written in the limit ("100/m burst 20") or
	// as keys, not both.
	if s.burst != 0 {
		if l.Burst != 0 {
			rep.keyAt(path+".burst", fmt.Sprintf("burst is given both in limit (%s) and as burst: %d; use one", quote(s.limit), s.burst))
			ok = false
		}
		l.Burst = s.burst
	}
	if s.buckets != 0 {
		if l.Buckets != 0 {
			rep.keyAt(path+".buckets", fmt.Sprintf("buckets are given both in limit (%s) and as buckets: %d; use one", quote(s.limit), s.buckets))
			ok = false
		}
		l.Buckets = s.buckets
	}
	if !ok {
		return nil, false
	}
	l.Block, l.MaxDelay, l.DelayAfter = s.block, s.maxDelay, s.delayAfter
	if !s.applyPenalty(path, &l, rep) {
		return nil, false
	}
	l.Warmup = s.warmup
	if _, err := l.Compile(); err != nil {
		limitProblem(path, s, l, err, rep)
		return nil, false
	}
	return &tier{limit: l}, true
}

// limitProblem reports Compile's error err about l at the key of s that
// holds the setting it names (or at limit, which holds the rest).
func limitProblem(path string, s limitSpec, l weir.Limit, err error, rep reporter) {
	at := path + ".limit"
	var fe *algorithm.FieldError
	if !errors.As(err, &fe) {
		var le *weir.LimitError
		if errors.As(err, &le) && le.Field == algorithm.FieldTimezone.String() && s.timezone != "" {
			at = path + ".timezone"
		}
		rep.addAt(at, limitMessage(err))
		return
	}
	if key := fe.Field.String(); s.given(fe.Field) {
		at = path + "." + key
	} else if fe.Field == algorithm.FieldForgetAfter && fe.Problem == algorithm.NeedsOther {
		at = path + ".block" // a block list without forget_after
	} else if fe.Field == algorithm.FieldCalendar && s.algorithm != "" {
		at = path + ".algorithm" // a calendar limit on an algorithm without windows
	}
	kind := fe.Kind.String()
	switch f, pr := fe.Field, fe.Problem; {
	case f == algorithm.FieldWarmup && pr == algorithm.Invalid && fe.Value > algorithm.MaxWarmup:
		rep.addAt(at, fmt.Sprintf("warmup %v is longer than a day: a key idle that long goes cold again long before it warms up", time.Duration(fe.Value)*time.Microsecond))
	case f == algorithm.FieldBurst && pr == algorithm.NotTaken:
		rep.addAt(at, fmt.Sprintf("burst applies only to %s, not %s", algorithm.JoinNames(algorithm.Taking(f), "and"), kind))
	case (f == algorithm.FieldMaxDelay || f == algorithm.FieldDelayAfter) && pr == algorithm.NotTaken:
		rep.keyAt(at, fmt.Sprintf("max_delay and delay_after apply only to %s, not %s", algorithm.JoinNames(algorithm.Taking(f), "and"), kind))
	case f == algorithm.FieldDelayAfter && pr == algorithm.NeedsOther:
		rep.keyAt(at, "delay_after needs max_delay (shaping)")
	case f == algorithm.FieldBuckets && pr == algorithm.NotTaken:
		rep.addAt(at, fmt.Sprintf("buckets %d: buckets apply only to %s, not %s", fe.Value, algorithm.JoinNames(algorithm.Taking(f), "and"), kind))
	case f == algorithm.FieldBuckets && pr == algorithm.OutOfRange:
		rep.addAt(at, fmt.Sprintf("buckets %d is out of range: a %s takes %d to %d buckets", fe.Value, algorithm.JoinNames(algorithm.Taking(f), "or"), algorithm.MinBuckets, algorithm.MaxBuckets))
	case f == algorithm.FieldBuckets && pr == algorithm.NoSplit:
		rep.addAt(at, fmt.Sprintf("buckets %d do not split the period %v into whole microseconds; pick a count that divides it", fe.Value, l.Period))
	default:
		rep.addAt(at, limitMessage(err))
	}
}

// given reports whether the rule sets field f with a key of its own
// (rather than in its limit string, or not at all).
func (s limitSpec) given(f algorithm.Field) bool {
	switch f {
	case algorithm.FieldBurst:
		return s.burst != 0
	case algorithm.FieldBlock:
		return s.block != 0
	case algorithm.FieldMaxDelay:
		return s.maxDelay != 0
	case algorithm.FieldDelayAfter:
		return s.delayAfter != 0
	case algorithm.FieldBuckets:
		return s.buckets != 0
	case algorithm.FieldForgetAfter:
		return s.forgetAfter != 0
	case algorithm.FieldTimezone:
		return s.timezone != ""
	case algorithm.FieldResetAt:
		return s.resetAt != ""
	case algorithm.FieldWarmup:
		return s.warmup != 0
	}
	return false
}

// applyCalendar sets l's calendar window from timezone and reset_at: a
// limit per day with either becomes a calendar day, and a calendar limit
// without an algorithm counts in a fixed_window, the one algorithm whose
// windows have an end.
func (s limitSpec) applyCalendar(path string, l *weir.Limit, rep reporter) bool {
	if s.resetAt != "" {
		d, ok := parseTimeOfDay(s.resetAt)
		if !ok {
			rep.addAt(path+".reset_at", fmt.Sprintf("reset_at %s is not a time of day such as \"02:00\" or \"23:30:15\"", quote(s.resetAt)))
			return false
		}
		l.ResetAt = d
	}
	l.Timezone = s.timezone
	if l.Calendar == 0 && l.Period == 24*time.Hour && (s.timezone != "" || s.resetAt != "") {
		l.Calendar = algorithm.CalendarDay
	}
	if l.Calendar != 0 && s.algorithm == "" {
		l.Algorithm = weir.FixedWindow
	}
	return true
}

// parseTimeOfDay reads "HH:MM" or "HH:MM:SS", 00:00 to 23:59:59.
func parseTimeOfDay(v string) (time.Duration, bool) {
	for _, layout := range []string{"15:04", "15:04:05"} {
		if t, err := time.Parse(layout, v); err == nil {
			return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute + time.Duration(t.Second())*time.Second, true
		}
	}
	return 0, false
}

// applyPenalty sets l's escalating penalty from a block list and
// forget_after, reporting a list that is too long or does not grow at the
// entry at fault.
func (s limitSpec) applyPenalty(path string, l *weir.Limit, rep reporter) bool {
	l.ForgetAfter = s.forgetAfter
	if len(s.blocks) == 0 {
		return true
	}
	bp := path + ".block"
	if len(s.blocks) > algorithm.MaxBlockSteps {
		rep.addAt(bp, fmt.Sprintf("block lists %d boxes; at most %d", len(s.blocks), algorithm.MaxBlockSteps))
		return false
	}
	for i, b := range s.blocks {
		switch {
		case b <= 0:
			rep.addAt(index(bp, i), fmt.Sprintf("block box %v must be positive", b))
			return false
		case i > 0 && b <= s.blocks[i-1]:
			rep.addAt(index(bp, i), fmt.Sprintf("block list must grow, shortest first: %v comes after %v", b, s.blocks[i-1]))
			return false
		case i > 0:
			l.Escalate[i-1] = b
		}
	}
	l.Block = s.blocks[0]
	return true
}

// limitMessage words a weir limit error without the package prefix.
func limitMessage(err error) string {
	var le *weir.LimitError
	if errors.As(err, &le) {
		return fmt.Sprintf("invalid limit %s: %s", quote(le.Input), le.Reason)
	}
	return strings.TrimPrefix(err.Error(), "weir: ")
}

func checkTiers(rp string, rc *config.RuleConfig, r *rule, rep reporter) bool {
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
		spec := limitSpec{tc.Limit, tc.Algorithm, tc.Burst, tc.Block, tc.MaxDelay, tc.DelayAfter, tc.Buckets, nil, 0, rc.Timezone, rc.ResetAt, rc.Warmup}
		if spec.algorithm == "" {
			spec.algorithm = rc.Algorithm
		}
		if spec.block == 0 {
			spec.block, spec.blocks, spec.forgetAfter = rc.Block, rc.BlockList, rc.ForgetAfter
		}
		if spec.maxDelay == 0 && spec.delayAfter == 0 {
			spec.maxDelay, spec.delayAfter = rc.MaxDelay, rc.DelayAfter
		}
		t, tok := checkLimit(p, spec, rep)
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
			if yamlnode.Suggest(tc.Name, []string{"default"}) != "" {
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

// unknownAlgorithm words the problem of an algorithm name that is none:
// with the closest name when there is one, else with them all.
func unknownAlgorithm(name string) string {
	if best := yamlnode.Suggest(name, algorithm.Names()); best != "" {
		return fmt.Sprintf("unknown algorithm %s (did you mean %q?)", quote(name), best)
	}
	return fmt.Sprintf("unknown algorithm %s (want %s)", quote(name), algorithm.JoinNames(algorithm.Names(), "or"))
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

func quote(s string) string { return strconv.Quote(s) }
