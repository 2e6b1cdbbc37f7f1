package protect

import (
	"encoding/json"
	"html"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// ProblemContentType is the media type of a rejection's JSON body.
const ProblemContentType = "application/problem+json"

// Problem is the body of every rejection weir's HTTP middleware writes:
// a protect rule's 503 (WriteRejection) and httplimit's 429, 403, 503 and
// 400 (httplimit.Problem is this type). It is an RFC 9457 problem with
// weir's extension members; clients may decode it.
type Problem struct {
	Type   string `json:"type"`   // "about:blank": the status says what happened
	Title  string `json:"title"`  // the status text, such as "Too Many Requests"
	Status int    `json:"status"` // the HTTP status
	Detail string `json:"detail"` // a sentence for people
	// Error is a stable code for programs: "rate_limited", "forbidden",
	// "unavailable" or "bad_request" from a rate limit; "overloaded" or
	// "circuit_open" from a protect rule.
	Error string `json:"error"`
	// Rule is the rate-limit rule that rejected, if any.
	Rule string `json:"rule,omitempty"`
	// Protect is the protect rule that rejected ("system" for the system
	// section); empty for a rate limit's rejection.
	Protect string `json:"protect,omitempty"`
	// RetryAfterMS is the milliseconds until a retry can succeed; 0 when
	// unknown.
	RetryAfterMS int64 `json:"retry_after_ms"`
	// BlockedUntil is the end of the penalty box in Unix milliseconds, or
	// 0 when no penalty box holds the client. A page can count down to it.
	BlockedUntil int64 `json:"blocked_until"`
}

// WriteProblem answers a rejected request with p: status p.Status, a
// Cache-Control: no-store header, and p as application/problem+json, or
// as a short HTML page with a countdown when r (which may be nil) prefers
// text/html (a browser navigating). Other headers, such as Retry-After,
// are the caller's to set before.
func WriteProblem(w http.ResponseWriter, r *http.Request, p Problem) {
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
