package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// settleKey settles a reservation (KeyRequest.Settle).
func (p *Policy) settleKey(ctx context.Context, rule, tierName, key string, st weir.Stamp, actual int64) (RuleResult, error) {
	r, err := p.rule(rule)
	if err != nil {
		return RuleResult{}, err
	}
	id, ok := strings.CutPrefix(key, weir.Key(r.name)+":")
	if !ok || id == "" {
		return RuleResult{}, fmt.Errorf("policy: rule %q: store key %q is not one of the rule's", rule, key)
	}
	if actual < 0 || actual > algorithm.MaxDebt {
		return RuleResult{}, fmt.Errorf("policy: rule %q: %w: actual cost %d is outside 0..%d", rule, weir.ErrInvalidCost, actual, int64(algorithm.MaxDebt))
	}
	t := r.pick(tierName)
	rr := RuleResult{Rule: r.name, Identity: id, Key: key, Limit: t.limit, Tier: t.name, Shadow: r.shadow, NearLimit: r.nearLimit}
	q := weir.Request{Mode: weir.ModeTake} // settled at the estimate: a peek
	switch {
	case actual > st.Estimate:
		q.Mode, q.N = weir.ModeDebit, actual-st.Estimate
	case actual < st.Estimate:
		q.Mode, q.N = weir.ModeRefund, st.Estimate-actual
		if !st.IsZero() {
			q.Stamp = st // only what the limit cannot have recovered since the take
		}
	}
	return p.decideKey(ctx, r, t, rr, q)
}

// checkKeyStamped is checkKeyTier for a reservation (KeyRequest.Reserve):
// a zero Stamp when the store dates nothing and for a fallback's answer.
func (p *Policy) checkKeyStamped(ctx context.Context, rule, tierName, key string, hits int64) (RuleResult, weir.Stamp, error) {
	r, t, rr, err := p.keyResult(rule, tierName, key)
	if err != nil {
		return RuleResult{}, weir.Stamp{}, err
	}
	start := time.Now()
	q := [1]weir.Request{{Key: rr.Key, Limit: t.limit, N: hits}}
	var res [1]weir.Result
	err = p.store.Do(ctx, q[:], res[:])
	lat := time.Since(start)
	var st weir.Stamp
	switch {
	case err == nil:
		rr.Result, st = res[0], res[0].Stamp(hits)
	case errors.Is(err, weir.ErrInvalidCost) || errors.Is(err, weir.ErrInvalidLimit):
		return RuleResult{}, weir.Stamp{}, fmt.Errorf("policy: rule %q: %w", rule, err)
	default:
		rr.Err, rr.Fallback = err, r.onError
		reqs := [1]weir.Request{{Key: rr.Key, Limit: t.limit, N: hits}}
		var out [1]weir.Result
		_ = p.guard.Fallback(ctx, r.onError, reqs[:], out[:], p.Instances())
		rr.Result = out[0]
	}
	if p.observer != nil {
		p.observer(ctx, rr, lat)
	}
	return rr, st, nil
}

// checkKeyDebt decides a debit or refund q (N, Mode, Stamp) for key
// under the named rule's tier.
func (p *Policy) checkKeyDebt(ctx context.Context, rule, tierName, key string, q weir.Request) (RuleResult, error) {
	r, t, rr, err := p.keyResult(rule, tierName, key)
	if err != nil {
		return RuleResult{}, err
	}
	return p.decideKey(ctx, r, t, rr, q)
}

// decideKey decides q (N, Mode, Stamp) for rr's key under r's tier t, as
// one request to the store, applying r's on_error when it fails.
func (p *Policy) decideKey(ctx context.Context, r *rule, t *tier, rr RuleResult, q weir.Request) (RuleResult, error) {
	mode, rule := q.Mode, r.name
	q.Key, q.Limit = rr.Key, t.limit
	reqs := [1]weir.Request{q}
	var out [1]weir.Result
	start := time.Now()
	err := p.store.Do(ctx, reqs[:], out[:])
	lat := time.Since(start)
	switch {
	case err == nil:
		rr.Result = out[0]
	case errors.Is(err, weir.ErrUnsupported):
		return RuleResult{}, fmt.Errorf("policy: rule %q (%s): mode %q: %w", rule, t.limit.Algorithm, mode, err)
	case errors.Is(err, weir.ErrInvalidCost) || errors.Is(err, weir.ErrInvalidLimit):
		return RuleResult{}, fmt.Errorf("policy: rule %q: %w", rule, err)
	default:
		rr.Err, rr.Fallback = err, r.onError
		_ = p.guard.Fallback(ctx, r.onError, reqs[:], out[:], p.c.instances)
		rr.Result = out[0]
	}
	if p.observer != nil {
		p.observer(ctx, rr, lat)
	}
	return rr, nil
}

// SupportsDebt reports whether the named rule's tier can take debits and
// refunds (and so reservations): nil, or an error wrapping
// weir.ErrUnsupported (or ErrUnknownRule) that names the rule.
func (p *Policy) SupportsDebt(rule, tierName string) error {
	r, err := p.rule(rule)
	if err != nil {
		return err
	}
	l := r.pick(tierName).limit
	c, err := l.Compile()
	if err != nil {
		return err
	}
	if !c.Debts() {
		return fmt.Errorf("policy: rule %q (%s): %w: debits, refunds and reservations are not defined for it", rule, l.Algorithm, weir.ErrUnsupported)
	}
	return nil
}
