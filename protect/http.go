package protect

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// WriteRejection answers a request that rej turned away: 503, Retry-After
// in whole seconds (at least 1) and the Problem body, as JSON.
func WriteRejection(w http.ResponseWriter, rej *Rejection) {
	retry := max(rej.RetryAfter, time.Second)
	secs := int64((retry + time.Second - 1) / time.Second)
	detail := "The service is overloaded; retry later."
	if rej.Reason == ReasonCircuitOpen {
		detail = "A circuit breaker is open: the service is failing; retry later."
	}
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	WriteProblem(w, nil, Problem{
		Type: "about:blank", Title: http.StatusText(http.StatusServiceUnavailable),
		Status: http.StatusServiceUnavailable, Detail: detail,
		Error: rej.Reason, Protect: rej.Rule, RetryAfterMS: retry.Milliseconds(),
	})
}

// Track serves r with next and calls done once it returns, with whether
// it failed (answered with a 5xx, or panicked: the panic then goes on, as
// net/http expects) and how long the handler was blocked on its client:
// in reads of the request body and in writes and flushes of the response.
// Pass that time to Ticket.DoneWaited, so that a client that trickles its
// body or reads slowly does not count as a slow handler.
func Track(w http.ResponseWriter, r *http.Request, next http.Handler, done func(failed bool, client time.Duration)) {
	sw := &statusWriter{ResponseWriter: w}
	if r.Body != nil && r.Body != http.NoBody {
		tb := &timedBody{ReadCloser: r.Body, blocked: &sw.blocked}
		r2 := *r
		r2.Body = tb
		r = &r2
	}
	finished := false
	defer func() {
		if !finished {
			done(true, time.Duration(sw.blocked.Load())) // a panic
		}
	}()
	next.ServeHTTP(sw, r)
	finished = true
	done(sw.status >= 500, time.Duration(sw.blocked.Load()))
}

// timedBody adds the time each Read of a request body blocks to blocked.
type timedBody struct {
	io.ReadCloser
	blocked *atomic.Int64
}

func (b *timedBody) Read(p []byte) (int, error) {
	start := time.Now()
	n, err := b.ReadCloser.Read(p)
	b.blocked.Add(int64(time.Since(start)))
	return n, err
}

// statusWriter records the status a handler answers with, and the time
// its writes and flushes spend blocked on the client (with the body's
// reads, in blocked).
type statusWriter struct {
	http.ResponseWriter
	status  int
	blocked atomic.Int64
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
	start := time.Now()
	n, err := s.ResponseWriter.Write(b)
	s.blocked.Add(int64(time.Since(start)))
	return n, err
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush flushes when the writer underneath can.
func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		if s.status == 0 {
			s.status = http.StatusOK
		}
		start := time.Now()
		f.Flush()
		s.blocked.Add(int64(time.Since(start)))
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
		Track(w, req, next, t.DoneWaited)
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
