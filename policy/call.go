package policy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/weir-dev/weir"
)

// CheckCall is Check for a caller that serves the request itself and
// reports its outcome to FinishCall, as package grpclimit does: a rule
// with a count (count:) takes its cost before the handler instead of only
// peeking, so that a burst of concurrent requests cannot get past a key
// that is used up, and FinishCall gives it back when the outcome is not
// one the rule counts. When such a take is refused, the verdict is a
// rejection and the other enforced rules give back what Check took for
// them (a leased rule's units excepted). Call Release as after Check.
func (p *Policy) CheckCall(ctx context.Context, r *http.Request) Verdict {
	v := p.Check(ctx, r)
	if !v.metered || !v.Allowed {
		return v
	}
	var eBuf, sBuf [maxScratch]int
	enforced, shadow := eBuf[:0], sBuf[:0]
	for i := range v.Results {
		rr := &v.Results[i]
		ru := p.c.byName[rr.Rule]
		// A result with a cost already took it; one the store did not
		// decide (a fallback, a skip, a denial) takes nothing more.
		if ru == nil || ru.count == nil || rr.Cost > 0 || rr.Skipped || rr.Denied || rr.Err != nil {
			continue
		}
		rr.Cost = 1
		if rr.Shadow {
			shadow = append(shadow, i)
		} else {
			enforced = append(enforced, i)
		}
	}
	for _, j := range shadow {
		p.decideStore(ctx, v.Results, []int{j}, 1, &v)
	}
	if len(enforced) == 0 {
		return v
	}
	p.decideStore(ctx, v.Results, enforced, 1, &v)
	for _, j := range enforced {
		if !v.Results[j].Result.Allowed {
			p.giveBack(context.WithoutCancel(ctx), &v, enforced)
			v.settle(false)
			return v
		}
	}
	return v
}

// giveBack refunds what Check took for the enforced rules of a verdict
// that a count rule's take then refused, except the rules at counted,
// whose takes were refused all together.
func (p *Policy) giveBack(ctx context.Context, v *Verdict, counted []int) {
	for i := range v.Results {
		rr := &v.Results[i]
		ru := p.c.byName[rr.Rule]
		if ru == nil || ru.lease > 0 || slices.Contains(counted, i) || !rr.enforced() || rr.Denied || rr.Err != nil || !rr.Result.Allowed || rr.Cost <= 0 || rr.Limit.Algorithm == weir.Concurrency {
			continue
		}
		if err := p.refund(ctx, rr); err != nil {
			p.log.Warn("weir: giving back a refused request's take failed", "err", err)
		}
	}
}

// FinishCall settles a verdict of CheckCall once the request was served
// with the HTTP status status: a count rule whose take the status does
// not count gets it back. A rule with a cost (cost:) keeps the estimate
// it took. Rules the store did not decide settle nothing. Run it with a
// ctx that outlives the client (context.WithoutCancel). A store failure
// leaves the take in place; it is logged to the policy's logger (the
// message names rules, never identities) and returned.
func (p *Policy) FinishCall(ctx context.Context, v *Verdict, status int) error {
	if !v.metered {
		return nil
	}
	var errs []error
	for i := range v.Results {
		rr := &v.Results[i]
		ru := p.c.byName[rr.Rule]
		if ru == nil || ru.count == nil || rr.Skipped || rr.Denied || rr.Err != nil || !rr.Result.Allowed || rr.Cost <= 0 {
			continue
		}
		if slices.Contains(ru.count, status) {
			continue
		}
		if err := p.refund(ctx, rr); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	if err != nil {
		p.log.Warn("weir: settling a request's count rules failed", "err", err)
	}
	return err
}

// refund gives back the cost rr took, by its take's time when the store
// dated it.
func (p *Policy) refund(ctx context.Context, rr *RuleResult) error {
	reqs := [1]weir.Request{{Key: rr.Key, Limit: rr.Limit, N: rr.Cost, Mode: weir.ModeRefund, Stamp: rr.Stamp}}
	var out [1]weir.Result
	if err := p.guard.TakeAll(ctx, reqs[:], out[:]); err != nil {
		return fmt.Errorf("policy: rule %q: refund %d: %w", rr.Rule, rr.Cost, err)
	}
	return nil
}
