package guard

import (
	"context"
	"fmt"

	"github.com/weir-dev/weir"
)

// The fallback modes, as weir.yaml's on_error names them.
const (
	Allow = "allow" // admit the request (fail open)
	Deny  = "deny"  // reject the request (fail closed)
	Local = "local" // decide with the in-process store under LocalLimit
)

// LocalLimit is the limit that on_error: local enforces in each of
// instances instances for l: its rate, burst and delay_after divided among
// them, rounded up, at least 1. With one instance, or when the divided
// limit would be invalid, it is l.
func LocalLimit(l weir.Limit, instances int) weir.Limit {
	if instances <= 1 {
		return l
	}
	n := int64(instances)
	div := func(v int64) int64 { return max((v+n-1)/n, 1) }
	s := l
	s.Rate = div(l.Rate)
	if l.Burst > 0 {
		s.Burst = div(l.Burst)
	}
	if l.DelayAfter > 0 {
		s.DelayAfter = div(l.DelayAfter)
	}
	if s.Validate() != nil {
		return l
	}
	return s
}

// Fallback decides reqs by the on_error policy mode while the store
// cannot: it is the one fallback of every path, policy.Check and
// CheckKey, and the server's Envoy service. It fills res, as long as
// reqs, and answers the same way on every path:
//
//   - Allow ("allow") admits every request: Allowed, Granted its N, Limit and
//     Remaining the limit's quota (Rate, or Burst for the buckets).
//   - Deny ("deny") refuses every request: Limit the quota, Remaining 0,
//     RetryAfter and ResetAfter the rest of the breaker's cooldown, at
//     least a second.
//   - Local ("local", or "") decides with the guard's in-process store under
//     LocalLimit(limit, instances), all the requests together, all or
//     nothing, as MultiStore.TakeAll does; pass one request at a time to
//     decide them independently. A named concurrency Lease is held in that
//     store: release it with Local().Release.
//
// Should the local store refuse the requests (a cost above what the
// instance's share can ever admit), every request is refused as "deny"
// refuses, with Limit the local quota: local never admits what it cannot
// count. Fallback fails only for an unknown mode.
func (g *Guard) Fallback(ctx context.Context, mode string, reqs []weir.Request, res []weir.Result, instances int) error {
	if len(res) < len(reqs) {
		return fmt.Errorf("guard: fallback: %d results for %d requests", len(res), len(reqs))
	}
	switch mode {
	case Allow, Deny, Local, "":
		g.fallbacks.Add(uint64(len(reqs)))
	}
	switch mode {
	case Allow:
		for i := range reqs {
			q := quotaOf(reqs[i].Limit)
			res[i] = weir.Result{Allowed: true, Limit: q, Remaining: q, Granted: max(reqs[i].N, 0)}
		}
		return nil
	case Deny:
		hint := g.retryHint()
		for i := range reqs {
			res[i] = weir.Result{Limit: quotaOf(reqs[i].Limit), RetryAfter: hint, ResetAfter: hint}
		}
		return nil
	case Local, "":
	default:
		return fmt.Errorf("guard: unknown on_error mode %q (want allow, deny or local)", mode)
	}
	// The requests under their local limits: on the stack for a few.
	var buf [8]weir.Request
	var local []weir.Request
	if len(reqs) <= len(buf) {
		local = buf[:len(reqs)]
	} else {
		local = make([]weir.Request, len(reqs))
	}
	for i := range reqs {
		local[i] = reqs[i]
		local[i].Limit = LocalLimit(reqs[i].Limit, instances)
	}
	err := g.local.Do(ctx, local, res[:len(reqs)])
	if err != nil {
		hint := g.retryHint()
		for i := range local {
			res[i] = weir.Result{Limit: quotaOf(local[i].Limit), RetryAfter: hint, ResetAfter: hint}
		}
	}
	return nil
}

// quotaOf is what Result.Limit reports for l: Rate, or Burst for the
// buckets; Rate if l is invalid.
func quotaOf(l weir.Limit) int64 {
	p, err := l.Compile()
	if err != nil {
		return l.Rate
	}
	return p.Cap
}
