package httplimit

import (
	"net/http"
	"strconv"
	"time"

	"github.com/weir-dev/weir"
)

// Status is one rule's decision as the rate-limit headers report it. It is
// independent of package policy so that the service and other callers can
// render headers for results they got elsewhere.
type Status struct {
	Rule   string      // the rule's name, quoted in the headers
	Limit  weir.Limit  // the limit applied: the quota and window
	Result weir.Result // the store's answer
	Shadow bool        // a shadow rule: reported, never enforced
}

// Rejected reports whether s turns the request away: an enforced rule
// whose result is a rejection.
func (s Status) Rejected() bool { return !s.Shadow && !s.Result.Allowed }

// A HeaderFormatter renders rate-limit headers. Every response the
// middleware and the service produce goes through one, because the header
// draft still changes.
type HeaderFormatter interface {
	// WriteHeaders sets the headers for statuses on h. limiting is the
	// index of the status to report as the one in force (see
	// MostRestrictive), or -1 when none is.
	WriteHeaders(h http.Header, statuses []Status, limiting int)
}

// DraftHeaders renders the headers of draft-ietf-httpapi-ratelimit-headers-11:
//
//	RateLimit-Policy: "login";q=5;w=900, "api";q=100;w=60
//	RateLimit: "login";r=3;t=412
//	Retry-After: 412
//
// RateLimit-Policy lists every status, shadow ones included: q is the
// limit's Rate and w its Period in seconds, rounded up. RateLimit reports
// the limiting status: r is what remains and t the seconds, rounded up,
// until the quota is fully replenished (or the penalty box ends, if later).
// Retry-After is set only when an enforced status rejects: the seconds,
// rounded up and at least 1, until every rejecting rule would admit the
// request again.
type DraftHeaders struct {
	// Legacy adds X-RateLimit-Limit (the most that can be used at once:
	// Result.Limit), X-RateLimit-Remaining and X-RateLimit-Reset (seconds
	// from now, like t) for the limiting status.
	Legacy bool
}

// Header names, in canonical form.
const (
	headerPolicy         = "Ratelimit-Policy"
	headerRateLimit      = "Ratelimit"
	headerRetryAfter     = "Retry-After"
	headerLegacyLimit    = "X-Ratelimit-Limit"
	headerLegacyRemain   = "X-Ratelimit-Remaining"
	headerLegacyReset    = "X-Ratelimit-Reset"
	maxRetryAfterSeconds = 1<<31 - 1
)

// WriteHeaders implements HeaderFormatter.
func (f DraftHeaders) WriteHeaders(h http.Header, statuses []Status, limiting int) {
	if len(statuses) == 0 {
		return
	}
	// Both headers are built in one buffer (on the stack for a few rules)
	// and become one string and one backing array: two allocations.
	var stack [256]byte
	buf := stack[:0]
	for i, s := range statuses {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = appendName(buf, s.Rule)
		buf = append(buf, ";q="...)
		buf = strconv.AppendInt(buf, s.Limit.Rate, 10)
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, ceilSeconds(s.Limit.Period), 10)
	}
	policyEnd := len(buf)
	var reset, remaining int64
	var limit int64
	has := limiting >= 0 && limiting < len(statuses)
	if has {
		s := statuses[limiting]
		reset = ceilSeconds(resetAfter(s.Result))
		remaining = max(s.Result.Remaining, 0)
		limit = s.Result.Limit
		buf = appendName(buf, s.Rule)
		buf = append(buf, ";r="...)
		buf = strconv.AppendInt(buf, remaining, 10)
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, reset, 10)
	}
	all := string(buf)
	vals := make([]string, 2)
	vals[0] = all[:policyEnd]
	h[headerPolicy] = vals[0:1:1]
	if has {
		vals[1] = all[policyEnd:]
		h[headerRateLimit] = vals[1:2:2]
		if f.Legacy {
			h[headerLegacyLimit] = []string{strconv.FormatInt(limit, 10)}
			h[headerLegacyRemain] = []string{strconv.FormatInt(remaining, 10)}
			h[headerLegacyReset] = []string{strconv.FormatInt(reset, 10)}
		}
	}

	if retry, ok := RetryAfter(statuses); ok {
		h[headerRetryAfter] = []string{strconv.FormatInt(RetryAfterSeconds(retry), 10)}
	}
}

// WriteHeaders renders statuses onto h with f, or with DraftHeaders{} when
// f is nil. limiting is the status to report in RateLimit; pass
// MostRestrictive(statuses) unless you know better.
func WriteHeaders(h http.Header, statuses []Status, limiting int, f HeaderFormatter) {
	if f == nil {
		f = DraftHeaders{}
	}
	f.WriteHeaders(h, statuses, limiting)
}

// RetryAfter returns how long until every enforced rejecting status would
// admit the request again, and whether any status rejects at all.
func RetryAfter(statuses []Status) (time.Duration, bool) {
	var d time.Duration
	rejected := false
	for _, s := range statuses {
		if s.Rejected() {
			rejected = true
			d = max(d, s.Result.RetryAfter)
		}
	}
	return d, rejected
}

// RetryAfterSeconds renders a retry delay as Retry-After does: whole
// seconds, rounded up, and at least 1, since a rejection that could be
// retried at once would not have been a rejection.
func RetryAfterSeconds(d time.Duration) int64 {
	return min(max(ceilSeconds(d), 1), maxRetryAfterSeconds)
}

// MostRestrictive returns the index of the status that the RateLimit header
// should report, or -1 if statuses is empty. Enforced statuses come before
// shadow ones; among them the order is MoreRestrictive's. Ties go to the
// first.
func MostRestrictive(statuses []Status) int {
	best := -1
	for i := range statuses {
		if best < 0 || moreRestrictive(&statuses[i], &statuses[best]) {
			best = i
		}
	}
	return best
}

func moreRestrictive(a, b *Status) bool {
	if a.Shadow != b.Shadow {
		return !a.Shadow
	}
	return MoreRestrictive(a.Result, b.Result)
}

// MoreRestrictive reports whether a holds a client back more than b: the
// one rule of weir's for the result to report, which policy's
// Verdict.Limiting follows too. A rejection beats an admission, and of two
// rejections the longer RetryAfter wins: the client waits for it. Of two
// admissions, the one with fewer requests Remaining wins, then the one
// whose quota is whole again later: Remaining counts what the client may
// still send before this limit rejects it, so the fewest is the limit it
// meets first. (A share of the quota would point at a large limit half
// used rather than a small one nearly spent, and a client pacing itself
// by the reported RateLimit would then be rejected by the other one.)
func MoreRestrictive(a, b weir.Result) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed && a.RetryAfter != b.RetryAfter {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return resetAfter(a) > resetAfter(b)
}

// resetAfter is when the quota is whole again: the end of ResetAfter, or of
// the penalty box if that is later.
func resetAfter(r weir.Result) time.Duration {
	return max(r.ResetAfter, r.RetryAfter)
}

// ceilSeconds rounds d up to whole seconds; negative durations give 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// appendName appends rule as a structured-field string (RFC 8941): quoted,
// with '"' and '\' escaped. Bytes outside printable ASCII, which an sf-string
// cannot hold, become '?'.
func appendName(buf []byte, rule string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(rule); i++ {
		c := rule[i]
		switch {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', c)
		case c < 0x20 || c > 0x7e:
			buf = append(buf, '?')
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}
