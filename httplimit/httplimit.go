// Package httplimit puts weir rate limits in front of net/http handlers.
//
// The middleware has the standard shape, func(http.Handler) http.Handler, so
// it works with net/http, chi, gorilla/mux and anything else that takes it.
// It comes in two forms:
//
//   - New applies one Limit to every request, keyed by the client's IP
//     address or by any key function;
//   - policy.Middleware applies a whole rule set loaded from weir.yaml:
//     several rules per request, tiers, shadow rules, the penalty box,
//     allow and deny lists. It takes this package's Options and answers
//     through a Responder, as New does; it lives in package policy so that
//     this one depends on neither policy nor YAML.
//
// Every response that a limit applied to carries the rate-limit headers of
// draft-ietf-httpapi-ratelimit-headers-11, rendered by one HeaderFormatter:
//
//	RateLimit-Policy: "login";q=5;w=900
//	RateLimit: "login";r=3;t=412
//
// A rejected request gets 429 Too Many Requests, a Retry-After header in
// whole seconds rounded up, and an RFC 9457 problem body
// (application/problem+json) whose blocked_until field lets a front end
// show a countdown; a browser that asks for text/html gets a short page
// instead. A deny-listed client gets 403. OnRejected replaces the response.
//
// Three algorithms change what happens around the handler:
//
//   - a shaping leaky bucket (a Limit with MaxDelay) holds an admitted
//     request for Result.Delay before passing it on; a client that goes away
//     meanwhile stops the wait and the handler is never called;
//   - the concurrency algorithm acquires a lease before the handler and
//     releases it when the handler returns, even if it panics;
//   - every other algorithm just admits or rejects.
//
// When the store fails, New lets the request through by default (fail
// open) and reports the error to the observer; WithErrorPolicy(FailClosed)
// answers 503 instead. Policies choose per rule in weir.yaml (on_error).
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/internal/waitctx"
)

// DefaultName is the rule name New uses in keys and headers unless WithName
// gives another.
const DefaultName = "default"

// StatusClientClosedRequest is the status recorded when a client goes away
// while its request is being shaped: nginx's 499. The client never sees it;
// it is there for access logs and metrics.
const StatusClientClosedRequest = 499

// ErrorPolicy says what to do with a request when the store fails.
type ErrorPolicy int

const (
	// FailOpen lets the request through unlimited. It is the default: an
	// outage of the limiter's store should not become an outage of the
	// service.
	FailOpen ErrorPolicy = iota
	// FailClosed answers 503 Service Unavailable.
	FailClosed
)

// Observation is what the middleware reports to an observer for each rule it
// applied to a request (see WithObserver).
type Observation struct {
	// Request is the request decided.
	Request *http.Request
	// Rule is the rule's name; empty for allow- and deny-list decisions.
	Rule string
	// Tier is the tier of the rule applied (policy.Middleware only).
	Tier string
	// Key is the rule's identity for the request, such as the client IP.
	Key string
	// Allowed reports whether this rule let the request through. A shadow
	// rule reports what it would have decided.
	Allowed bool
	// Shadow reports a rule that counts and reports but never rejects.
	Shadow bool
	// AllowListed and DenyListed report requests decided by the policy's
	// allow and deny lists, without any rule.
	AllowListed, DenyListed bool
	// Result is the store's answer. When Err is set it is zero for New, and
	// the on_error fallback's answer for policy.Middleware.
	Result weir.Result
	// Latency is how long the decision took, store round trip included.
	Latency time.Duration
	// Err is the store or key error, if any; the error policy then decided.
	Err error
	// Fallback names the on_error fallback that decided while the store
	// failed (policy.Middleware only): "allow", "deny" or "local".
	Fallback string
}

// Option configures the middleware.
type Option func(*config)

type config struct {
	key         func(*http.Request) (string, error)
	byIP        bool    // key is the client IP: ServeHTTP builds it without the extra string
	ip          ipKeyer // how KeyByIP finds and groups the client IP
	err         error   // a bad option, which New reports
	name        string
	formatter   HeaderFormatter
	legacy      *bool
	onRejected  func(http.ResponseWriter, *http.Request, Rejection)
	observer    func(Observation)
	tracer      Tracer
	errorPolicy ErrorPolicy
	sleep       func(context.Context, time.Duration) error
	shadow      bool
	cost        func(*http.Request) (int64, error) // WithCost; nil: 1
}

// WithKey makes fn identify the client of a request; New limits each key
// separately. The default is the client IP from RemoteAddr (see KeyByIP).
// When fn returns an error the request is answered 400 Bad Request and the
// error goes to the observer, unless the error is ErrNoLimit, in which case
// the request passes unlimited. policy.Middleware ignores it: rules name
// their identities.
func WithKey(fn func(*http.Request) (string, error)) Option {
	return func(c *config) { c.key, c.byIP = fn, false }
}

// KeyByIP keys requests by client IP address, as clientip.From finds
// it, an IPv6 client by its /64 (clientip.DefaultIPv6Bits) and an IPv4 client
// whole; KeyByIPPrefix sets other prefixes. The address is the peer's
// (RemoteAddr) unless the peer is one of the trusted proxies; then the
// forwarding headers are read as WithClientIPHeader says, by default
// X-Real-IP when the proxy sent one holding an untrusted address, else
// X-Forwarded-For read right to left, skipping trusted addresses, the
// first untrusted one being the client. Forwarding headers from an
// untrusted peer are ignored, so a client cannot pick its own key. Without
// trusted prefixes this is the default key.
func KeyByIP(trusted ...netip.Prefix) Option {
	return KeyByIPPrefix(32, clientip.DefaultIPv6Bits, trusted...)
}

// KeyByIPPrefix is KeyByIP with clients grouped by prefix: IPv4 clients by
// their /v4Bits (1 to 32; 32 keys each address apart) and IPv6 clients by
// their /v6Bits (1 to 128; 128 keys each address apart). The key is then
// the prefix, such as "198.51.100.0/24" or "2001:db8:1:2::/64". New panics
// on lengths out of range. KeyByIPPrefix(32, 64) is KeyByIP.
func KeyByIPPrefix(v4Bits, v6Bits int, trusted ...netip.Prefix) Option {
	trusted = append([]netip.Prefix(nil), trusted...)
	return func(c *config) {
		if v4Bits < 1 || v4Bits > 32 || v6Bits < 1 || v6Bits > 128 {
			c.err = fmt.Errorf("KeyByIPPrefix(%d, %d): the IPv4 prefix length must be 1 to 32 and the IPv6 one 1 to 128", v4Bits, v6Bits)
			return
		}
		c.byIP = true
		c.ip.trusted, c.ip.bits4, c.ip.bits6 = trusted, v4Bits, v6Bits
		c.key = func(r *http.Request) (string, error) { return c.ip.key(r), nil }
	}
}

// WithClientIPHeader names the header that carries the client address
// when the peer is a trusted proxy (see KeyByIP): "auto" (the default),
// "X-Forwarded-For" (walked from the right, for chains of proxies that
// each append), "X-Real-IP", or any header your proxy sets, such as
// CF-Connecting-IP; as client_ip_header in weir.yaml. New panics on a name
// that is not a header name. policy.Middleware follows the policy's
// setting.
func WithClientIPHeader(name string) Option {
	return func(c *config) {
		h, ok := clientip.CanonicalHeader(name)
		if !ok {
			c.err = fmt.Errorf("WithClientIPHeader(%q): not a header name", name)
			return
		}
		c.ip.header = h
	}
}

// WithName names the rule New applies, in store keys, headers, rejection
// bodies and decisions. The default is DefaultName. Two middlewares sharing
// a store need different names unless they are meant to share counters.
func WithName(rule string) Option { return func(c *config) { c.name = rule } }

// WithLegacyHeaders switches the X-RateLimit-Limit, X-RateLimit-Remaining
// and X-RateLimit-Reset headers on or off. They are off by default; for
// policy.Middleware the default is the policy's headers.legacy setting.
func WithLegacyHeaders(on bool) Option { return func(c *config) { c.legacy = &on } }

// WithHeaderFormatter replaces the draft headers with f's. It overrides
// WithLegacyHeaders.
func WithHeaderFormatter(f HeaderFormatter) Option { return func(c *config) { c.formatter = f } }

// OnRejected makes fn answer rejected requests instead of WriteRejection.
// The rate-limit headers and Retry-After are already set on w when fn runs.
func OnRejected(fn func(w http.ResponseWriter, r *http.Request, rej Rejection)) Option {
	return func(c *config) { c.onRejected = fn }
}

// WithObserver makes fn see every decision: one call per rule applied to a
// request (rule, key, allowed, shadow, latency, error), for metrics and
// logs. fn runs on the request's goroutine before the handler, so it must
// be quick.
func WithObserver(fn func(Observation)) Option { return func(c *config) { c.observer = fn } }

// A Tracer traces the rate-limit decisions of each request. Package
// weirotel implements one with OpenTelemetry (a span per request's check,
// with W3C trace context from its headers); httplimit itself depends on no
// tracing library.
//
// StartCheck runs before a request's first decision. Its context is the one
// the decisions run under, so that the store calls of a traced store
// (weirotel.Store) become children of the check; end is called once, after
// the last decision, with the request's decisions in order (none when the
// request was not limited at all). The handler gets the original request.
type Tracer interface {
	StartCheck(r *http.Request) (ctx context.Context, end func([]Observation))
}

// WithTracer traces every request's decisions with t.
func WithTracer(t Tracer) Option { return func(c *config) { c.tracer = t } }

// WithErrorPolicy says what New does with a request when the store fails,
// and what policy.MiddlewareFunc does while its getter returns nil. The
// default is FailOpen. Policies choose per rule in weir.yaml instead.
func WithErrorPolicy(p ErrorPolicy) Option { return func(c *config) { c.errorPolicy = p } }

// WithSleep replaces the timer that holds shaped requests: sleep must wait
// for d or until ctx is done, and return ctx's error in the latter case.
// Tests use it to observe delays without waiting.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *config) { c.sleep = sleep }
}

// WithCost makes New charge each request what fn returns (an estimate,
// from 0 to the most the limit can admit at once) instead of 1; the handler
// reports the real cost with Charge, and the difference is settled when it
// returns (see Limiter.Debit: a request that used more than remained puts
// its key into debt). An error from fn answers 400; wrap ErrBadCost to
// show its message to the client. New panics if the limit's algorithm has
// no debt (concurrency, a shaping leaky bucket).
func WithCost(fn func(r *http.Request) (int64, error)) Option {
	return func(c *config) { c.cost = fn }
}

// WithShadow makes New count and report without ever rejecting: the
// headers and the observer say what would have happened. It lets a new
// limit be tried on live traffic. Policies set shadow per rule.
func WithShadow(on bool) Option { return func(c *config) { c.shadow = on } }

func newConfig(opts []Option) *config {
	c := &config{
		byIP:  true,
		ip:    defaultIPKeyer(),
		name:  DefaultName,
		sleep: waitctx.Sleep,
	}
	c.key = func(r *http.Request) (string, error) { return c.ip.key(r), nil }
	for _, o := range opts {
		o(c)
	}
	return c
}

// writeHeaders renders statuses with the formatter in force when the
// policy's own legacy setting is policyLegacy. The draft formatter is
// called directly, so that statuses can stay on the caller's stack; a
// custom formatter gets a copy it may keep.
func (c *config) writeHeaders(h http.Header, statuses []Status, limiting int, policyLegacy bool) {
	if c.formatter != nil {
		c.formatter.WriteHeaders(h, slices.Clone(statuses), limiting)
		return
	}
	if c.legacy != nil {
		policyLegacy = *c.legacy
	}
	DraftHeaders{Legacy: policyLegacy}.WriteHeaders(h, statuses, limiting)
}

// New returns middleware that applies l to every request, each key (by
// default each client IP) separately, with the limiter lim. A concurrency
// limit holds a lease for the duration of the handler; a shaping leaky
// bucket delays requests; every other algorithm admits or rejects.
//
// New panics if lim is nil or l is invalid, as a bad route pattern does in
// http.Handle: both are programming errors found at start-up.
func New(lim *weir.Limiter, l weir.Limit, opts ...Option) func(http.Handler) http.Handler {
	if lim == nil {
		panic("httplimit: New with a nil Limiter")
	}
	if err := l.Validate(); err != nil {
		panic("httplimit: " + err.Error())
	}
	c := newConfig(opts)
	if c.err != nil {
		panic("httplimit: " + c.err.Error())
	}
	if c.cost != nil {
		if p, _ := l.Compile(); !p.Debts() {
			panic("httplimit: WithCost settles with debits and refunds, which " + string(l.Algorithm) + " does not support")
		}
	}
	return func(next http.Handler) http.Handler {
		return &single{c: c, lim: lim, limit: l, next: next}
	}
}

// single is New's handler.
type single struct {
	c     *config
	lim   *weir.Limiter
	limit weir.Limit
	next  http.Handler
}

func (s *single) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := s.c
	if c.tracer == nil {
		s.serve(w, r, r.Context(), nil)
		return
	}
	ctx, end := c.tracer.StartCheck(r)
	s.serve(w, r, ctx, end)
}

// serve is ServeHTTP with the context the decision runs under and, when
// tracing, the function that ends the check's trace.
func (s *single) serve(w http.ResponseWriter, r *http.Request, ctx context.Context, end func([]Observation)) {
	c := s.c
	var id, key string
	var err error
	if c.byIP {
		id, key = c.ip.identity(r, c.name)
	} else {
		id, err = c.key(r)
		if err != nil {
			if errors.Is(err, ErrNoLimit) {
				if end != nil {
					end(nil)
				}
				s.next.ServeHTTP(w, r)
				return
			}
			d := Observation{Request: r, Rule: c.name, Err: err}
			if end != nil {
				end([]Observation{d})
			}
			c.observe(d)
			c.reject(w, r, Rejection{Status: http.StatusBadRequest, Rule: c.name, Err: err})
			return
		}
		key = weir.Key(c.name, id)
	}
	var start time.Time
	if c.observer != nil || end != nil {
		start = time.Now()
	}
	var (
		res   weir.Result
		lease *weir.Lease
	)
	n := int64(1)
	if c.cost != nil {
		if n, err = c.cost(r); err != nil {
			c.observe(Observation{Request: r, Rule: c.name, Key: id, Err: err})
			c.reject(w, r, Rejection{Status: http.StatusBadRequest, Rule: c.name, Err: err})
			return
		}
	}
	var rv *weir.Reservation
	switch {
	case s.limit.Algorithm == weir.Concurrency:
		lease, res, err = s.lim.Acquire(ctx, key, s.limit)
	case c.cost != nil:
		// A reservation, so that the settlement refunds with the take's
		// time (weir.Reservation.Stamp); a limit without debt is taken as
		// AllowN, and its settlement fails as before.
		rv, res, err = s.lim.Reserve(ctx, key, s.limit, n)
		if errors.Is(err, weir.ErrUnsupported) {
			res, err = s.lim.AllowN(ctx, key, s.limit, n)
		}
	default:
		res, err = s.lim.AllowN(ctx, key, s.limit, n)
	}
	d := Observation{Request: r, Rule: c.name, Key: id, Allowed: err == nil && res.Allowed, Shadow: c.shadow, Result: res, Err: err}
	if c.observer != nil || end != nil {
		d.Latency = time.Since(start)
	}
	if end != nil {
		end([]Observation{d})
	}
	if c.observer != nil {
		c.observer(d)
	}
	if err != nil {
		if c.errorPolicy == FailClosed {
			c.reject(w, r, Rejection{Status: http.StatusServiceUnavailable, Rule: c.name, Err: err})
			return
		}
		s.next.ServeHTTP(w, r)
		return
	}
	if lease != nil {
		// Release even when the handler panics; the panic goes on up.
		defer lease.Release(context.WithoutCancel(ctx))
	}
	st := [1]Status{{Rule: c.name, Limit: s.limit, Result: res, Shadow: c.shadow}}
	c.writeHeaders(w.Header(), st[:], 0, false)
	if !res.Allowed && !c.shadow {
		c.reject(w, r, Rejection{Status: http.StatusTooManyRequests, Rule: c.name, Result: res, RetryAfter: res.RetryAfter, Statuses: slices.Clone(st[:])})
		return
	}
	if res.Delay > 0 && !c.shadow {
		if err := c.sleep(ctx, res.Delay); err != nil {
			w.WriteHeader(StatusClientClosedRequest)
			return
		}
	}
	if c.cost != nil && res.Allowed {
		s.serveMetered(w, r, key, n, rv)
		return
	}
	s.next.ServeHTTP(w, r)
}

// serveMetered runs the handler of a request charged n up front (rv, its
// reservation, when the store took one) and, when it returns or panics,
// settles the real cost it charged (see Charge), even if the client went
// away.
func (s *single) serveMetered(w http.ResponseWriter, r *http.Request, key string, n int64, rv *weir.Reservation) {
	r, meter := WithMeter(r)
	defer func() {
		if actual, charged := meter.Charged(); charged {
			ctx := context.WithoutCancel(r.Context())
			var err error
			if rv != nil {
				_, err = rv.Settle(ctx, actual)
			} else {
				_, err = s.lim.Settle(ctx, key, s.limit, n, actual)
			}
			if err != nil {
				s.c.observe(Observation{Request: r, Rule: s.c.name, Err: err})
			}
		}
	}()
	s.next.ServeHTTP(w, r)
}

func (c *config) observe(d Observation) {
	if c.observer != nil {
		c.observer(d)
	}
}

func (c *config) reject(w http.ResponseWriter, r *http.Request, rej Rejection) {
	if c.onRejected != nil {
		c.onRejected(w, r, rej)
		return
	}
	WriteRejection(w, r, rej)
}
