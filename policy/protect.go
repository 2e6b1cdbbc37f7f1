package policy

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir/protect"
)

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

// SystemRule is the name the system section's rejections and metrics
// carry.
const SystemRule = "system"

// protectRule is a compiled ProtectConfig.
type protectRule struct {
	m      *rule // its match only
	cfg    protect.Config
	header string // canonical priority header; "" none
}

// protectSet is the protect rules in force: rules[i] applies
// compiled.protects[i]. A reload hands the set's rules on to the next
// policy, so the requests in flight stay counted.
type protectSet struct {
	system *protect.Rule // nil: no system section
	rules  []*protect.Rule
}

// parseShare reads "20%" or "0.2" as 0.2; ok is false for anything else.
func parseShare(s string) (float64, bool) {
	num, pct := strings.CutSuffix(strings.TrimSpace(s), "%")
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	if pct {
		f /= 100
	}
	return f, true
}

// checkProtect validates the protect and system sections into c.
func checkProtect(cfg *Config, c *compiled, rep reporter) {
	first := map[string]string{}
	for i := range cfg.Protect {
		pc := &cfg.Protect[i]
		pp := index("protect", i)
		ok := checkRuleName(pc.Name, pp, rep)
		if fp, dup := first[pc.Name]; dup && pc.Name != "" {
			rep.addAt(pp+".name", fmt.Sprintf("duplicate protect rule name %s (first at %s)", quote(pc.Name), rep.where(fp+".name")))
			ok = false
		} else {
			first[pc.Name] = pp
		}
		pr := &protectRule{m: &rule{name: pc.Name}}
		ok = pr.m.checkMatch(pc.Match, pp, rep) && ok
		pr.cfg = protect.Config{
			Name: pc.Name, Concurrency: pc.Concurrency, Adaptive: pc.Adaptive,
			MinConcurrency: pc.MinConcurrency, MaxConcurrency: pc.MaxConcurrency, MaxWait: pc.MaxWait,
			Breaker: pc.Breaker, Shadow: pc.Shadow || cfg.Shadow,
		}
		reserveBad := false
		if pc.Reserve != "" {
			f, fine := parseShare(pc.Reserve)
			if !fine || f < 0 || f >= 1 {
				rep.addAt(pp+".reserve", fmt.Sprintf("reserve %s must be a share of the limit from 0%% to below 100%%, such as 20%% or 0.2", quote(pc.Reserve)))
				ok, reserveBad = false, true
			} else {
				pr.cfg.Reserve = f
			}
		}
		if pc.Priority != "" {
			h, fine := strings.CutPrefix(pc.Priority, "header:")
			if !fine || !validToken(h) {
				rep.addAt(pp+".priority", fmt.Sprintf("priority %s must be header:NAME, such as header:X-Priority", quote(pc.Priority)))
				ok = false
			}
			pr.header = http.CanonicalHeaderKey(h)
		}
		if pr.cfg.Reserve > 0 && pr.header == "" && pc.Priority == "" {
			rep.addAt(pp+".reserve", "reserve keeps a share for critical requests, and without priority no request is critical; set priority: header:NAME")
			ok, reserveBad = false, true
		}
		for _, p := range pr.cfg.Problems() {
			if p.Field == "name" || p.Field == "reserve" && reserveBad {
				continue
			}
			rep.addAt(pp+"."+p.Field, p.Message)
			ok = false
		}
		if ok {
			c.protects = append(c.protects, pr)
		}
	}
	checkSystem(cfg, c, rep)
}

// checkSystem validates the system section.
func checkSystem(cfg *Config, c *compiled, rep reporter) {
	s := cfg.System
	if s == (SystemConfig{}) {
		return
	}
	sc := protect.Config{Name: SystemRule, Concurrency: s.MaxInFlight, Shadow: cfg.Shadow}
	ok := true
	if s.MaxInFlight < 0 {
		rep.addAt("system.max_inflight", fmt.Sprintf("max_inflight must be at least 1, got %d", s.MaxInFlight))
		ok = false
	}
	if s.MaxCPU != "" {
		f, fine := parseShare(s.MaxCPU)
		if !fine || f <= 0 || f > 1 {
			rep.addAt("system.max_cpu", fmt.Sprintf("max_cpu %s must be a share of the CPU above 0%% and at most 100%%, such as 85%%", quote(s.MaxCPU)))
			ok = false
		}
		sc.MaxCPU = f
	}
	if ok {
		c.system = &sc
	}
}

// newProtectSet builds the protect rules of c on the policy's clock.
func newProtectSet(c *compiled, o *options) (*protectSet, error) {
	set := &protectSet{}
	mk := func(pc protect.Config) (*protect.Rule, error) {
		pc.Now = o.now
		return protect.New(pc)
	}
	if c.system != nil {
		r, err := mk(*c.system)
		if err != nil {
			return nil, err
		}
		set.system = r
	}
	for _, pr := range c.protects {
		r, err := mk(pr.cfg)
		if err != nil {
			return nil, err
		}
		set.rules = append(set.rules, r)
	}
	return set, nil
}

// inherit hands old's protect rules of the same names to p, reconfigured
// with p's config, so that a reload keeps counting the requests in flight
// and keeps the adaptive limits and breakers it learned. The Holder calls
// it before p goes in force.
func (p *Policy) inherit(old *Policy) {
	if old == nil || old == p {
		return
	}
	prev, cur := old.prot.Load(), p.prot.Load()
	if prev == nil || cur == nil {
		return
	}
	byName := map[string]*protect.Rule{}
	for _, r := range prev.rules {
		byName[r.Name()] = r
	}
	next := &protectSet{system: cur.system, rules: make([]*protect.Rule, len(cur.rules))}
	reuse := func(r *protect.Rule, pc protect.Config) *protect.Rule {
		pc.Now = p.now
		if r != nil && r.Reconfigure(pc) == nil {
			return r
		}
		return nil
	}
	if p.c.system != nil {
		if r := reuse(prev.system, *p.c.system); r != nil {
			next.system = r
		}
	}
	for i, pr := range p.c.protects {
		next.rules[i] = cur.rules[i]
		if r := reuse(byName[pr.cfg.Name], pr.cfg); r != nil {
			next.rules[i] = r
		}
	}
	p.prot.Store(next)
}

// ProtectStats returns a snapshot of the protect rules in force, the
// system section's first when there is one (named SystemRule).
func (p *Policy) ProtectStats() []protect.Stats {
	set := p.prot.Load()
	if set == nil {
		return nil
	}
	out := make([]protect.Stats, 0, len(set.rules)+1)
	if set.system != nil {
		out = append(out, set.system.Stats())
	}
	for _, r := range set.rules {
		out = append(out, r.Stats())
	}
	return out
}

// HasProtection reports whether the policy has a system section or protect
// rules: without them Protect admits everything and costs nothing.
func (p *Policy) HasProtection() bool {
	set := p.prot.Load()
	return set != nil && (set.system != nil || len(set.rules) > 0)
}

// Admission is the protect tickets a request holds; Done ends them.
type Admission struct {
	buf [3]protect.Ticket
	t   []protect.Ticket
}

// Done ends every ticket: failed says the request failed (a 5xx or a
// panic). It may be called once.
func (a *Admission) Done(failed bool) { a.DoneWaited(failed, 0) }

// DoneWaited is Done for a request that spent client of its latency
// blocked on its client (protect.Track measures it): only the rest feeds
// the adaptive limits and the breakers.
func (a *Admission) DoneWaited(failed bool, client time.Duration) {
	if a == nil {
		return
	}
	for i := range a.t {
		a.t[i].DoneWaited(failed, client)
	}
	a.t = nil
}

// Cancel gives the tickets back without counting an outcome.
func (a *Admission) Cancel() {
	if a == nil {
		return
	}
	for i := range a.t {
		a.t[i].Cancel()
	}
	a.t = nil
}

// Protect applies the system section and every protect rule matching r, in
// file order: all or nothing. A critical request may wait, up to a rule's
// max_wait or until the request's context ends, for a slot. On success the Admission holds a ticket per
// rule and must be ended with Done once the request has been served (nil
// when the policy has no protect rules nor system section); on refusal the
// tickets already taken are given back and the *Rejection says which rule
// refused and why (protect.WriteRejection answers it).
func (p *Policy) Protect(r *http.Request) (*Admission, *protect.Rejection) {
	set := p.prot.Load()
	if set == nil || set.system == nil && len(set.rules) == 0 {
		return nil, nil
	}
	a := &Admission{}
	a.t = a.buf[:0]
	var rp reqPath
	ctx := r.Context()
	take := func(pr *protect.Rule, prio protect.Priority) *protect.Rejection {
		t, err := pr.Wait(ctx, prio)
		if err != nil {
			a.Cancel()
			rej, ok := err.(*protect.Rejection)
			if !ok { // not returned today; shed rather than panic
				rej = &protect.Rejection{Rule: pr.Name(), Reason: protect.ReasonOverloaded, Priority: prio}
			}
			return rej
		}
		a.t = append(a.t, t)
		return nil
	}
	// The system section and rules without a priority header see every
	// request as normal: only a rule that names the header can make one
	// critical.
	if set.system != nil {
		if rej := take(set.system, protect.Normal); rej != nil {
			return nil, rej
		}
	}
	for i, pr := range p.c.protects {
		if _, ok := pr.m.match(r, &rp); !ok {
			continue
		}
		prio := protect.Normal
		if pr.header != "" {
			prio = protect.ParsePriority(r.Header.Get(pr.header))
		}
		if rej := take(set.rules[i], prio); rej != nil {
			return nil, rej
		}
	}
	return a, nil
}
