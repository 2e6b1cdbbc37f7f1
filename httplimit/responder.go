package httplimit

import (
	"context"
	"net/http"
	"time"
)

// Responder answers requests as a set of Options says: it writes the
// rate-limit headers and the rejections, reports decisions to the
// observer, and holds shaped requests. It is the part of the middleware
// that does not depend on how a request was decided, so that middleware
// deciding otherwise answers exactly as New's does: policy.Middleware,
// which applies a weir.yaml rule set, is built on one, and so can yours
// be. The options that say how New keys and names requests (WithKey,
// KeyByIP, KeyByIPPrefix, WithClientIPHeader, WithName, WithShadow) have
// no effect on a Responder.
type Responder struct{ c *config }

// NewResponder returns the Responder that opts configure.
func NewResponder(opts ...Option) *Responder { return &Responder{c: newConfig(opts)} }

// WriteHeaders sets the rate-limit headers for statuses on h, reporting
// statuses[limiting] in RateLimit (see MostRestrictive; -1 for none). The
// formatter is WithHeaderFormatter's, else DraftHeaders, with the legacy
// X-RateLimit-* headers as WithLegacyHeaders says or, without it, as
// legacy says (a policy's headers.legacy). The draft formatter reads
// statuses in place, so they may live on the caller's stack; a custom one
// gets a copy it may keep.
func (r *Responder) WriteHeaders(h http.Header, statuses []Status, limiting int, legacy bool) {
	r.c.writeHeaders(h, statuses, limiting, legacy)
}

// Reject answers a rejected request: with OnRejected's function, or else
// WriteRejection. The rate-limit headers should be on w already.
func (r *Responder) Reject(w http.ResponseWriter, req *http.Request, rej Rejection) {
	r.c.reject(w, req, rej)
}

// Observing reports whether WithObserver gave an observer, so that a
// caller need not time its decisions when nobody looks.
func (r *Responder) Observing() bool { return r.c.observer != nil }

// Observe reports d to WithObserver's observer, if any.
func (r *Responder) Observe(d Observation) { r.c.observe(d) }

// StartTrace starts the trace of a request's check with WithTracer's
// Tracer: the decisions run under ctx, and end gets them afterwards. It
// returns nil for end (and the request's context) without a Tracer.
func (r *Responder) StartTrace(req *http.Request) (ctx context.Context, end func([]Observation)) {
	if r.c.tracer == nil {
		return req.Context(), nil
	}
	return r.c.tracer.StartCheck(req)
}

// Sleep holds a shaped request for d, or until ctx is done, when it
// returns ctx's error (WithSleep replaces the timer). The middleware then
// answers StatusClientClosedRequest without calling the handler.
func (r *Responder) Sleep(ctx context.Context, d time.Duration) error { return r.c.sleep(ctx, d) }

// ErrorPolicy returns what WithErrorPolicy chose: FailOpen by default.
func (r *Responder) ErrorPolicy() ErrorPolicy { return r.c.errorPolicy }
