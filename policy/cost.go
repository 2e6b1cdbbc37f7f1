package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy/config"
)

// costSpec is a rule's cost: a constant, or a request header or query
// parameter holding a whole number.
type costSpec struct {
	spec     string // as written
	kind     idKind // idConst, idHeader or idQuery
	arg      string // header name (canonical) or query name
	constant int64
}

// ErrBadCost is wrapped by the error of a request whose cost (a rule's
// cost: header or query parameter) is not a whole number the rule admits.
// The middleware answers 400.
var ErrBadCost = httplimit.ErrBadCost

// maxCountStatuses bounds a rule's count.status list.
const maxCountStatuses = 32

// checkCost reads a rule's cost and count. Debit and refund, which they
// need, must be defined for every tier's algorithm.
func (r *rule) checkCost(rc *config.RuleConfig, rp string, rep reporter) bool {
	ok := true
	bad := func(path, msg string) { rep.addAt(path, msg); ok = false }
	if rc.Cost != "" {
		c := &costSpec{spec: rc.Cost}
		kind, arg, hasArg := strings.Cut(rc.Cost, ":")
		switch {
		case hasArg && kind == "header" && arg != "":
			c.kind, c.arg = idHeader, http.CanonicalHeaderKey(arg)
		case hasArg && kind == "query" && arg != "":
			c.kind, c.arg = idQuery, arg
		default:
			n, err := strconv.ParseInt(rc.Cost, 10, 64)
			if err != nil || n < 0 {
				bad(rp+".cost", fmt.Sprintf("cost %s is neither a whole number nor header:NAME or query:NAME", quote(rc.Cost)))
				return false
			}
			c.kind, c.constant = idConst, n
		}
		r.cost = c
	}
	if rc.Count != nil {
		if len(rc.Count.Status) == 0 || len(rc.Count.Status) > maxCountStatuses {
			bad(rp+".count.status", fmt.Sprintf("count needs a status list of 1 to %d HTTP statuses, such as [401, 403]", maxCountStatuses))
		}
		for i, s := range rc.Count.Status {
			if s < 100 || s > 599 {
				bad(fmt.Sprintf("%s.count.status[%d]", rp, i), fmt.Sprintf("%d is not an HTTP status (100 to 599)", s))
			}
		}
		r.count = slices.Clone(rc.Count.Status)
	}
	if r.cost == nil && r.count == nil && r.price == nil {
		return ok
	}
	for _, t := range r.tiers {
		p, err := t.limit.Compile()
		if err == nil && !p.Debts() {
			field := ".cost"
			switch {
			case rc.Budget != "":
				field = ".budget"
			case rc.CostExpr != "":
				field = ".cost_expr"
			case rc.Cost == "":
				field = ".count"
			}
			bad(rp+field, fmt.Sprintf("cost and count settle after the handler with debits and refunds, which %s does not support (use %s)", t.limit.Algorithm, algorithm.JoinNames(algorithm.Supporting(algorithm.FeatureDebt), "or")))
			break
		}
		if r.cost != nil && r.cost.kind == idConst && r.cost.constant > p.MaxCost() {
			bad(rp+".cost", fmt.Sprintf("cost %d is more than tier %s can ever admit (%d)", r.cost.constant, quote(t.name), p.MaxCost()))
		}
	}
	return ok
}

// costOf returns what a request costs under r's tier limit l: 1 without
// a cost. A count rule takes 1 before the handler, so that no more
// requests than the limit has room for reach it at once, and Finish gives
// it back when the response's status is not one it counts.
func (r *rule) costOf(ctx context.Context, v *reqView, l weir.Limit) (int64, error) {
	if r.count != nil {
		return 1, nil
	}
	if r.price != nil {
		return r.priceOf(ctx, l)
	}
	c := r.cost
	if c == nil {
		return 1, nil
	}
	if c.kind == idConst {
		return c.constant, nil
	}
	id := identity{kind: c.kind, arg: c.arg}
	s := id.value(v, "")
	if s == "" {
		return 1, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	p, _ := l.Compile()
	if err != nil || n < 0 || n > p.MaxCost() {
		if len(s) > 32 {
			s = s[:32] + "…"
		}
		return 0, fmt.Errorf("%w: rule %q: %s is %q; want a whole number from 0 to %d", ErrBadCost, r.name, c.spec, s, p.MaxCost())
	}
	return n, nil
}

// Charges says what a request's handler did, for Verdict.Finish: the
// response status, and the real cost the handler charged (httplimit.Charge),
// if it did.
type Charges struct {
	Status  int
	Actual  int64
	Charged bool
	// Usage, when not nil, is the usage the response reported: each
	// budget or cost_expr rule settles at its price, whatever Actual says.
	Usage *Usage
}

// Metered reports whether a verdict has rules that settle after the
// handler (cost: or count:), so that Finish must be called.
func (v *Verdict) Metered() bool { return v.metered }

// Finish settles the rules with a cost or a count once the handler is done:
// a cost rule whose handler charged a real cost debits the excess over its
// estimate or refunds the rest; a count rule, which took its cost before
// the handler, gives it back when the response status is not one it
// counts. A refund is dated by its take's Stamp when the store dated it:
// it goes back only into the window, trailing period or bucket level it
// was taken from, never into a later one. Rules the store did not decide
// (a fallback, a skip, a denial, a rejection) settle nothing, except that
// a count rule decided by the local fallback gives its cost back to the
// local store. It runs with ctx, which should outlive the client
// (context.WithoutCancel), so that a client that went away is still
// charged.
func (p *Policy) Finish(ctx context.Context, v *Verdict, ch Charges) error {
	if !v.metered {
		return nil
	}
	var errs []error
	for i := range v.Results {
		rr := &v.Results[i]
		ru := p.c.byName[rr.Rule]
		if ru == nil || rr.Skipped || rr.Denied {
			continue
		}
		if ru.count != nil {
			if err := p.finishCount(ctx, v, rr, ru, ch.Status); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if rr.Err != nil || (!rr.Result.Allowed && !rr.Shadow) {
			continue
		}
		mode, n := weir.ModeTake, int64(0)
		actual, charged := ch.Actual, ch.Charged && ru.cost != nil
		if ru.price != nil {
			charged = ch.Usage != nil
			if charged {
				var err error
				if actual, err = ru.price.actual(*ch.Usage); err != nil {
					// Unpriceable usage keeps the estimate charged.
					errs = append(errs, fmt.Errorf("policy: rule %q: price the usage: %w", rr.Rule, err))
					continue
				}
			}
		}
		if charged {
			switch {
			case actual > rr.Cost:
				mode, n = weir.ModeDebit, actual-rr.Cost
			case actual < rr.Cost:
				mode, n = weir.ModeRefund, rr.Cost-actual
			}
		}
		if n == 0 {
			continue
		}
		reqs := [1]weir.Request{{Key: rr.Key, Limit: rr.Limit, N: n, Mode: mode}}
		if mode == weir.ModeRefund && !rr.Stamp.IsZero() {
			reqs[0].Stamp = rr.Stamp // only what the limit cannot have recovered since the take
		}
		var out [1]weir.Result
		if err := p.store.Do(ctx, reqs[:], out[:]); err != nil {
			errs = append(errs, fmt.Errorf("policy: rule %q: settle a %s of %d: %w", rr.Rule, mode, n, err))
		}
	}
	return errors.Join(errs...)
}

// finishCount settles count rule ru's result rr for a response of the
// given status: a counted status keeps the cost taken before the handler;
// any other gives it back, dated by the take's Stamp, to the store that
// took it (the local store for a local fallback's take). A result that
// took nothing (a rejection, a peek, a batch another rule rejected, an
// allow or deny fallback) gives nothing back.
func (p *Policy) finishCount(ctx context.Context, v *Verdict, rr *RuleResult, ru *rule, status int) error {
	if slices.Contains(ru.count, status) || rr.Cost <= 0 || !rr.Result.Allowed || rr.Result.Granted < rr.Cost {
		return nil
	}
	if !rr.Shadow && !v.Allowed {
		return nil // all or nothing: a rejected request consumed nothing
	}
	reqs := [1]weir.Request{{Key: rr.Key, Limit: rr.Limit, N: rr.Cost, Mode: weir.ModeRefund}}
	var out [1]weir.Result
	if rr.Err != nil {
		if rr.Fallback != config.OnErrorLocal {
			return nil
		}
		// The local store took it: give it back there.
		_ = p.guard.Fallback(ctx, config.OnErrorLocal, reqs[:], out[:], p.Instances())
		return nil
	}
	if !rr.Stamp.IsZero() {
		reqs[0].Stamp = rr.Stamp
	}
	if err := p.store.Do(ctx, reqs[:], out[:]); err != nil {
		return fmt.Errorf("policy: rule %q: give back an uncounted response's %d: %w", rr.Rule, rr.Cost, err)
	}
	return nil
}
