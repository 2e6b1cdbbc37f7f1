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

// SettleKey settles a reservation: the take of st.Estimate events that
// CheckKeyStamped made under the named rule's tier, for the store key key
// (that take's RuleResult.Key), now that the real cost actual is known. It
// debits actual − st.Estimate when more was used, refunds st.Estimate −
// actual when less was, and peeks when they are equal. The refund is dated
// by st when st.At is set: only what the limit cannot have recovered since
// the take comes back (weir.Limiter.SettleStamped). The store key, unlike
// the identity it was made from, is bounded (weir.Key hashes a long
// identity), so a caller keeping open reservations keeps it rather than
// the identity. A key that is not one of the rule's is an error, and so
// is an actual outside 0..algorithm.MaxDebt. When the store fails, the
// rule's on_error applies as for CheckKeyMode.
func (p *Policy) SettleKey(ctx context.Context, rule, tierName, key string, st weir.Stamp, actual int64) (RuleResult, error) {
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

// CheckKeyStamped is CheckKeyTier for a reservation: when the store dates
// its takes (weir.StampStore, through the guard), an admitted take comes
// back with its Stamp, for SettleKey. A rule with a local budget is
// taken from the store directly, not from this instance's budget, so its
// take is dated too. A store that dates nothing and a fallback's answer
// give a zero Stamp.
func (p *Policy) CheckKeyStamped(ctx context.Context, rule, tierName, key string, hits int64) (RuleResult, weir.Stamp, error) {
	r, t, rr, err := p.keyResult(rule, tierName, key)
	if err != nil {
		return RuleResult{}, weir.Stamp{}, err
	}
	start := time.Now()
	q := [1]weir.Request{{Key: rr.Key, Limit: t.limit, N: hits}}
	var res [1]weir.Result
	err = p.guard.Do(ctx, q[:], res[:])
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
	err := p.guard.Do(ctx, reqs[:], out[:])
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
