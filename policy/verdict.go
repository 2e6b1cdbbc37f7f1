package policy

import (
	"context"
	"errors"

	"github.com/weir-dev/weir"
)

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
	// Stamp dates an admitted take of a KeyRequest with Reserve, for its
	// Settle, and
	// the take of a rule with a cost or a count when the store dates its
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
