package protect

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ProblemContentType is the media type of a rejection's body.
const ProblemContentType = "application/problem+json"

// Problem is the body of a 503 from a protect rule: an RFC 9457 problem
// whose error is "overloaded" or "circuit_open" and whose protect member
// names the rule.
type Problem struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail"`
	Error        string `json:"error"`
	Protect      string `json:"protect"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

// WriteRejection answers a request that rej turned away: 503, Retry-After
// in whole seconds (at least 1) and the Problem body.
func WriteRejection(w http.ResponseWriter, rej *Rejection) {
	retry := max(rej.RetryAfter, time.Second)
	secs := int64((retry + time.Second - 1) / time.Second)
	detail := "The service is overloaded; retry later."
	if rej.Reason == ReasonCircuitOpen {
		detail = "A circuit breaker is open: the service is failing; retry later."
	}
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusServiceUnavailable)
	_ = json.NewEncoder(w).Encode(Problem{
		Type: "about:blank", Title: http.StatusText(http.StatusServiceUnavailable),
		Status: http.StatusServiceUnavailable, Detail: detail,
		Error: rej.Reason, Protect: rej.Rule, RetryAfterMS: retry.Milliseconds(),
	})
}

// Track serves r with next and calls done once it returns, with whether
// it failed: answered with a 5xx, or panicked (the panic then goes on, as
// net/http expects).
func Track(w http.ResponseWriter, r *http.Request, next http.Handler, done func(failed bool)) {
	sw := &statusWriter{ResponseWriter: w}
	finished := false
	defer func() {
		if !finished {
			done(true) // a panic
		}
	}()
	next.ServeHTTP(sw, r)
	finished = true
	done(sw.status >= 500)
}

// statusWriter records the status a handler answers with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush flushes when the writer underneath can.
func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		if s.status == 0 {
			s.status = http.StatusOK
		}
		f.Flush()
	}
}

// Hijack hijacks when the writer underneath can (a WebSocket upgrade, say).
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := s.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, fmt.Errorf("protect: %T cannot hijack", s.ResponseWriter)
}

// Wrap returns next guarded by r. priority reads a request's priority; nil
// makes every request Normal. Give a priority function only when the
// header (or whatever it reads) is set by something you trust: the
// request is otherwise free to call itself critical.
func (r *Rule) Wrap(next http.Handler, priority func(*http.Request) Priority) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p := Normal
		if priority != nil {
			p = priority(req)
		}
		t, err := r.Wait(req.Context(), p)
		if err != nil {
			var rej *Rejection
			errors.As(err, &rej)
			WriteRejection(w, rej)
			return
		}
		Track(w, req, next, t.Done)
	})
}

// HeaderPriority returns a priority function for Wrap that reads the
// named header with ParsePriority.
func HeaderPriority(name string) func(*http.Request) Priority {
	return func(r *http.Request) Priority { return ParsePriority(r.Header.Get(name)) }
}

// Transport applies a rule to outbound calls: a dependency that fails or
// slows down trips the rule's breaker, and the calls then fail at once
// with a *Rejection instead of waiting on it. A call fails when the base
// transport returns an error or the response is a 5xx; its latency runs
// to the response's headers. The priority of a call is the one its
// request's context carries (WithPriority), Normal by default.
type Transport struct {
	Rule *Rule
	// Base makes the calls; nil means http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	tk, err := t.Rule.Wait(req.Context(), PriorityFrom(req.Context()))
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close() // RoundTrip must close it, even on error
		}
		return nil, err
	}
	failed := true
	defer func() { tk.Done(failed) }()
	resp, err := base.RoundTrip(req)
	failed = err != nil || resp.StatusCode >= 500
	return resp, err
}
