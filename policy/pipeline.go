package policy

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/localbudget"
)

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
		if ok && h.ru.settles() {
			verdict.metered = true
			var err error
			if rr.Cost, err = h.ru.costOf(ctx, &v, rr.Limit); err != nil {
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
		case config.OnMissingUseIP:
			id, key, ok = useIPKey(ru.name, v.clientIP())
		case config.OnMissingDeny:
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

// decideLeased decides the leased rules at leased from this instance's
// leases, then the rules at rest from the store, all or nothing: after a
// leased rule's rejection the others only peek, and when the others reject
// the leased rules give their units back to their leases.
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
		out, tk, err := p.leases.TakeTicket(ctx, p.store, res[j].Key, res[j].Limit, 1, size)
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
	reqs, out, s := getScratch(len(idx))
	for i, j := range idx {
		c := res[j].Cost
		if n == 0 {
			c = 0 // a peek
		}
		reqs[i] = weir.Request{Key: res[j].Key, Limit: res[j].Limit, N: c}
		if c > 0 && res[j].Limit.Algorithm == weir.Concurrency {
			reqs[i].Lease = keys.NewLeaseID()
		}
	}
	err := p.store.Do(ctx, reqs, out)
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
				verdict.leases = append(verdict.leases, heldLease{p.store, reqs[i].Key, reqs[i].Limit, reqs[i].Lease})
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
		anyDeny = anyDeny || res[j].Fallback == config.OnErrorDeny
	}
	for _, mode := range [...]string{config.OnErrorDeny, config.OnErrorAllow, config.OnErrorLocal} {
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
			if mode == config.OnErrorLocal && anyDeny {
				n = 0 // the request is rejected anyway: peek, consume nothing
			}
			reqs[i] = weir.Request{Key: res[j].Key, Limit: res[j].Limit, N: n}
			if mode == config.OnErrorLocal && n > 0 && reqs[i].Limit.Algorithm == weir.Concurrency {
				reqs[i].Lease = keys.NewLeaseID()
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
