package httplimit

import (
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/weir-dev/weir/policy"
)

// FromPolicy returns middleware that applies the rules of p to every
// request (see package policy for the pipeline):
//
//   - a deny-listed client, or a request without the identity of a rule
//     whose on_missing is deny, gets 403 and no rule is counted;
//   - an allow-listed client passes with no rate-limit headers;
//   - every rule matching the request applies, all or nothing. The
//     RateLimit-Policy header lists them all, shadow rules included, and
//     RateLimit reports the most restrictive enforced one (the verdict's
//     Limiting), or the most restrictive shadow rule when no enforced rule
//     matched;
//   - if an enforced rule rejects, the answer is 429, or 503 when it was
//     rejected because the store failed and its on_error is deny; shadow
//     rules never reject;
//   - a shaping leaky-bucket rule delays the request; concurrency rules
//     hold their leases until the handler returns, even if it panics.
//
// Legacy X-RateLimit-* headers follow the policy's headers.legacy unless
// WithLegacyHeaders says otherwise. WithKey, KeyByIP, WithName and
// WithShadow do not apply: the rules say how to identify clients. FromPolicy
// panics if p is nil.
func FromPolicy(p *policy.Policy, opts ...Option) func(http.Handler) http.Handler {
	if p == nil {
		panic("httplimit: FromPolicy with a nil Policy")
	}
	return FromPolicyFunc(func() *policy.Policy { return p }, opts...)
}

// FromPolicyFunc is FromPolicy for a policy that changes: get is called
// once per request, so a reloading holder can swap rule sets under running
// middleware:
//
//	holder, err := policy.Watch(ctx, "weir.yaml", build, nil)
//	...
//	handler = httplimit.FromPolicyFunc(holder.Load)(handler)
//
// While get returns nil, requests pass unlimited, or get 503 under
// WithErrorPolicy(FailClosed).
func FromPolicyFunc(get func() *policy.Policy, opts ...Option) func(http.Handler) http.Handler {
	if get == nil {
		panic("httplimit: FromPolicyFunc with a nil getter")
	}
	c := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return &ruled{c: c, get: get, next: next}
	}
}

// ruled is FromPolicy's handler.
type ruled struct {
	c    *config
	get  func() *policy.Policy
	next http.Handler
}

func (m *ruled) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := m.c
	p := m.get()
	if p == nil {
		if c.errorPolicy == FailClosed {
			c.reject(w, r, Rejection{Status: http.StatusServiceUnavailable, Err: errNoPolicy})
			return
		}
		m.next.ServeHTTP(w, r)
		return
	}
	ctx := r.Context()
	var start time.Time
	if c.observer != nil {
		start = time.Now()
	}
	v := p.Check(ctx, r)
	// Concurrency leases go back when the handler returns or panics.
	defer v.Release(context.WithoutCancel(ctx))
	if c.observer != nil {
		m.observe(r, &v, time.Since(start))
	}

	switch {
	case v.AllowListed:
		m.next.ServeHTTP(w, r)
		return
	case v.Denied:
		rej := Rejection{Status: http.StatusForbidden}
		if rr, ok := v.Limited(); ok && rr.Denied {
			rej.Rule = rr.Rule
		}
		c.reject(w, r, rej)
		return
	}

	var buf [4]Status
	statuses, limiting := statusesOf(buf[:0], &v)
	c.writeHeaders(w.Header(), statuses, limiting, p.Config().Headers.Legacy)

	if !v.Allowed {
		rej := Rejection{Status: http.StatusTooManyRequests, Statuses: slices.Clone(statuses)}
		rej.RetryAfter, _ = RetryAfter(statuses)
		if rr, ok := v.Limited(); ok {
			rej.Rule, rej.Result = rr.Rule, rr.Result
			if rr.Err != nil {
				rej.Status, rej.Err = http.StatusServiceUnavailable, rr.Err
			}
		}
		c.reject(w, r, rej)
		return
	}

	var delay time.Duration
	for i := range v.Results {
		if rr := &v.Results[i]; !rr.Shadow && !rr.Skipped {
			delay = max(delay, rr.Result.Delay)
		}
	}
	if delay > 0 {
		if err := c.sleep(ctx, delay); err != nil {
			w.WriteHeader(StatusClientClosedRequest)
			return
		}
	}
	m.next.ServeHTTP(w, r)
}

// StatusesOf converts a policy verdict into the statuses its rate-limit
// headers report, with the index of the limiting one, for WriteHeaders:
// the service answers proxies' auth requests this way. Skipped and denied
// rules, and rules let through only because the store failed under
// on_error: allow, are left out. The limiting status is the verdict's
// Limiting, or when no enforced rule applied, MostRestrictive of the
// shadow ones.
func StatusesOf(v *policy.Verdict) ([]Status, int) {
	return statusesOf(make([]Status, 0, len(v.Results)), v)
}

// statusesOf is StatusesOf appending to buf. The middleware passes a
// buffer on its stack.
func statusesOf(buf []Status, v *policy.Verdict) ([]Status, int) {
	limiting := -1
	for i := range v.Results {
		rr := &v.Results[i]
		if rr.Skipped || rr.Denied || (rr.Err != nil && rr.Fallback == policy.OnErrorAllow) {
			continue
		}
		if i == v.Limiting {
			limiting = len(buf)
		}
		buf = append(buf, Status{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow})
	}
	if limiting < 0 {
		limiting = MostRestrictive(buf)
	}
	return buf, limiting
}

// observe reports the verdict to the observer: one Decision per rule, or
// one for an allow- or deny-listed request.
func (m *ruled) observe(r *http.Request, v *policy.Verdict, latency time.Duration) {
	obs := m.c.observer
	if len(v.Results) == 0 && (v.AllowListed || v.Denied) {
		obs(Decision{Request: r, Allowed: v.Allowed, AllowListed: v.AllowListed, DenyListed: v.Denied, Latency: latency})
		return
	}
	for i := range v.Results {
		rr := &v.Results[i]
		if rr.Skipped {
			continue
		}
		obs(Decision{
			Request: r, Rule: rr.Rule, Tier: rr.Tier, Key: rr.Identity,
			Allowed: rr.Result.Allowed && !rr.Denied, Shadow: rr.Shadow,
			Result: rr.Result, Latency: latency, Err: rr.Err,
		})
	}
}
