package httplimit

import (
	"encoding/json"
	"errors"
	"html"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
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
// weir's extension members. Clients may decode it.
type Problem struct {
	Type   string `json:"type"`   // "about:blank": the status says what happened
	Title  string `json:"title"`  // the status text, such as "Too Many Requests"
	Status int    `json:"status"` // the HTTP status
	Detail string `json:"detail"` // a sentence for people
	// Error is a stable code for programs: "rate_limited", "forbidden",
	// "unavailable" or "bad_request".
	Error string `json:"error"`
	// Rule is the rule that rejected, if any.
	Rule string `json:"rule,omitempty"`
	// RetryAfterMS is the milliseconds, rounded up, until a retry can
	// succeed; 0 when unknown.
	RetryAfterMS int64 `json:"retry_after_ms"`
	// BlockedUntil is the end of the penalty box in Unix milliseconds, or
	// 0 when no penalty box holds the client. A page can count down to it.
	BlockedUntil int64 `json:"blocked_until"`
}

// ProblemContentType is the media type of a rejection's JSON body.
const ProblemContentType = "application/problem+json"

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
// client prefers text/html (a browser navigating). It does not set the
// rate-limit headers; the middleware has done that before.
func WriteRejection(w http.ResponseWriter, r *http.Request, rej Rejection) {
	p := ProblemOf(rej)
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if r != nil && prefersHTML(r.Header.Values("Accept")) {
		h.Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(p.Status)
		_, _ = w.Write([]byte(problemHTML(p)))
		return
	}
	body, _ := json.Marshal(p) // a struct of strings and ints cannot fail
	h.Set("Content-Type", ProblemContentType)
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// problemHTML renders p as a small page. While a retry time is known a
// script counts the seconds down; without scripts the number still shows.
func problemHTML(p Problem) string {
	var b strings.Builder
	title := strconv.Itoa(p.Status) + " " + p.Title
	b.WriteString("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">" +
		"<meta name=\"viewport\" content=\"width=device-width\"><title>")
	b.WriteString(html.EscapeString(title))
	b.WriteString("</title></head>\n<body style=\"font-family:sans-serif;max-width:32em;margin:4em auto\">\n<h1>")
	b.WriteString(html.EscapeString(title))
	b.WriteString("</h1>\n<p>")
	b.WriteString(html.EscapeString(p.Detail))
	b.WriteString("</p>\n")
	if p.RetryAfterMS > 0 {
		secs := (p.RetryAfterMS + 999) / 1000
		b.WriteString("<p>Try again in <strong id=\"s\">")
		b.WriteString(strconv.FormatInt(secs, 10))
		b.WriteString("</strong> seconds.</p>\n<script>(function(){var e=document.getElementById(\"s\"),t=Date.now()+")
		b.WriteString(strconv.FormatInt(secs*1000, 10))
		b.WriteString(";setInterval(function(){e.textContent=Math.max(0,Math.ceil((t-Date.now())/1e3))},1e3)})()</script>\n")
	}
	b.WriteString("</body></html>\n")
	return b.String()
}

// prefersHTML reports whether the Accept header values rank text/html
// above JSON. A browser navigating sends text/html first; fetch and most
// API clients send */* or application/json.
func prefersHTML(accept []string) bool {
	htmlQ, jsonQ := -1.0, -1.0
	for _, line := range accept {
		for part := range strings.SplitSeq(line, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			q := 1.0
			if v, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(v, 64); err == nil {
					q = f
				}
			}
			switch mt {
			case "text/html", "application/xhtml+xml":
				htmlQ = max(htmlQ, q)
			case "application/json", "application/problem+json":
				jsonQ = max(jsonQ, q)
			case "application/*", "*/*":
				jsonQ = max(jsonQ, q)
			}
		}
	}
	return htmlQ > 0 && htmlQ > jsonQ
}
