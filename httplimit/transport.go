package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/weir-dev/weir/internal/waitctx"
)

// DefaultTransportHosts is how many hosts a Transport remembers budgets
// for unless Transport.MaxHosts says otherwise.
const DefaultTransportHosts = 1024

// maxQuotas bounds the quotas a Transport tracks per host: a server
// cannot make it keep more by naming more policies.
const maxQuotas = 8

// maxRetryAfter caps a Retry-After the Transport believes: a day.
const maxRetryAfter = 24 * time.Hour

// ErrPaced is wrapped by the error a Transport returns when a request
// would have to wait for its host's budget past the request's deadline.
// The error also matches context.DeadlineExceeded.
var ErrPaced = errors.New("httplimit: rate limit budget exhausted until past the request's deadline")

// Transport is an http.RoundTripper that paces its requests by the
// rate-limit headers the servers send back (RateLimit, RateLimit-Policy
// and Retry-After, as weir's middleware sends them), so that it does not
// send what the server would reject.
//
// Every goroutine using one Transport shares one budget per host:
//
//   - until a host has answered, one request at a time goes out to it, and
//     the others wait for that answer;
//   - what is left is the lowest r (RateLimit's requests remaining) any
//     answer since the quota's last reset gave, less the requests still in
//     flight: never more than the server has left, whatever order the
//     answers arrive in, and exactly it once every answer is in; at 0 requests
//     wait until t, when the quota is whole again, and then may send the
//     RateLimit-Policy's q (or probe with one request if it was not sent);
//   - a 429 or 503 with Retry-After holds every request to the host until
//     then. A 429 is retried after it, up to MaxRetries times, when the
//     method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE, or a
//     request with an Idempotency-Key header) and the body can be sent
//     again (no body, or GetBody set); otherwise it is returned.
//
// A wait that would end past the request context's deadline is not begun:
// before sending, RoundTrip returns an error wrapping ErrPaced and
// context.DeadlineExceeded; before a retry, it returns the 429 as it came.
// Budgets are counted per host (the URL's host:port); the state of at most
// MaxHosts hosts is kept, the least recently used forgotten first.
type Transport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base http.RoundTripper
	// MaxHosts bounds the hosts whose budgets are kept; 0 means
	// DefaultTransportHosts.
	MaxHosts int
	// MaxRetries bounds the retries of one request after 429s; 0 means 3,
	// a negative value none.
	MaxRetries int

	now   func() time.Time
	sleep func(context.Context, time.Duration) error

	mu    sync.Mutex
	hosts map[string]*hostBudget
}

// NewTransport returns a Transport sending through base (nil means
// http.DefaultTransport).
func NewTransport(base http.RoundTripper) *Transport {
	return &Transport{Base: base}
}

// hostBudget is what a Transport knows of one host's limits.
type hostBudget struct {
	used     time.Time // last use, for eviction
	blocked  time.Time // no request before this (Retry-After)
	known    bool      // a response told the budget (or that there is none)
	probing  bool      // !known: one request is out to learn it
	inflight int64
	quotas   []quota
	changed  chan struct{} // closed and replaced when a response arrives
}

// quota is one named limit of a host, from the RateLimit header.
type quota struct {
	name string
	// r is the lowest r an answer gave since the quota's reset (the
	// server's count after the last request it admitted of those
	// answered); r minus the requests in flight is what may be sent.
	r     int64
	reset time.Time // the quota is whole again; zero when not pending
	q     int64     // RateLimit-Policy's quota; 0 if not sent
}

func (t *Transport) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	host := req.URL.Host
	ctx := req.Context()
	retries := t.MaxRetries
	if retries == 0 {
		retries = 3
	}
	cur := req
	for attempt := 0; ; attempt++ {
		if err := t.acquire(ctx, host); err != nil {
			// A RoundTripper closes the body it was given, even on an
			// error (http.Client relies on it).
			if cur.Body != nil {
				cur.Body.Close()
			}
			return nil, err
		}
		resp, err := t.base().RoundTrip(cur)
		ra := t.settle(host, resp, err)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempt >= retries || !retryable(req) {
			return resp, err
		}
		if dl, ok := ctx.Deadline(); ok && t.clock().Add(ra).After(dl) {
			return resp, nil // waiting would pass the deadline: the 429 is the answer
		}
		next := req.Clone(ctx)
		if req.Body != nil && req.Body != http.NoBody {
			body, err := req.GetBody()
			if err != nil {
				return resp, nil
			}
			next.Body = body
		}
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		resp.Body.Close()
		cur = next
	}
}

// retryable reports whether a rejected req may be sent again.
func retryable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false
	}
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

// budget returns host's state, making room for it if needed. t.mu is held.
func (t *Transport) budget(host string, now time.Time) *hostBudget {
	if b, ok := t.hosts[host]; ok {
		b.used = now
		return b
	}
	if t.hosts == nil {
		t.hosts = make(map[string]*hostBudget)
	}
	maxHosts := t.MaxHosts
	if maxHosts <= 0 {
		maxHosts = DefaultTransportHosts
	}
	for len(t.hosts) >= maxHosts {
		var oldest string
		var at time.Time
		first := true
		for h, b := range t.hosts {
			if b.inflight == 0 && !b.probing && (first || b.used.Before(at)) {
				oldest, at, first = h, b.used, false
			}
		}
		if first {
			break // every host is busy: exceed the bound until one settles
		}
		delete(t.hosts, oldest)
	}
	b := &hostBudget{used: now, changed: make(chan struct{})}
	t.hosts[host] = b
	return b
}

// acquire waits until host's budget allows one more request and spends
// it, or returns an error when that would be past ctx's deadline.
func (t *Transport) acquire(ctx context.Context, host string) error {
	for {
		t.mu.Lock()
		now := t.clock()
		b := t.budget(host, now)
		wait, probeWait := b.wait(now)
		if wait == 0 && probeWait == nil {
			b.spend()
			t.mu.Unlock()
			return nil
		}
		t.mu.Unlock()
		if probeWait != nil {
			select {
			case <-probeWait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if dl, ok := ctx.Deadline(); ok && now.Add(wait).After(dl) {
			return fmt.Errorf("%w: %s for %v: %w", ErrPaced, host, wait, context.DeadlineExceeded)
		}
		if err := t.sleepFor(ctx, wait); err != nil {
			return err
		}
	}
}

func (t *Transport) sleepFor(ctx context.Context, d time.Duration) error {
	if t.sleep != nil {
		return t.sleep(ctx, d)
	}
	return waitctx.Sleep(ctx, d)
}

// wait says how long b holds a request at now, or, while a first request
// is out to learn the budget, the channel to wait on. It refills quotas
// whose reset has come.
func (b *hostBudget) wait(now time.Time) (time.Duration, <-chan struct{}) {
	if b.blocked.After(now) {
		return b.blocked.Sub(now), nil
	}
	if !b.known {
		if b.probing {
			return 0, b.changed
		}
		return 0, nil
	}
	var wait time.Duration
	for i := range b.quotas {
		qu := &b.quotas[i]
		if !qu.reset.IsZero() && !qu.reset.After(now) {
			qu.reset = time.Time{}
			if qu.q > 0 {
				qu.r = qu.q
			} else {
				b.known = false // learn the budget again
				return b.wait(now)
			}
		}
		if qu.r-b.inflight <= 0 {
			if qu.reset.IsZero() {
				b.known = false
				return b.wait(now)
			}
			wait = max(wait, qu.reset.Sub(now))
		}
	}
	return wait, nil
}

// spend counts one request out.
func (b *hostBudget) spend() {
	if !b.known {
		b.probing = true
	}
	b.inflight++
}

// settle records what a response (or a failure) says about host's budget
// and returns its Retry-After (0 if none).
func (t *Transport) settle(host string, resp *http.Response, err error) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock()
	b := t.budget(host, now)
	b.inflight = max(b.inflight-1, 0)
	probe := b.probing
	b.probing = false
	defer func() {
		if probe || resp != nil {
			close(b.changed)
			b.changed = make(chan struct{})
		}
	}()
	if err != nil || resp == nil {
		return 0
	}
	var ra time.Duration
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		if d, ok := parseRetryAfter(resp.Header.Get(headerRetryAfter), now); ok {
			ra = d
		} else if resp.StatusCode == http.StatusTooManyRequests {
			ra = time.Second // a 429 without Retry-After: back off a little
		}
		if ra > 0 && now.Add(ra).After(b.blocked) {
			b.blocked = now.Add(ra)
		}
	}
	items := parseItems(resp.Header.Values(headerRateLimit))
	if len(items) == 0 {
		if !b.known && resp.StatusCode != http.StatusTooManyRequests {
			b.known, b.quotas = true, nil // no limit announced
		}
		return ra
	}
	policies := parseItems(resp.Header.Values(headerPolicy))
	qs := make([]quota, 0, len(items))
	for _, it := range items {
		r, okR := it.params["r"]
		if !okR || len(qs) == maxQuotas {
			continue
		}
		qu := quota{name: it.name, r: r}
		if s, ok := it.params["t"]; ok && s > 0 {
			qu.reset = now.Add(min(time.Duration(s)*time.Second, maxRetryAfter))
		}
		for _, p := range policies {
			if p.name == it.name {
				qu.q = p.params["q"]
			}
		}
		// Responses settle in any order: one the server answered before
		// others may come after them, with a larger r. Until the quota's
		// reset, r only ever lowers what is left.
		for _, old := range b.quotas {
			if old.name == qu.name && old.reset.After(now) {
				qu.r = min(qu.r, old.r)
				qu.reset = later(qu.reset, old.reset)
			}
		}
		qs = append(qs, qu)
	}
	b.quotas, b.known = qs, true
	return ra
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// parseRetryAfter reads a Retry-After of delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return min(time.Duration(min(n, int64(maxRetryAfter/time.Second)))*time.Second, maxRetryAfter), true
	}
	if at, err := http.ParseTime(v); err == nil {
		return min(max(at.Sub(now), 0), maxRetryAfter), true
	}
	return 0, false
}

// sfItem is one member of a structured-field list, as the rate-limit
// headers use them: a name and its integer parameters.
type sfItem struct {
	name   string
	params map[string]int64
}

// parseItems reads `"name";k=1;k2=2, "other";k=3` leniently: members
// that do not parse are skipped, and at most maxQuotas are read.
func parseItems(vals []string) []sfItem {
	var out []sfItem
	for _, v := range vals {
		for _, m := range splitOutsideQuotes(v, ',') {
			if len(out) == maxQuotas {
				return out
			}
			parts := splitOutsideQuotes(m, ';')
			name := strings.TrimSpace(parts[0])
			if uq, err := strconv.Unquote(name); err == nil {
				name = uq
			}
			it := sfItem{name: name, params: make(map[string]int64, len(parts)-1)}
			for _, p := range parts[1:] {
				k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
				if !ok {
					continue
				}
				if n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64); err == nil && n >= 0 {
					it.params[strings.ToLower(k)] = n
				}
			}
			out = append(out, it)
		}
	}
	return out
}

// splitOutsideQuotes splits s at sep where sep is not inside a quoted
// string.
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	inQ, esc, start := false, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case esc:
			esc = false
		case inQ && c == '\\':
			esc = true
		case c == '"':
			inQ = !inQ
		case !inQ && c == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
