package httplimit

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
)

// A Meter records the real cost of a request whose rule charges an
// estimate first (weir.yaml's cost:, or WithCost): the handler reports it
// with Charge, and the middleware settles the difference when the handler
// returns. It is safe for concurrent use, so a handler streaming a
// response may charge from any goroutine.
type Meter struct {
	actual  atomic.Int64
	charged atomic.Bool
}

type meterKey struct{}

// ErrBadCost is wrapped by the error of a request whose cost (weir.yaml's
// cost: header or query parameter) is not a whole number its rule admits.
// The middleware answers 400, and the problem's detail names the value.
var ErrBadCost = errors.New("bad request cost")

// WithMeter returns r with a fresh Meter, for middleware that settles
// costs. Handlers call Charge instead.
func WithMeter(r *http.Request) (*http.Request, *Meter) {
	m := &Meter{}
	return r.WithContext(context.WithValue(r.Context(), meterKey{}, m)), m
}

// Charged returns the real cost the handler charged, and whether it did.
func (m *Meter) Charged() (int64, bool) { return m.actual.Load(), m.charged.Load() }

// Charge sets the real cost of r: the whole cost so far, such as the LLM
// tokens a response used. A streaming handler may call it as often as it
// likes; the last value is what is settled when the handler returns
// (including when the client went away meanwhile). The middleware then
// debits what exceeds the estimate taken before the handler, or refunds
// what was not used. Charge reports false, and does nothing, when no rule
// with a cost applies to r, or n is negative.
func Charge(r *http.Request, n int64) bool {
	m, _ := r.Context().Value(meterKey{}).(*Meter)
	if m == nil || n < 0 {
		return false
	}
	m.actual.Store(n)
	m.charged.Store(true)
	return true
}

// StatusRecorder is a ResponseWriter that remembers the status written,
// for rules that count only some responses. It passes Flush, Hijack and
// Unwrap (http.ResponseController) through, so streaming handlers work
// behind it.
type StatusRecorder struct {
	http.ResponseWriter
	status int
}

// NewStatusRecorder wraps w.
func NewStatusRecorder(w http.ResponseWriter) *StatusRecorder {
	return &StatusRecorder{ResponseWriter: w}
}

// Status returns the status written: 200 if the handler wrote a body or
// nothing at all without a status.
func (s *StatusRecorder) Status() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}

// WriteHeader implements http.ResponseWriter.
func (s *StatusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (s *StatusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Flush implements http.Flusher when the wrapped writer does.
func (s *StatusRecorder) Flush() {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

// Hijack implements http.Hijacker when the wrapped writer does.
func (s *StatusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := s.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, errors.ErrUnsupported
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (s *StatusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
