package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/localbudget"
	"github.com/weir-dev/weir/store/memstore"
)

// ErrUnknownRule is wrapped by CheckKey's error when no rule has the name.
var ErrUnknownRule = errors.New("policy: unknown rule")

// Policy is a compiled rule set over a store. It is immutable and safe for
// concurrent use; a reload builds a new Policy (see Holder).
type Policy struct {
	cfg      *Config
	c        *compiled
	guard    *guard.Guard
	observer func(context.Context, RuleResult, time.Duration)
	log      *slog.Logger
	now      func() time.Time
	infos    []RuleInfo
	leases   *localbudget.Table
	fleet    func() int // instances: auto's live count; nil: the floor
	// prot is the protect rules in force; Holder swaps it for one that
	// keeps the previous policy's rules (see inherit).
	prot atomic.Pointer[protectSet]
}

// An Option configures New.
type Option func(*options)

type options struct {
	observer func(context.Context, RuleResult, time.Duration)
	log      *slog.Logger
	now      func() time.Time
	guard    guard.Config
	leases   *localbudget.Table
	fleet    func() int
}

// WithLocalBudgets sets the table of local budgets (rules with
// local_budget: N). Share one across reloads, as weir serve does, so that
// the budgets held and their counters survive a reload; without it New
// makes a table of its own.
func WithLocalBudgets(t *localbudget.Table) Option { return func(o *options) { o.leases = t } }

// WithInstances sets where instances: auto reads the fleet's size: f
// returns how many instances are up now (weir serve counts its fleet
// registry in Redis). The policy never uses fewer than instances_floor.
// Without instances: auto in the config, f is ignored.
func WithInstances(f func() int) Option { return func(o *options) { o.fleet = f } }

// WithObserver reports every decision: each RuleResult that Check or
// CheckKey produces (shadow, skipped and fallback ones included) with the
// time its store call took. httplimit and the server hook metrics and logs
// here. The function must be safe for concurrent use and must not block.
func WithObserver(f func(ctx context.Context, r RuleResult, latency time.Duration)) Option {
	return func(o *options) { o.observer = f }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithClock sets the clock of the breaker and the local fallback store,
// for tests. It applies only when New builds the Guard itself.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithGuardConfig adjusts the Guard that New builds when it is given a
// plain store; the config file's store.timeout and store.breaker fill the
// fields left zero.
func WithGuardConfig(g guard.Config) Option { return func(o *options) { o.guard = g } }

// New compiles cfg into a Policy over store.
//
// Pass a *guard.Guard as store to share the circuit breaker and the local
// fallback counters across reloads; any other store is wrapped in a new
// Guard configured from cfg.Store. A nil store means a new memstore, which
// is only allowed when cfg.Store.Type is memory. An invalid cfg gives a
// *ConfigError.
func New(cfg *Config, store weir.Store, opts ...Option) (*Policy, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	var o options
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.now == nil {
		o.now = time.Now
	}
	rep := &plain{}
	c := check(cfg, rep)
	if len(rep.problems) > 0 {
		return nil, &ConfigError{Problems: rep.problems}
	}
	g, ok := store.(*guard.Guard)
	if !ok {
		if store == nil {
			if cfg.Store.Type == StoreRedis {
				return nil, errors.New("policy: store.type is redis, so New needs the Redis store (redisstore.New); it was given none")
			}
			var mo []memstore.Option
			if cfg.Store.MaxKeys > 0 {
				mo = append(mo, memstore.WithMaxKeys(cfg.Store.MaxKeys))
			}
			store = memstore.New(mo...)
		}
		gc := o.guard
		if gc.Timeout == 0 {
			gc.Timeout = cfg.Store.Timeout
		}
		if gc.Breaker == (guard.BreakerConfig{}) {
			gc.Breaker = cfg.Store.Breaker
		}
		if gc.Logger == nil {
			gc.Logger = o.log
		}
		if gc.Now == nil {
			gc.Now = o.now
		}
		if ts, ok := store.(interface{ Timeout() time.Duration }); ok && gc.StoreTimeout == 0 {
			// The store's own deadline per call (redisstore.Store).
			gc.StoreTimeout = ts.Timeout()
		}
		g = guard.New(store, gc)
	}
	set, err := newProtectSet(c, &o)
	if err != nil {
		return nil, err
	}
	p := &Policy{cfg: cfg, c: c, guard: g, observer: o.observer, log: o.log, now: o.now, leases: o.leases, fleet: o.fleet}
	if p.leases == nil {
		p.leases = localbudget.New(localbudget.Config{Now: o.now})
	}
	p.prot.Store(set)
	for _, r := range c.rules {
		p.infos = append(p.infos, r.info)
	}
	return p, nil
}

// Instances returns the instance count the policy divides by: the
// static instances, or under instances: auto the fleet's live count, never
// below instances_floor.
func (p *Policy) Instances() int {
	if p.c.auto && p.fleet != nil {
		return max(p.fleet(), p.c.instances)
	}
	return p.c.instances
}

// LocalBudgets returns the table of local budgets the policy spends from.
func (p *Policy) LocalBudgets() *localbudget.Table { return p.leases }

// Config returns the config the policy was built from. It must not be
// modified.
func (p *Policy) Config() *Config { return p.cfg }

// Guard returns the guard around the policy's store: its breaker state and
// failure counters are what metrics report.
func (p *Policy) Guard() *guard.Guard { return p.guard }

// Store returns the store behind the policy's guard.
func (p *Policy) Store() weir.Store { return p.guard.Store() }

// Rules describes the rules in force, in evaluation order.
func (p *Policy) Rules() []RuleInfo {
	out := make([]RuleInfo, len(p.infos))
	copy(out, p.infos)
	return out
}

// Limit returns the limit of rule's tier; "" is the default tier.
func (p *Policy) Limit(rule, tier string) (weir.Limit, error) {
	r, err := p.rule(rule)
	if err != nil {
		return weir.Limit{}, err
	}
	return r.pick(tier).limit, nil
}

func (p *Policy) rule(name string) (*rule, error) {
	r := p.c.byName[name]
	if r == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownRule, name)
	}
	return r, nil
}

// pick returns the tier named name, or the default.
func (r *rule) pick(name string) *tier {
	if t := r.tierNamed[name]; t != nil {
		return t
	}
	return r.tiers[0]
}

// RuleInfo describes a rule for GET /v1/rules and the dashboard.
type RuleInfo struct {
	Name      string    `json:"name"`
	Match     MatchInfo `json:"match"`
	Identity  []string  `json:"identity"`
	OnMissing string    `json:"on_missing"`
	// Limit, Algorithm and Block are the default tier's.
	Limit     string `json:"limit"`
	Algorithm string `json:"algorithm"`
	Block     string `json:"block,omitempty"`
	Shadow    bool   `json:"shadow"`
	// NearLimit is the rule's near_limit share (0.8 for 80%), 0 when off.
	NearLimit float64 `json:"near_limit"`
	OnError   string  `json:"on_error"`
	// LocalBudget is the rule's local_budget: units an instance takes
	// from the store at once and spends locally; 0 for none. Its JSON
	// name is still "lease".
	LocalBudget int64      `json:"lease,omitempty"`
	TierBy      string     `json:"tier_by,omitempty"`
	Tiers       []TierInfo `json:"tiers,omitempty"`
	// Blocks lists an escalating penalty's boxes (block: [1m, 10m, 1h]),
	// ForgetAfter its history; Timezone and ResetAt place a calendar
	// limit's windows; Warmup is a bucket's cold start. All are the
	// default tier's, empty when unset.
	Blocks      []string `json:"blocks,omitempty"`
	ForgetAfter string   `json:"forget_after,omitempty"`
	Timezone    string   `json:"timezone,omitempty"`
	ResetAt     string   `json:"reset_at,omitempty"`
	Warmup      string   `json:"warmup,omitempty"`
	// Cost is the rule's cost: setting, empty for 1; CountStatus its
	// count.status list (cost.go).
	Cost        string `json:"cost,omitempty"`
	CountStatus []int  `json:"count_status,omitempty"`

	path string
}

// setExtras fills the RuleInfo fields of the penalty-box, calendar and
// warm-up options from l.
func (info *RuleInfo) setExtras(l weir.Limit) {
	if l.ForgetAfter > 0 {
		info.Blocks = append(info.Blocks, l.Block.String())
		for _, b := range l.Escalate {
			if b == 0 {
				break
			}
			info.Blocks = append(info.Blocks, b.String())
		}
		info.ForgetAfter = l.ForgetAfter.String()
	}
	if l.Calendar != 0 {
		info.Timezone = l.Timezone
		if info.Timezone == "" {
			info.Timezone = "UTC"
		}
		info.ResetAt = fmt.Sprintf("%02d:%02d:%02d", int(l.ResetAt.Hours()), int(l.ResetAt.Minutes())%60, int(l.ResetAt.Seconds())%60)
	}
	info.Warmup = durString(l.Warmup)
}

// MatchInfo is a rule's match section.
type MatchInfo struct {
	Methods []string `json:"methods,omitempty"`
	Path    string   `json:"path,omitempty"`
	Host    string   `json:"host,omitempty"`
}

// TierInfo describes one tier of a rule.
type TierInfo struct {
	Name      string `json:"name"`
	Limit     string `json:"limit"`
	Algorithm string `json:"algorithm"`
	Block     string `json:"block,omitempty"`
}

func durString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

func ruleInfo(rc *RuleConfig, r *rule, path string) RuleInfo {
	info := RuleInfo{
		Name:        r.name,
		Match:       MatchInfo{Path: rc.Match.Path, Host: rc.Match.Host},
		OnMissing:   r.onMissing,
		Shadow:      r.shadow,
		NearLimit:   r.nearLimit,
		OnError:     r.onError,
		LocalBudget: r.lease,
		path:        path,
	}
	for _, m := range rc.Match.Methods {
		info.Match.Methods = append(info.Match.Methods, strings.ToUpper(strings.TrimSpace(m)))
	}
	for _, id := range r.ids {
		info.Identity = append(info.Identity, id.spec)
	}
	d := r.tiers[0].limit
	info.Limit, info.Algorithm, info.Block = d.String(), string(d.Algorithm), durString(d.Block)
	info.setExtras(d)
	if r.cost != nil {
		info.Cost = r.cost.spec
	}
	info.CountStatus = r.count
	if r.tierBy != nil {
		info.TierBy = r.tierBy.spec
		for _, t := range r.tiers {
			info.Tiers = append(info.Tiers, TierInfo{Name: t.name, Limit: t.limit.String(), Algorithm: string(t.limit.Algorithm), Block: durString(t.limit.Block)})
		}
	}
	return info
}

// Verdict is the outcome of Check for one request.
type Verdict struct {
	// Allowed says the request may proceed. It is false when an enforced
	// rule rejected it or it was Denied.
	Allowed bool
	// Denied says the request must be refused with 403 rather than 429:
	// the deny list matched it (Results is empty and no store call was
	// made), or a rule with on_missing: deny found no identity in it (that
	// RuleResult has Denied set, and no enforced rule consumed anything).
	Denied bool
	// AllowListed says the allow list matched: the request is never limited
	// and no rule was evaluated.
	AllowListed bool
	// Results has one entry per rule that matched the request, in rule
	// order, shadow and skipped rules included.
	Results []RuleResult
	// Limiting is the index in Results of the most restrictive enforced
	// result, as httplimit.MoreRestrictive orders them: a rejection (the
	// longest RetryAfter among several), else the fewest Remaining (then
	// the latest reset); a rule's on_missing denial before all. It is -1
	// when no enforced rule produced a result: none matched, or every
	// match was skipped or shadow.
	Limiting int

	leases []heldLease
	// metered: a rule with a cost or a count applied; Finish settles it.
	metered bool
	// BadCost is set when a rule's cost, read from the request, is not one
	// it admits (ErrBadCost): nothing was decided, and the middleware
	// answers 400.
	BadCost error
}

// Limited returns the most restrictive result, Results[Limiting].
func (v *Verdict) Limited() (RuleResult, bool) {
	if v.Limiting < 0 || v.Limiting >= len(v.Results) {
		return RuleResult{}, false
	}
	return v.Results[v.Limiting], true
}

// Release gives back the concurrency slots the request holds, for rules
// using the concurrency algorithm. Call it when the request is done;
// calling it on any verdict is harmless. Unreleased slots expire after the
// rule's period.
func (v *Verdict) Release(ctx context.Context) error {
	var errs []error
	for _, l := range v.leases {
		req := [1]weir.Request{{Key: l.key, Limit: l.limit, Mode: weir.ModeRelease, Lease: l.id}}
		var out [1]weir.Result
		if err := l.store.Do(ctx, req[:], out[:]); err != nil {
			errs = append(errs, err)
		}
	}
	v.leases = nil
	return errors.Join(errs...)
}

type heldLease struct {
	store weir.Store
	key   string
	limit weir.Limit
	id    string
}

// RuleResult is one rule's decision for one request.
type RuleResult struct {
	// Rule is the rule's name.
	Rule string
	// Identity is the identity value the rule counted: the client IP (or
	// its prefix, such as 192.0.2.0/24), a header value, and so on; for a
	// composite identity the values joined by weir.Key's escaping, as in
	// "alice:PROMO1"; "ip:ADDR" when on_missing: use_ip applied. CheckKey
	// with the same rule and Identity reaches the same state (use_ip
	// excepted: its state has a key no literal value can reach), and Reset
	// with them clears it (use_ip included).
	Identity string
	// Key is the store key: weir.Key(rule, identity).
	Key string
	// Limit is the limit applied (the tier's).
	Limit weir.Limit
	// Tier is the tier applied, "default" for an untiered rule.
	Tier string
	// Result is the decision. For a skipped or denied rule it is zero.
	Result weir.Result
	// Cost is what the request was charged before the handler: 1, or the
	// rule's cost (cost:). A rule that counts only some responses
	// (count:) takes 1 too, and Finish gives it back when the response's
	// status is not one it counts.
	Cost int64
	// Stamp dates the take of a rule with a cost or a count when the store dates its
	// takes (weir.StampStore for a rule decided alone, weir.StampAllStore
	// for one decided in a batch with other rules), so that Finish refunds
	// only what the limit cannot have recovered since
	// (weir.Limiter.SettleStamped). Zero otherwise (a store or wrapper that
	// dates nothing, a fallback's answer): a refund then goes into the
	// state as it is.
	Stamp weir.Stamp
	// Shadow marks a shadow rule: its Result is reported, never enforced.
	Shadow bool
	// NearLimit is the rule's near_limit share, 0 when off; IsNearLimit
	// compares Result with it.
	NearLimit float64
	// Skipped marks a rule that matched but was not applied: it found no
	// identity and has on_missing: skip, or another rule's on_missing: deny
	// refused the request first. Its Result is zero; renderers should
	// ignore it.
	Skipped bool
	// Denied marks a rule that matched but found no identity and has
	// on_missing: deny.
	Denied bool
	// Err is the store error, if any; Fallback then says which on_error
	// policy produced Result: "allow", "deny" or "local".
	Err      error
	Fallback string
}

// IsNearLimit reports whether r is an admitted, counting decision that
// left its key at or past the rule's near_limit share of the limit (see
// NearLimit). Skipped and denied rules, peeks and rejections never are.
func (r *RuleResult) IsNearLimit() bool {
	return !r.Skipped && !r.Denied && NearLimit(r.Result, r.NearLimit)
}

// enforced reports whether r counts toward the verdict.
func (r *RuleResult) enforced() bool { return !r.Shadow && !r.Skipped }

// match reports whether r applies to req, whose path as ServeMux sees it
// rp holds (or will), and the route pattern matched.
func (r *rule) match(req *http.Request, rp *reqPath) (string, bool) {
	if r.methods != nil && !r.methods[req.Method] {
		return "", false
	}
	if r.host != "" && !r.matchHost(req.Host) {
		return "", false
	}
	if r.path == nil {
		return "", true
	}
	// The pattern is returned for a match, and also when ServeMux would
	// redirect to a match: an unclean path (/api//login) or a missing
	// trailing slash (/api for /api/). Both count, so that a limit cannot
	// be dodged by spelling the path differently.
	if !r.path.match(rp.of(req)) {
		return "", false
	}
	return r.path.str, true
}

// matchHost reports whether host, the request's Host, is the rule's host or,
// for a wildcard, a subdomain of it: case-insensitively, without the port
// and a trailing dot. It allocates nothing for an ASCII host.
func (r *rule) matchHost(host string) bool {
	h := host
	ascii := true
	for i := 0; i < len(h); i++ {
		if h[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if !ascii {
		h = strings.ToLower(h)
	}
	// SplitHostPort fails, leaving h as it is, without a colon.
	if strings.IndexByte(h, ':') >= 0 {
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
	}
	h = strings.TrimSuffix(h, ".")
	if r.hostWild {
		return len(h) >= len(r.dotHost) && asciiLowerEqual(h[len(h)-len(r.dotHost):], r.dotHost)
	}
	return asciiLowerEqual(h, r.host)
}

// asciiLowerEqual reports whether strings.ToLower(s) == want for a want in
// lower case, ASCII-only s and any s already in lower case.
func asciiLowerEqual(s, want string) bool {
	if len(s) != len(want) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}

// identify returns the identity value of req for r and its store key
// weir.Key(r.name, id), or ok false when req lacks the identity.
func (r *rule) identify(v *reqView, route string) (id, key string, ok bool) {
	if r.fixedKey != "" {
		return r.fixedID, r.fixedKey, true
	}
	if len(r.ids) == 1 {
		if ip := &r.ids[0]; ip.kind == idIP {
			return ipKey(r.name, v.clientIP(), ip.bits4, ip.bits6)
		}
		id = r.ids[0].value(v, route)
		if id == "" {
			return "", "", false
		}
		return id, weir.Key(r.name, id), true
	}
	var buf [4]string
	parts := buf[:0]
	for i := range r.ids {
		s := r.ids[i].value(v, route)
		if s == "" {
			return "", "", false
		}
		parts = append(parts, s)
	}
	id = weir.Key(parts[0], parts[1:]...)
	return id, weir.Key(r.name, id), true
}

// maxScratch is how many rules a request can match, or a store call can
// carry, before Check's scratch space spills to the heap.
const maxScratch = 8

// hit is a rule that matched a request, with the route pattern matched.
type hit struct {
	ru    *rule
	route string
}

// Check runs the whole pipeline for an HTTP request: the deny and allow
// lists, then every rule that matches, all or nothing, and returns the
// combined verdict. It never fails: store errors are handled by each
// rule's on_error policy and reported in the results.
//
// Check allocates Verdict.Results and at most one string per matched rule
// for the common identities, its store key: an IPv4 ip identity shares
// the key's memory, and the key of a rule counting by route or by a
// constant alone is made once, at New. The rest of the decision path
// works on the stack or in pooled scratch space.
func (p *Policy) Check(ctx context.Context, r *http.Request) Verdict {
	v := reqView{r: r, trusted: p.c.trusted, ipHeader: p.c.ipHeader}
	if p.c.listed(&v, p.c.denyNets, p.c.denyVals) {
		return Verdict{Denied: true, Limiting: -1}
	}
	if p.c.listed(&v, p.c.allowNets, p.c.allowVals) {
		return Verdict{Allowed: true, AllowListed: true, Limiting: -1}
	}
	// Match first, so that Results is allocated once, at its size.
	var hBuf [maxScratch]hit
	hits := hBuf[:0]
	var rp reqPath
	for _, ru := range p.c.rules {
		if route, ok := ru.match(r, &rp); ok {
			hits = append(hits, hit{ru, route})
		}
	}
	verdict := Verdict{Allowed: true, Limiting: -1, Results: make([]RuleResult, 0, len(hits))}
	var eBuf, sBuf [maxScratch]int
	enforced, shadow := eBuf[:0], sBuf[:0] // indexes into verdict.Results to decide
	denied := false
	for _, h := range hits {
		rr, ok := h.ru.resolve(&v, h.route)
		if ok && (h.ru.cost != nil || h.ru.count != nil) {
			verdict.metered = true
			var err error
			if rr.Cost, err = h.ru.costOf(&v, rr.Limit); err != nil {
				return Verdict{Limiting: -1, BadCost: err}
			}
		}
		if rr.Denied && !rr.Shadow {
			denied = true
		}
		verdict.Results = append(verdict.Results, rr)
		if !ok {
			continue
		}
		if rr.Shadow {
			shadow = append(shadow, len(verdict.Results)-1)
		} else {
			enforced = append(enforced, len(verdict.Results)-1)
		}
	}
	res := verdict.Results
	var lBuf [maxScratch]time.Duration
	var lats []time.Duration
	if p.observer != nil {
		if len(res) <= len(lBuf) {
			lats = lBuf[:len(res)]
		} else {
			lats = make([]time.Duration, len(res))
		}
	}
	if denied {
		// Refused for a missing identity: the other enforced rules are not
		// applied, so they consume nothing and report nothing.
		verdict.Allowed, verdict.Denied = false, true
		for _, j := range enforced {
			res[j].Skipped = true
		}
	} else if len(enforced) > 0 {
		d := p.decide(ctx, res, enforced, &verdict)
		for _, j := range enforced {
			if lats != nil {
				lats[j] = d
			}
		}
	}
	for _, j := range shadow {
		one := [1]int{j}
		d := p.decide(ctx, res, one[:], &verdict)
		if lats != nil {
			lats[j] = d
		}
	}
	verdict.settle(denied)
	if p.observer != nil {
		for i := range res {
			p.observer(ctx, res[i], lats[i])
		}
	}
	return verdict
}

// resolve starts the result of a rule that matched: its identity and key
// (or its on_missing outcome) and its tier. ok is false when the rule has no
// key, so no store call: it is skipped, or denied by on_missing: deny.
func (ru *rule) resolve(v *reqView, route string) (rr RuleResult, ok bool) {
	rr = RuleResult{Rule: ru.name, Shadow: ru.shadow, NearLimit: ru.nearLimit}
	id, key, ok := ru.identify(v, route)
	if !ok {
		switch ru.onMissing {
		case OnMissingUseIP:
			id, key, ok = useIPKey(ru.name, v.clientIP())
		case OnMissingDeny:
			rr.Denied = true
		}
	}
	t := ru.tiers[0]
	if ru.tierBy != nil {
		t = ru.pick(ru.tierBy.value(v, route))
	}
	rr.Tier, rr.Limit = t.name, t.limit
	if !ok {
		rr.Skipped = !rr.Denied
		return rr, false
	}
	rr.Identity, rr.Key, rr.Cost = id, key, 1
	return rr, true
}

// settle sets Allowed and Limiting from the decided enforced results: an
// on_missing denial limits first; after one (denied), the other results do not
// count; otherwise the most restrictive result limits.
func (verdict *Verdict) settle(denied bool) {
	res := verdict.Results
	for i := range res {
		rr := &res[i]
		if !rr.enforced() {
			continue
		}
		if rr.Denied {
			if verdict.Limiting < 0 || !res[verdict.Limiting].Denied {
				verdict.Limiting = i
			}
			continue
		}
		if denied {
			continue
		}
		if !rr.Result.Allowed {
			verdict.Allowed = false
		}
		if verdict.Limiting < 0 || moreRestrictive(rr, &res[verdict.Limiting]) {
			verdict.Limiting = i
		}
	}
}

// moreRestrictive reports whether a limits more than b, as
// httplimit.MoreRestrictive orders results; a rule's on_missing denial,
// which Check puts first, is never displaced.
func moreRestrictive(a, b *RuleResult) bool {
	return !b.Denied && httplimit.MoreRestrictive(a.Result, b.Result)
}

// listed reports whether the request is in a list of CIDRs or values.
func (c *compiled) listed(v *reqView, nets []netip.Prefix, vals []valueSet) bool {
	if len(nets) > 0 {
		if ip := v.clientIP(); ip.IsValid() && inPrefixes(ip, nets) {
			return true
		}
	}
	for i := range vals {
		if s := vals[i].id.value(v, ""); s != "" && vals[i].values[s] {
			return true
		}
	}
	return false
}

// scratch is the requests and results of one store call, pooled so that
// deciding allocates nothing. Stores do not keep them past the call.
type scratch struct {
	reqs [maxScratch]weir.Request
	out  [maxScratch]weir.Result
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// getScratch returns n requests and results, from the pool when n fits;
// give s back to putScratch.
func getScratch(n int) (reqs []weir.Request, out []weir.Result, s *scratch) {
	if n > maxScratch {
		return make([]weir.Request, n), make([]weir.Result, n), nil
	}
	s = scratchPool.Get().(*scratch)
	return s.reqs[:n], s.out[:n], s
}

// putScratch clears the first n entries of s, so that the pool holds no
// keys, and gives it back; a nil s is ignored.
func putScratch(s *scratch, n int) {
	if s == nil {
		return
	}
	clear(s.reqs[:n])
	clear(s.out[:n])
	scratchPool.Put(s)
}

// decide takes the results at idx (all enforced, or one shadow rule) from
// the store, all or nothing, applying on_error on failure. It returns the
// store latency.
func (p *Policy) decide(ctx context.Context, res []RuleResult, idx []int, verdict *Verdict) time.Duration {
	start := time.Now()
	var lBuf, rBuf [maxScratch]int
	leased, rest := lBuf[:0], rBuf[:0]
	for _, j := range idx {
		if p.c.byName[res[j].Rule].lease > 0 {
			leased = append(leased, j)
		} else {
			rest = append(rest, j)
		}
	}
	if len(leased) > 0 {
		p.decideLeased(ctx, res, leased, rest, verdict)
		return time.Since(start)
	}
	p.decideStore(ctx, res, idx, 1, verdict)
	return time.Since(start)
}

// decideLeased decides the rules at leased, which have a local budget,
// from this instance's local budgets, then the rules at rest from the
// store, all or nothing: after such a rule's rejection the others only
// peek, and when the others reject the rules at leased give their units
// back to their budgets.
func (p *Policy) decideLeased(ctx context.Context, res []RuleResult, leased, rest []int, verdict *Verdict) {
	var tBuf [maxScratch]localbudget.Ticket
	tickets := tBuf[:0]
	rejected := false
	for _, j := range leased {
		if rejected {
			p.decideStore(ctx, res, []int{j}, 0, verdict)
			continue
		}
		r := p.c.byName[res[j].Rule]
		size := localbudget.Size(r.lease, res[j].Limit, p.Instances())
		out, tk, err := p.leases.TakeTicket(ctx, p.guard, res[j].Key, res[j].Limit, 1, size)
		if err != nil {
			p.fallback(ctx, res, []int{j}, err, verdict)
		} else {
			res[j].Result = out
		}
		rejected = !res[j].Result.Allowed
		if !rejected {
			tickets = append(tickets, tk)
		}
	}
	if rejected {
		// All or nothing: the leased rules that admitted before this
		// one's rejection give their units back.
		for _, tk := range tickets {
			p.leases.Give(tk)
		}
	}
	if len(rest) == 0 {
		return
	}
	n := int64(1)
	if rejected {
		n = 0
	}
	p.decideStore(ctx, res, rest, n, verdict)
	if rejected {
		return
	}
	for _, j := range rest {
		if !res[j].Result.Allowed {
			for _, tk := range tickets {
				p.leases.Give(tk)
			}
			return
		}
	}
}

// decideStore takes n (1, or 0 to peek) for each rule at idx from the
// store, all or nothing, applying on_error on failure. A peek's result
// reads as admitted: it says what the rule would have done.
func (p *Policy) decideStore(ctx context.Context, res []RuleResult, idx []int, n int64, verdict *Verdict) {
	g := p.guard
	reqs, out, s := getScratch(len(idx))
	for i, j := range idx {
		c := res[j].Cost
		if n == 0 {
			c = 0 // a peek
		}
		reqs[i] = weir.Request{Key: res[j].Key, Limit: res[j].Limit, N: c}
		if c > 0 && res[j].Limit.Algorithm == weir.Concurrency {
			reqs[i].Lease = weir.NewLeaseID()
		}
	}
	err := g.Do(ctx, reqs, out)
	if err == nil {
		for i, j := range idx {
			res[j].Result = out[i]
			if p.c.byName[res[j].Rule].settles() {
				// A rule with a cost or a count: its settlement refunds
				// with its take's time.
				res[j].Stamp = out[i].Stamp(reqs[i].N)
			}
			if n == 0 {
				res[j].Result.Allowed = true
			}
			if reqs[i].Lease != "" && out[i].Allowed && out[i].Granted > 0 {
				verdict.leases = append(verdict.leases, heldLease{g, reqs[i].Key, reqs[i].Limit, reqs[i].Lease})
			}
		}
	}
	putScratch(s, len(idx))
	if err != nil {
		p.fallback(ctx, res, idx, err, verdict)
	}
}

// fallback applies each rule's on_error to a failed store call, through
// guard.Guard.Fallback: deny rejects, allow admits, and local decides with the
// in-process store, all or nothing among the local rules; beside a deny
// rule, which rejects the request anyway, the local rules only peek.
func (p *Policy) fallback(ctx context.Context, res []RuleResult, idx []int, err error, verdict *Verdict) {
	g := p.guard
	anyDeny := false
	for _, j := range idx {
		res[j].Err = err
		res[j].Fallback = p.c.byName[res[j].Rule].onError
		anyDeny = anyDeny || res[j].Fallback == OnErrorDeny
	}
	for _, mode := range [...]string{OnErrorDeny, OnErrorAllow, OnErrorLocal} {
		var iBuf [maxScratch]int
		sel := iBuf[:0]
		for _, j := range idx {
			if res[j].Fallback == mode {
				sel = append(sel, j)
			}
		}
		if len(sel) == 0 {
			continue
		}
		reqs, out, s := getScratch(len(sel))
		for i, j := range sel {
			n := res[j].Cost
			if mode == OnErrorLocal && anyDeny {
				n = 0 // the request is rejected anyway: peek, consume nothing
			}
			reqs[i] = weir.Request{Key: res[j].Key, Limit: res[j].Limit, N: n}
			if mode == OnErrorLocal && n > 0 && reqs[i].Limit.Algorithm == weir.Concurrency {
				reqs[i].Lease = weir.NewLeaseID()
			}
		}
		_ = g.Fallback(ctx, mode, reqs, out, p.Instances()) // the modes are checked at New
		for i, j := range sel {
			res[j].Result = out[i]
			if reqs[i].Lease != "" && out[i].Allowed && out[i].Granted > 0 {
				verdict.leases = append(verdict.leases, heldLease{g.Local(), reqs[i].Key, guard.LocalLimit(reqs[i].Limit, p.Instances()), reqs[i].Lease})
			}
		}
		putScratch(s, len(sel))
	}
}

// CheckKey decides hits events for a raw identity key under the named
// rule's default tier, without an HTTP request: the POST /v1/check API.
// key is what RuleResult.Identity holds, such as a client IP or an API key;
// hits == 0 peeks. An unknown rule gives an error wrapping ErrUnknownRule;
// an empty key, or hits outside 0..the limit's capacity, give an error
// too. Store failures are not errors: the rule's on_error decides, and the
// RuleResult says so. The allow and deny lists do not apply. Under the
// concurrency algorithm an admitted CheckKey holds an anonymous slot until
// the period ends: there is no lease to release.
func (p *Policy) CheckKey(ctx context.Context, rule, key string, hits int64) (RuleResult, error) {
	return p.CheckKeyTier(ctx, rule, "", key, hits)
}

// keyResult finds rule and its tier for a key that a caller names (not
// a request) and returns the result to fill, keyed by the canonical key.
func (p *Policy) keyResult(rule, tierName, key string) (*rule, *tier, RuleResult, error) {
	r, err := p.rule(rule)
	if err != nil {
		return nil, nil, RuleResult{}, err
	}
	if key == "" {
		return nil, nil, RuleResult{}, fmt.Errorf("policy: rule %q: empty key", rule)
	}
	if key, err = r.canonicalKey(key); err != nil {
		return nil, nil, RuleResult{}, err
	}
	t := r.pick(tierName)
	rr := RuleResult{Rule: r.name, Identity: key, Key: weir.Key(r.name, key), Limit: t.limit, Tier: t.name, Shadow: r.shadow, NearLimit: r.nearLimit}
	return r, t, rr, nil
}

// CheckKeyTier is CheckKey under the named tier; a tier the rule lacks,
// or "", is the default tier.
func (p *Policy) CheckKeyTier(ctx context.Context, rule, tierName, key string, hits int64) (RuleResult, error) {
	r, t, rr, err := p.keyResult(rule, tierName, key)
	if err != nil {
		return RuleResult{}, err
	}
	start := time.Now()
	var res weir.Result
	if r.lease > 0 {
		res, err = p.leases.Take(ctx, p.guard, rr.Key, t.limit, hits, localbudget.Size(r.lease, t.limit, p.Instances()))
	} else {
		res, err = p.guard.Take(ctx, rr.Key, t.limit, hits)
	}
	lat := time.Since(start)
	switch {
	case err == nil:
		rr.Result = res
	case errors.Is(err, weir.ErrInvalidCost) || errors.Is(err, weir.ErrInvalidLimit):
		return RuleResult{}, fmt.Errorf("policy: rule %q: %w", rule, err)
	default:
		rr.Err, rr.Fallback = err, r.onError
		reqs := [1]weir.Request{{Key: rr.Key, Limit: t.limit, N: hits}}
		var out [1]weir.Result
		_ = p.guard.Fallback(ctx, r.onError, reqs[:], out[:], p.Instances()) // the modes are checked at New
		rr.Result = out[0]
	}
	if p.observer != nil {
		p.observer(ctx, rr, lat)
	}
	return rr, nil
}

// CanonicalKey returns key as the named rule counts it. For a rule whose
// identity is a single ip (ip, ip/24, ...), an address or a prefix is
// turned into the identity /v1/auth and the middleware give that client:
// IPv4-mapped addresses unmapped, IPv6 in canonical form, grouped by the
// rule's prefix, so "::ffff:203.0.113.9" is "203.0.113.9" and
// "2001:DB8::1" is "2001:db8::/64"; a prefix wider than the rule's
// grouping is an error. Any other key, and every key of other rules, is
// taken as it is.
// CheckKeyTier and Reset apply it themselves; the admin API uses it to
// read state by the same key.
func (p *Policy) CanonicalKey(rule, key string) (string, error) {
	r, err := p.rule(rule)
	if err != nil {
		return "", err
	}
	return r.canonicalKey(key)
}

// canonicalKey is CanonicalKey for r.
func (r *rule) canonicalKey(key string) (string, error) {
	if len(r.ids) != 1 || r.ids[0].kind != idIP || r.fixedKey != "" {
		return key, nil
	}
	id, ok, err := canonicalIP(key, r.ids[0].bits4, r.ids[0].bits6)
	switch {
	case err != nil:
		return "", fmt.Errorf("policy: rule %q counts by %s: %w", r.name, r.ids[0].spec, err)
	case !ok:
		// No request reaches a counter that is not an address: the key
		// stays as it is, an identity of its own.
		return key, nil
	}
	return id, nil
}

// Reset clears the state of key under every tier of the named rule,
// penalty box included: DELETE /v1/state.
func (p *Policy) Reset(ctx context.Context, rule, key string) error {
	r, err := p.rule(rule)
	if err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("policy: rule %q: empty key", rule)
	}
	if key, err = r.canonicalKey(key); err != nil {
		return err
	}
	keys := []string{weir.Key(r.name, key)}
	// "~" and a hash is how lists show an identity too long to keep
	// (weir.ShortIdentity): clear the state of the identity it stands for.
	if weir.IsHashedIdentity(key) {
		keys = append(keys, weir.KeyOfShort(r.name, key))
	}
	// "ip:ADDR" is how a result reports an identity counted by
	// on_missing: use_ip, whose store key differs from a literal value's
	// (so that no header value can reach it). Clear that state too; at
	// worst this also resets a literal identity spelled the same.
	if addr, ok := strings.CutPrefix(key, "ip:"); ok && r.onMissing == OnMissingUseIP {
		if id, ok, err := canonicalIP(addr, 32, clientip.DefaultIPv6Bits); ok && err == nil {
			keys = append(keys, weir.Key(r.name, "", id))
		}
	}
	var errs []error
	for _, sk := range keys {
		for _, t := range r.tiers {
			p.leases.Forget(sk, t.limit)
			if err := weir.NewLimiter(p.guard).Reset(ctx, sk, t.limit); err != nil {
				errs = append(errs, err)
			}
			// Again after the reset: a budget taken from the old state
			// between the first Forget and the reset must not be spent.
			p.leases.Forget(sk, t.limit)
		}
	}
	return errors.Join(errs...)
}
