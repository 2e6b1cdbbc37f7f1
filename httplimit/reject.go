package httplimit

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/protect"
)

// ErrNoLimit, returned by a WithKey function, lets the request pass
// without any limit: for health checks, say, or internal callers.
var ErrNoLimit = errors.New("httplimit: request not limited")

// Rejection describes a request that the middleware turns away. OnRejected
// receives it; WriteRejection renders it.
type Rejection struct {
	// Status is the HTTP status to answer: 429 when a rule rejects, 403
	// when the client is deny-listed, 503 when the store failed and the
	// error policy is FailClosed, 400 when no key could be derived.
	Status int
	// Rule names the rule that rejected; the most restrictive one when
	// several did. Empty for deny-listed clients.
	Rule string
	// Result is that rule's result.
	Result weir.Result
	// RetryAfter is when every rejecting rule would admit the request
	// again; 0 when unknown.
	RetryAfter time.Duration
	// Statuses are all the rules that applied, for custom responses.
	Statuses []Status
	// Err is the store or key error behind a 503 or a 400.
	Err error
}

// Problem is the JSON body of a rejection: an RFC 9457 problem with
// weir's extension members, the one shape of every weir rejection
// (protect.Problem). Clients may decode it. Error is "rate_limited",
// "forbidden", "unavailable" or "bad_request"; Protect is always empty.
type Problem = protect.Problem

// ProblemContentType is the media type of a rejection's JSON body.
const ProblemContentType = protect.ProblemContentType

// ProblemOf returns the problem body that WriteRejection sends for rej.
func ProblemOf(rej Rejection) Problem {
	status := rej.Status
	if status == 0 {
		status = http.StatusTooManyRequests
	}
	p := Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Rule: rej.Rule}
	retry := max(rej.RetryAfter, rej.Result.RetryAfter)
	if retry > 0 {
		p.RetryAfterMS = int64((retry + time.Millisecond - 1) / time.Millisecond)
	}
	if !rej.Result.BlockedUntil.IsZero() {
		p.BlockedUntil = rej.Result.BlockedUntil.UnixMilli()
	}
	switch status {
	case http.StatusTooManyRequests:
		p.Error = "rate_limited"
		p.Detail = "Rate limit " + strconv.Quote(rej.Rule) + " exceeded; retry in " +
			strconv.FormatInt(RetryAfterSeconds(retry), 10) + " s."
		if p.BlockedUntil != 0 {
			p.Detail = "Rate limit " + strconv.Quote(rej.Rule) + " exceeded; blocked until " +
				rej.Result.BlockedUntil.UTC().Format(time.RFC3339) + "."
		}
	case http.StatusForbidden:
		p.Error = "forbidden"
		p.Detail = "This client may not use this service."
		if rej.Rule != "" {
			p.Detail = "Rule " + strconv.Quote(rej.Rule) + " refuses requests that do not identify their client."
		}
	case http.StatusServiceUnavailable:
		p.Error = "unavailable"
		p.Detail = "The rate limiter is unavailable; try again later."
	case http.StatusBadRequest:
		p.Error = "bad_request"
		p.Detail = "The request does not identify its client for rate limiting."
		if errors.Is(rej.Err, ErrBadCost) {
			p.Detail = rej.Err.Error() // the request's own value, and what is wanted
		}
	default:
		p.Error = strings.ReplaceAll(strings.ToLower(p.Title), " ", "_")
		p.Detail = p.Title + "."
	}
	return p
}

// WriteRejection answers a rejected request: with the status of rej, a
// Cache-Control: no-store header, and the problem body as
// application/problem+json, or a short HTML page with a countdown when the
// client prefers text/html (a browser navigating): protect.WriteProblem.
// It does not set the rate-limit headers; the middleware has done that
// before.
func WriteRejection(w http.ResponseWriter, r *http.Request, rej Rejection) {
	protect.WriteProblem(w, r, ProblemOf(rej))
}
