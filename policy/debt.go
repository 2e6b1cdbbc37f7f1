package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weir-dev/weir"
)

// CheckKeyMode is CheckKeyTier with a mode: weir.ModeTake decides as
// CheckKeyTier does, weir.ModeDebit always consumes n (the key may go into
// debt), weir.ModeRefund gives n back (see weir.Limiter.Debit and Refund).
// A mode the rule's algorithm cannot take is an error wrapping
// weir.ErrUnsupported that names the mode, the rule and the algorithm, and
// changes nothing. When the store fails, the rule's on_error applies as
// for a take (local: the debit or refund goes to the local store).
func (p *Policy) CheckKeyMode(ctx context.Context, rule, tierName, key string, n int64, mode weir.Mode) (RuleResult, error) {
	if mode == weir.ModeTake {
		return p.CheckKeyTier(ctx, rule, tierName, key, n)
	}
	return p.checkKeyDebt(ctx, rule, tierName, key, weir.Request{N: n, Mode: mode})
}

// CheckKeySettle refunds n events of the take st dates (a reservation's
// weir.Stamp, from CheckKeyStamped) under the named rule's tier: only what
// the limit cannot have recovered since the take comes back
// (weir.Limiter.SettleStamped). A zero st is CheckKeyMode's refund.
func (p *Policy) CheckKeySettle(ctx context.Context, rule, tierName, key string, n int64, st weir.Stamp) (RuleResult, error) {
	return p.checkKeyDebt(ctx, rule, tierName, key, weir.Request{N: n, Mode: weir.ModeRefund, Stamp: st})
}

// CheckKeyStamped is CheckKeyTier for a reservation: when the store dates
// its takes (weir.StampStore, through the guard), an admitted take comes
// back with its Stamp, for CheckKeySettle. A rule with a lease is taken
// from the store directly, not from this instance's lease, so that its
// take is dated too. A store that dates nothing and a fallback's answer
// give a zero Stamp.
func (p *Policy) CheckKeyStamped(ctx context.Context, rule, tierName, key string, hits int64) (RuleResult, weir.Stamp, error) {
	r, t, rr, err := p.keyResult(rule, tierName, key)
	if err != nil {
		return RuleResult{}, weir.Stamp{}, err
	}
	start := time.Now()
	res, st, err := p.guard.TakeStamped(ctx, rr.Key, t.limit, hits)
	lat := time.Since(start)
	switch {
	case err == nil:
		rr.Result = res
	case errors.Is(err, weir.ErrInvalidCost) || errors.Is(err, weir.ErrInvalidLimit):
		return RuleResult{}, weir.Stamp{}, fmt.Errorf("policy: rule %q: %w", rule, err)
	default:
		st = weir.Stamp{}
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
	mode := q.Mode
	r, t, rr, err := p.keyResult(rule, tierName, key)
	if err != nil {
		return RuleResult{}, err
	}
	q.Key, q.Limit = rr.Key, t.limit
	reqs := [1]weir.Request{q}
	var out [1]weir.Result
	start := time.Now()
	err = p.guard.TakeAll(ctx, reqs[:], out[:])
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
