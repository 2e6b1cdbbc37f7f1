package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/internal/keys"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/localbudget"
)

// KeyRequest is a decision for an identity a caller names rather than
// an HTTP request: the POST /v1/check and reservation APIs.
type KeyRequest struct {
	// Rule is the rule's name; Tier one of its tiers ("", or a tier the
	// rule lacks, is the default tier).
	Rule, Tier string
	// Key is what RuleResult.Identity holds, such as a client IP or an
	// API key; for Settle, the store key of the take settled (its
	// RuleResult.Key).
	Key string
	// N is the number of events (0 peeks); for Settle, the real cost.
	N int64
	// Mode is weir.ModeTake (the zero value), weir.ModeDebit, which
	// always consumes N (the key may go into debt), or weir.ModeRefund,
	// which gives N back (see weir.Limiter.Debit and Refund).
	Mode weir.Mode
	// Reserve makes a take the start of a reservation: when the store
	// dates its takes, an admitted take comes back with its
	// RuleResult.Stamp, for Settle. A rule with a lease is then taken
	// from the store directly, not from this instance's lease, so that
	// its take is dated too.
	Reserve bool
	// Settle settles a reservation: the take of Stamp.Estimate events
	// that a Reserve made, for the store key Key, now that the real cost
	// N is known. See Policy.CheckKey.
	Settle bool
	// Stamp is the reservation Settle settles (its RuleResult.Stamp).
	Stamp weir.Stamp
}

// CheckKey decides kr without an HTTP request. An unknown rule gives an
// error wrapping ErrUnknownRule; an empty key, or a cost outside
// 0..the limit's capacity, give an error too, and so does a mode the
// rule's algorithm cannot take (wrapping weir.ErrUnsupported, naming the
// mode, the rule and the algorithm; nothing changes). Store failures are
// not errors: the rule's on_error decides (local: a debit or refund goes
// to the local store), and the RuleResult says so. The allow and deny
// lists do not apply. Under the concurrency algorithm an admitted take
// holds an anonymous slot until the period ends: there is no lease to
// release.
//
// A settlement debits N − Stamp.Estimate when more was used, refunds
// Stamp.Estimate − N when less was, and peeks when they are equal. The
// refund is dated by the Stamp when its At is set: only what the limit
// cannot have recovered since the take comes back
// (weir.Limiter.SettleStamped). The store key, unlike the identity it was
// made from, is bounded (weir.Key hashes a long identity), so a caller
// keeping open reservations keeps it rather than the identity. A key
// that is not one of the rule's is an error, and so is a real cost
// outside 0..algorithm.MaxDebt.
func (p *Policy) CheckKey(ctx context.Context, kr KeyRequest) (RuleResult, error) {
	switch {
	case kr.Settle:
		return p.settleKey(ctx, kr.Rule, kr.Tier, kr.Key, kr.Stamp, kr.N)
	case kr.Mode != weir.ModeTake:
		return p.checkKeyDebt(ctx, kr.Rule, kr.Tier, kr.Key, weir.Request{N: kr.N, Mode: kr.Mode})
	case kr.Reserve:
		rr, st, err := p.checkKeyStamped(ctx, kr.Rule, kr.Tier, kr.Key, kr.N)
		rr.Stamp = st
		return rr, err
	}
	return p.checkKeyTier(ctx, kr.Rule, kr.Tier, kr.Key, kr.N)
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

// checkKeyTier decides hits events for key under the named rule's tier
// (KeyRequest's zero Mode).
func (p *Policy) checkKeyTier(ctx context.Context, rule, tierName, key string, hits int64) (RuleResult, error) {
	r, t, rr, err := p.keyResult(rule, tierName, key)
	if err != nil {
		return RuleResult{}, err
	}
	start := time.Now()
	var res weir.Result
	if r.lease > 0 {
		res, err = p.leases.Take(ctx, p.store, rr.Key, t.limit, hits, localbudget.Size(r.lease, t.limit, p.Instances()))
	} else {
		res, err = p.store.Take(ctx, rr.Key, t.limit, hits)
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
// CheckKey and Reset apply it themselves; the admin API uses it to
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
	storeKeys := []string{weir.Key(r.name, key)}
	// "~" and a hash is how lists show an identity too long to keep
	// (keys.ShortIdentity): clear the state of the identity it stands for.
	if keys.IsHashedIdentity(key) {
		storeKeys = append(storeKeys, keys.KeyOfShort(r.name, key))
	}
	// "ip:ADDR" is how a result reports an identity counted by
	// on_missing: use_ip, whose store key differs from a literal value's
	// (so that no header value can reach it). Clear that state too; at
	// worst this also resets a literal identity spelled the same.
	if addr, ok := strings.CutPrefix(key, "ip:"); ok && r.onMissing == config.OnMissingUseIP {
		if id, ok, err := canonicalIP(addr, 32, clientip.DefaultIPv6Bits); ok && err == nil {
			storeKeys = append(storeKeys, weir.Key(r.name, "", id))
		}
	}
	var errs []error
	for _, sk := range storeKeys {
		for _, t := range r.tiers {
			p.leases.Forget(sk, t.limit)
			if err := weir.NewLimiter(p.store).Reset(ctx, sk, t.limit); err != nil {
				errs = append(errs, err)
			}
			// Again after the reset: a lease taken from the old state
			// between the first Forget and the reset must not be spent.
			p.leases.Forget(sk, t.limit)
		}
	}
	return errors.Join(errs...)
}
