package policy

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/protect"
)

// Middleware returns net/http middleware that applies the rules of p to
// every request, answering as httplimit's middleware does (the pipeline is
// in the package documentation):
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
//     hold their leases until the handler returns, even if it panics;
//   - last, the system section and the protect rules matching the request
//     (Policy.Protect) admit it or answer 503 with Retry-After and a
//     problem body, {"error": "overloaded", "protect": "api"} or
//     {"error": "circuit_open", "protect": "payments"}; an allow-listed
//     client passes through them too.
//
// The options are httplimit's. Legacy X-RateLimit-* headers follow the
// policy's headers.legacy unless httplimit.WithLegacyHeaders says
// otherwise. WithKey, KeyByIP, KeyByIPPrefix, WithClientIPHeader, WithName
// and WithShadow do not apply: the rules and the policy's trusted_proxies
// and client_ip_header say how to identify clients. Middleware panics if p
// is nil.
//
// Middleware was httplimit.FromPolicy: it lives here so that httplimit,
// for a single limit, does not depend on this package and its YAML.
func Middleware(p *Policy, opts ...httplimit.Option) func(http.Handler) http.Handler {
	if p == nil {
		panic("policy: Middleware with a nil Policy")
	}
	return MiddlewareFunc(func() *Policy { return p }, opts...)
}

// MiddlewareFunc is Middleware for a policy that changes: get is called
// once per request, so a reloading holder can swap rule sets under running
// middleware:
//
//	holder, err := policy.Watch(ctx, "weir.yaml", build, nil)
//	...
//	handler = policy.MiddlewareFunc(holder.Load)(handler)
//
// While get returns nil, requests pass unlimited, or get 503 under
// httplimit.WithErrorPolicy(httplimit.FailClosed). MiddlewareFunc was
// httplimit.FromPolicyFunc.
func MiddlewareFunc(get func() *Policy, opts ...httplimit.Option) func(http.Handler) http.Handler {
	if get == nil {
		panic("policy: MiddlewareFunc with a nil getter")
	}
	resp := httplimit.NewResponder(opts...)
	return func(next http.Handler) http.Handler {
		return &ruled{resp: resp, get: get, next: next}
	}
}

// errNoPolicy is the error of a 503 answered while MiddlewareFunc's getter
// has no policy.
var errNoPolicy = errors.New("policy: no policy loaded")

// ruled is Middleware's handler.
type ruled struct {
	resp *httplimit.Responder
	get  func() *Policy
	next http.Handler
}

func (m *ruled) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	resp := m.resp
	p := m.get()
	if p == nil {
		if resp.ErrorPolicy() == httplimit.FailClosed {
			resp.Reject(w, r, httplimit.Rejection{Status: http.StatusServiceUnavailable, Err: errNoPolicy})
			return
		}
		m.next.ServeHTTP(w, r)
		return
	}
	ctx, end := resp.StartTrace(r)
	var start time.Time
	observing := resp.Observing()
	if observing || end != nil {
		start = time.Now()
	}
	v := p.Check(ctx, r)
	if v.BadCost != nil {
		resp.Reject(w, r, httplimit.Rejection{Status: http.StatusBadRequest, Err: v.BadCost})
		return
	}
	// Concurrency leases go back when the handler returns or panics.
	defer v.Release(context.WithoutCancel(ctx))
	if observing || end != nil {
		ds := decisionsOf(r, &v, time.Since(start))
		if end != nil {
			end(ds)
		}
		for _, d := range ds {
			resp.Observe(d)
		}
	}

	switch {
	case v.AllowListed:
		m.serve(w, r, p, &v)
		return
	case v.Denied:
		rej := httplimit.Rejection{Status: http.StatusForbidden}
		if rr, ok := v.Limited(); ok && rr.Denied {
			rej.Rule = rr.Rule
		}
		resp.Reject(w, r, rej)
		return
	}

	var buf [4]httplimit.Status
	statuses, limiting := statusesOf(buf[:0], &v)
	resp.WriteHeaders(w.Header(), statuses, limiting, p.Config().Headers.Legacy)

	if !v.Allowed {
		rej := httplimit.Rejection{Status: http.StatusTooManyRequests, Statuses: slices.Clone(statuses)}
		rej.RetryAfter, _ = httplimit.RetryAfter(statuses)
		if rr, ok := v.Limited(); ok {
			rej.Rule, rej.Result = rr.Rule, rr.Result
			if rr.Err != nil {
				rej.Status, rej.Err = http.StatusServiceUnavailable, rr.Err
			}
		}
		resp.Reject(w, r, rej)
		return
	}

	var delay time.Duration
	for i := range v.Results {
		if rr := &v.Results[i]; !rr.Shadow && !rr.Skipped {
			delay = max(delay, rr.Result.Delay)
		}
	}
	if delay > 0 {
		if err := resp.Sleep(ctx, delay); err != nil {
			if v.Metered() {
				// Never served: what cost and count rules took goes back.
				if err := p.Finish(context.WithoutCancel(ctx), &v, Charges{Status: httplimit.StatusClientClosedRequest, Charged: true}); err != nil {
					p.log.Warn("weir: refunding a request that left while delayed failed", "err", err)
				}
			}
			w.WriteHeader(httplimit.StatusClientClosedRequest)
			return
		}
	}
	m.serve(w, r, p, &v)
}

// serve passes an admitted request through p's protect rules and system
// section to the handler: a request they refuse gets 503 with Retry-After
// and a problem body naming the rule; the others are served, and their
// outcome (a 5xx or a panic is a failure) and latency feed the adaptive
// limits and the breakers. A metered request (cost or count rules) is
// settled after the handler, or refunded when protection refuses it.
func (m *ruled) serve(w http.ResponseWriter, r *http.Request, p *Policy, v *Verdict) {
	a, rej := p.Protect(r)
	if rej != nil {
		if v.Metered() {
			// Never served: the estimate goes back, nothing is counted.
			if err := p.Finish(context.WithoutCancel(r.Context()), v, Charges{Status: http.StatusServiceUnavailable, Charged: true}); err != nil {
				p.log.Warn("weir: refunding a request that protection refused failed", "err", err)
			}
		}
		protect.WriteRejection(w, rej)
		return
	}
	var next http.Handler = m.next
	if v.Metered() {
		// A copy for the closure, so that only a metered request's
		// verdict goes to the heap (it shares the results and leases).
		mv := *v
		next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serveMetered(w, r, p, &mv) })
	}
	if a == nil {
		next.ServeHTTP(w, r)
		return
	}
	protect.Track(w, r, next, a.DoneWaited)
}

// serveMetered runs the handler of a request with a cost or count rule and
// settles them when it returns, or panics, even if the client went away.
func (m *ruled) serveMetered(w http.ResponseWriter, r *http.Request, p *Policy, v *Verdict) {
	rec := httplimit.NewStatusRecorder(w)
	r, meter := httplimit.WithMeter(r)
	defer func() {
		actual, charged := meter.Charged()
		status := rec.Status()
		if e := recover(); e != nil {
			defer panic(e)
			status = http.StatusInternalServerError
		}
		if err := p.Finish(context.WithoutCancel(r.Context()), v, Charges{Status: status, Actual: actual, Charged: charged}); err != nil {
			// The store failed: the estimate stays charged. The error names
			// rules and hashed keys, never identities.
			p.log.Warn("weir: settling a request's cost failed", "err", err)
		}
	}()
	m.next.ServeHTTP(rec, r)
}

// StatusesOf converts a policy verdict into the statuses its rate-limit
// headers report, with the index of the limiting one, for WriteHeaders:
// the service answers proxies' auth requests this way. Skipped and denied
// rules, and rules let through only because the store failed under
// on_error: allow, are left out. The limiting status is the verdict's
// Limiting, or when no enforced rule applied, httplimit.MostRestrictive
// of the shadow ones. StatusesOf was httplimit.StatusesOf.
func StatusesOf(v *Verdict) ([]httplimit.Status, int) {
	return statusesOf(make([]httplimit.Status, 0, len(v.Results)), v)
}

// statusesOf is StatusesOf appending to buf. The middleware passes a
// buffer on its stack.
func statusesOf(buf []httplimit.Status, v *Verdict) ([]httplimit.Status, int) {
	limiting := -1
	for i := range v.Results {
		rr := &v.Results[i]
		if rr.Skipped || rr.Denied || (rr.Err != nil && rr.Fallback == config.OnErrorAllow) {
			continue
		}
		if i == v.Limiting {
			limiting = len(buf)
		}
		buf = append(buf, httplimit.Status{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow})
	}
	if limiting < 0 {
		limiting = httplimit.MostRestrictive(buf)
	}
	return buf, limiting
}

// decisionsOf is the verdict as the observer and the tracer see it: one
// Observation per rule, or one for an allow- or deny-listed request.
func decisionsOf(r *http.Request, v *Verdict, latency time.Duration) []httplimit.Observation {
	if len(v.Results) == 0 && (v.AllowListed || v.Denied) {
		return []httplimit.Observation{{Request: r, Allowed: v.Allowed, AllowListed: v.AllowListed, DenyListed: v.Denied, Latency: latency}}
	}
	ds := make([]httplimit.Observation, 0, len(v.Results))
	for i := range v.Results {
		rr := &v.Results[i]
		if rr.Skipped {
			continue
		}
		ds = append(ds, httplimit.Observation{
			Request: r, Rule: rr.Rule, Tier: rr.Tier, Key: rr.Identity,
			Allowed: rr.Result.Allowed && !rr.Denied, Shadow: rr.Shadow,
			Result: rr.Result, Latency: latency, Err: rr.Err, Fallback: rr.Fallback,
		})
	}
	return ds
}
