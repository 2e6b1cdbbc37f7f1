package policy_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
)

// newPolicy compiles a weir.yaml over a memstore on clock c.
func newPolicy(t *testing.T, c *clock, yaml string, opts ...policy.Option) *policy.Policy {
	t.Helper()
	return newPolicyOn(t, memstore.New(memstore.WithClock(c.Now)), yaml, opts...)
}

func newPolicyOn(t *testing.T, store weir.Store, yaml string, opts ...policy.Option) *policy.Policy {
	t.Helper()
	cfg, err := policy.Parse([]byte(yaml), "weir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.New(cfg, store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// send sends a request through h.
func send(h http.Handler, method, target, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

const multiYAML = `
rules:
  - name: login
    match: { methods: [POST], path: /api/login }
    identity: [ip]
    limit: 5/15m
    algorithm: sliding_log
    block: 15m
  - name: api
    match: { path: /api/ }
    identity: [header:X-API-Key]
    limit: 100/m
    algorithm: fixed_window
  - name: probe
    match: { path: /api/ }
    identity: [ip]
    limit: 2/m
    algorithm: fixed_window
    shadow: true
allow: [192.0.2.200/32]
deny: [203.0.113.0/24]
`

func TestMiddlewareMultiRule(t *testing.T) {
	c := newClock()
	var decisions []httplimit.Observation
	h := policy.Middleware(newPolicy(t, c, multiYAML), httplimit.WithObserver(func(d httplimit.Observation) { decisions = append(decisions, d) }))(hello)
	login := func() *httptest.ResponseRecorder {
		return send(h, http.MethodPost, "/api/login", "192.0.2.1:1", "X-API-Key", "k1")
	}
	const policyHeader = `"login";q=5;w=900, "api";q=100;w=60, "probe";q=2;w=60`

	for i := 1; i <= 5; i++ {
		w := login()
		if w.Code != 200 {
			t.Fatalf("login %d: %d %s", i, w.Code, w.Body)
		}
		wantHeader(t, w, "RateLimit-Policy", policyHeader)
		// login has the least left, by share and by count.
		wantHeader(t, w, "RateLimit", `"login";r=`+string(rune('0'+5-i))+`;t=900`)
		// The shadow rule rejects from the 3rd request on, and never blocks.
		wantHeader(t, w, "Retry-After", "")
	}
	if len(decisions) != 15 {
		t.Fatalf("%d decisions, want 3 per request", len(decisions))
	}
	if d := decisions[3*2+2]; d.Rule != "probe" || !d.Shadow || d.Allowed || d.Key != "192.0.2.1" {
		t.Errorf("3rd request's shadow decision: %+v", d)
	}
	if d := decisions[1]; d.Rule != "api" || d.Tier != "default" || d.Key != "k1" || !d.Allowed {
		t.Errorf("api decision: %+v", d)
	}

	w := login()
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th login: %d", w.Code)
	}
	wantHeader(t, w, "RateLimit-Policy", policyHeader)
	wantHeader(t, w, "RateLimit", `"login";r=0;t=900`)
	wantHeader(t, w, "Retry-After", "900")
	p := decodeProblem(t, w)
	if p.Rule != "login" || p.Error != "rate_limited" || p.RetryAfterMS != 900_000 ||
		p.BlockedUntil != c.Now().Add(15*time.Minute).UnixMilli() {
		t.Errorf("problem %+v", p)
	}

	// All or nothing: the rejected login consumed nothing of api.
	w = send(h, http.MethodGet, "/api/items", "192.0.2.1:1", "X-API-Key", "k1")
	if w.Code != 200 {
		t.Fatalf("GET /api/items: %d", w.Code)
	}
	wantHeader(t, w, "RateLimit-Policy", `"api";q=100;w=60, "probe";q=2;w=60`)
	wantHeader(t, w, "RateLimit", `"api";r=94;t=60`)

	// A request matching only a shadow rule reports it, and passes.
	for i := 0; i < 3; i++ {
		w = send(h, http.MethodGet, "/api/items", "192.0.2.7:1")
	}
	if w.Code != 200 {
		t.Fatalf("shadow only: %d", w.Code)
	}
	wantHeader(t, w, "RateLimit-Policy", `"probe";q=2;w=60`)
	wantHeader(t, w, "RateLimit", `"probe";r=0;t=60`)
	wantHeader(t, w, "Retry-After", "")

	// No rule matches: no headers.
	w = send(h, http.MethodGet, "/", "192.0.2.1:1")
	if w.Code != 200 || len(w.Header().Values("RateLimit-Policy")) != 0 {
		t.Errorf("unmatched request: %d %v", w.Code, w.Header())
	}
}

func TestMiddlewareLists(t *testing.T) {
	c := newClock()
	var decisions []httplimit.Observation
	h := policy.Middleware(newPolicy(t, c, multiYAML), httplimit.WithObserver(func(d httplimit.Observation) { decisions = append(decisions, d) }))(hello)

	w := send(h, http.MethodPost, "/api/login", "203.0.113.5:1", "Accept", "application/json")
	if w.Code != http.StatusForbidden {
		t.Fatalf("deny-listed: %d", w.Code)
	}
	wantHeader(t, w, "RateLimit", "")
	wantHeader(t, w, "Retry-After", "")
	p := decodeProblem(t, w)
	want := httplimit.Problem{Type: "about:blank", Title: "Forbidden", Status: 403, Detail: "This client may not use this service.", Error: "forbidden"}
	if p != want {
		t.Errorf("problem %+v\nwant    %+v", p, want)
	}
	w = send(h, http.MethodPost, "/api/login", "203.0.113.5:1", "Accept", "text/html")
	if w.Code != 403 || !strings.Contains(w.Body.String(), "<h1>403 Forbidden</h1>") {
		t.Errorf("deny-listed browser: %d %s", w.Code, w.Body)
	}

	for i := 0; i < 10; i++ {
		w = send(h, http.MethodPost, "/api/login", "192.0.2.200:1")
		if w.Code != 200 || len(w.Header()["Ratelimit"]) != 0 {
			t.Fatalf("allow-listed: %d %v", w.Code, w.Header())
		}
	}
	if len(decisions) != 12 || !decisions[0].DenyListed || decisions[0].Allowed || !decisions[2].AllowListed || !decisions[2].Allowed {
		t.Errorf("decisions %+v", decisions[:3])
	}
}

func TestMiddlewareMissingIdentity(t *testing.T) {
	c := newClock()
	h := policy.Middleware(newPolicy(t, c, `
rules:
  - name: keyed
    identity: [header:X-API-Key]
    on_missing: deny
    limit: 10/m
`))(hello)
	if w := send(h, http.MethodGet, "/", "192.0.2.1:1", "X-API-Key", "k"); w.Code != 200 {
		t.Errorf("with a key: %d", w.Code)
	}
	w := send(h, http.MethodGet, "/", "192.0.2.1:1")
	if w.Code != 403 {
		t.Fatalf("without a key: %d", w.Code)
	}
	if p := decodeProblem(t, w); p.Rule != "keyed" || p.Error != "forbidden" ||
		p.Detail != `Rule "keyed" refuses requests that do not identify their client.` {
		t.Errorf("problem %+v", p)
	}
}

func TestMiddlewareLegacyHeaders(t *testing.T) {
	c := newClock()
	yaml := "headers: { legacy: true }\nrules: [{ name: all, limit: 10/m, algorithm: fixed_window }]\n"
	p := newPolicy(t, c, yaml)
	w := send(policy.Middleware(p)(hello), http.MethodGet, "/", "192.0.2.1:1")
	wantHeader(t, w, "X-RateLimit-Limit", "10")
	wantHeader(t, w, "X-RateLimit-Remaining", "9")
	wantHeader(t, w, "X-RateLimit-Reset", "60")
	w = send(policy.Middleware(p, httplimit.WithLegacyHeaders(false))(hello), http.MethodGet, "/", "192.0.2.1:1")
	wantHeader(t, w, "X-RateLimit-Limit", "")
	wantHeader(t, w, "RateLimit", `"all";r=8;t=60`)
}

func TestMiddlewareShaping(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, `
rules:
  - name: shaped
    limit: 10/s
    algorithm: leaky_bucket
    burst: 4
    max_delay: 300ms
`)
	var s sleeper
	var calls atomic.Int32
	h := policy.Middleware(p, httplimit.WithSleep(s.sleep))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	for i := 0; i < 4; i++ {
		if w := send(h, http.MethodGet, "/", "192.0.2.1:1"); w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	if got := s.delays; len(got) != 3 || got[0] != 100*time.Millisecond || got[2] != 300*time.Millisecond {
		t.Errorf("delays %v, want 100ms 200ms 300ms", got)
	}
	if w := send(h, http.MethodGet, "/", "192.0.2.1:1"); w.Code != 429 {
		t.Errorf("beyond the burst: %d", w.Code)
	}
	c.Advance(time.Second)
	do(h, "192.0.2.1:1")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)
	r.RemoteAddr = "192.0.2.1:1"
	w := httptest.NewRecorder()
	before := calls.Load()
	h.ServeHTTP(w, r)
	if calls.Load() != before || w.Code != httplimit.StatusClientClosedRequest {
		t.Errorf("client gone: handler ran %v, status %d", calls.Load() != before, w.Code)
	}
}

func TestMiddlewareConcurrencyReleasesOnPanic(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, "rules: [{ name: conc, limit: 1/m, algorithm: concurrency }]\n")
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic(http.ErrAbortHandler)
		}
		// While the handler runs, the slot is taken.
		if w2 := do(r.Context().Value(handlerKey{}).(http.Handler), "192.0.2.1:1"); w2.Code != 429 {
			t.Errorf("concurrent request: %d, want 429", w2.Code)
		}
	}))
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v", v)
			}
		}()
		send(h, http.MethodGet, "/panic", "192.0.2.1:1")
	}()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r = r.WithContext(context.WithValue(r.Context(), handlerKey{}, h))
	r.RemoteAddr = "192.0.2.1:1"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("after the panic: %d, want the slot free", w.Code)
	}
	wantHeader(t, w, "RateLimit-Policy", `"conc";q=1;w=60`)
}

type handlerKey struct{}

func TestMiddlewareStoreErrors(t *testing.T) {
	yaml := `
rules:
  - name: strict
    match: { path: /strict }
    limit: 10/m
    on_error: deny
  - name: lenient
    match: { path: /lenient }
    limit: 10/m
    on_error: allow
`
	var decisions []httplimit.Observation
	h := policy.Middleware(newPolicyOn(t, failingStore{}, yaml), httplimit.WithObserver(func(d httplimit.Observation) { decisions = append(decisions, d) }))(hello)
	w := send(h, http.MethodGet, "/strict", "192.0.2.1:1")
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("on_error deny: %d", w.Code)
	}
	if p := decodeProblem(t, w); p.Error != "unavailable" || p.Rule != "strict" {
		t.Errorf("problem %+v", p)
	}
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After on a fail-closed rejection")
	}
	w = send(h, http.MethodGet, "/lenient", "192.0.2.1:1")
	if w.Code != 200 || w.Header().Get("RateLimit") != "" {
		t.Errorf("on_error allow: %d, RateLimit %q", w.Code, w.Header().Get("RateLimit"))
	}
	if len(decisions) != 2 || !errors.Is(decisions[0].Err, errDown) || decisions[0].Allowed || !decisions[1].Allowed {
		t.Errorf("decisions %+v", decisions)
	}
}

func TestMiddlewareFunc(t *testing.T) {
	c := newClock()
	var cur atomic.Pointer[policy.Policy]
	h := policy.MiddlewareFunc(cur.Load)(hello)
	if w := do(h, "192.0.2.1:1"); w.Code != 200 || w.Header().Get("RateLimit") != "" {
		t.Errorf("no policy yet: %d", w.Code)
	}
	if w := do(policy.MiddlewareFunc(cur.Load, httplimit.WithErrorPolicy(httplimit.FailClosed))(hello), "192.0.2.1:1"); w.Code != 503 {
		t.Errorf("no policy yet, fail closed: %d", w.Code)
	}
	cur.Store(newPolicy(t, c, "rules: [{ name: one, limit: 1/m, algorithm: fixed_window }]\n"))
	do(h, "192.0.2.1:1")
	if w := do(h, "192.0.2.1:1"); w.Code != 429 {
		t.Errorf("first rule set: %d", w.Code)
	}
	cur.Store(newPolicy(t, c, "rules: [{ name: two, limit: 5/m, algorithm: fixed_window }]\n"))
	if w := do(h, "192.0.2.1:1"); w.Code != 200 || w.Header().Get("RateLimit") != `"two";r=4;t=60` {
		t.Errorf("after the swap: %d %q", w.Code, w.Header().Get("RateLimit"))
	}
}

func TestMiddlewarePanicsOnNil(t *testing.T) {
	for name, f := range map[string]func(){
		"Middleware":     func() { policy.Middleware(nil) },
		"MiddlewareFunc": func() { policy.MiddlewareFunc(nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s(nil) did not panic", name)
				}
			}()
			f()
		}()
	}
}

// BenchmarkMiddlewareAllowed measures the allowed path of Middleware with
// two matching rules, headers included.
func BenchmarkMiddlewareAllowed(b *testing.B) {
	cfg, err := policy.Parse([]byte(`
rules:
  - { name: api, match: { path: /api/ }, limit: 1000000000/s }
  - { name: all, limit: 1000000000/s, algorithm: token_bucket }
`), "weir.yaml")
	if err != nil {
		b.Fatal(err)
	}
	p, err := policy.New(cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	h := policy.Middleware(p)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r, _ := http.NewRequest(http.MethodGet, "/api/x", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	w := &discard{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		h.ServeHTTP(w, r)
	}
}

func TestStatusesOf(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, multiYAML)
	r := httptest.NewRequest(http.MethodPost, "/api/login", nil)
	r.RemoteAddr = "192.0.2.1:1"
	v := p.Check(context.Background(), r) // no X-API-Key: api is skipped
	st, limiting := policy.StatusesOf(&v)
	if len(st) != 2 || st[0].Rule != "login" || st[1].Rule != "probe" || !st[1].Shadow || limiting != 0 {
		t.Fatalf("StatusesOf = %+v, %d", st, limiting)
	}
	h := http.Header{}
	httplimit.WriteHeaders(h, st, limiting, nil)
	if got := h.Get("RateLimit-Policy"); got != `"login";q=5;w=900, "probe";q=2;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
}

// The helpers below are httplimit's test helpers, which these tests used
// when Middleware was httplimit.FromPolicy.

// clock is a settable time source for memstore.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// newClock starts at a whole number of hours since the epoch, so that
// fixed windows start with it.
func newClock() *clock { return &clock{t: time.Unix(1_699_999_200, 0)} }

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = w.Write([]byte("hello"))
})

// do sends one request from remote (an "ip:port") through h.
func do(h http.Handler, remote string, hdr ...string) *httptest.ResponseRecorder {
	return send(h, http.MethodGet, "/", remote, hdr...)
}

func wantHeader(t *testing.T, w *httptest.ResponseRecorder, name, want string) {
	t.Helper()
	if got := w.Header().Get(name); got != want {
		t.Errorf("%s = %q, want %q", name, got, want)
	}
}

func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) httplimit.Problem {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != httplimit.ProblemContentType {
		t.Fatalf("Content-Type = %q, want %q", ct, httplimit.ProblemContentType)
	}
	var p httplimit.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return p
}

// failingStore fails every call.
type failingStore struct{}

var errDown = errors.New("store down")

func (failingStore) Take(context.Context, string, weir.Limit, int64) (weir.Result, error) {
	return weir.Result{}, errDown
}
func (failingStore) Do(context.Context, []weir.Request, []weir.Result) error { return errDown }

// sleeper records the delays asked for and answers them at once.
type sleeper struct {
	mu     sync.Mutex
	delays []time.Duration
}

func (s *sleeper) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.delays = append(s.delays, d)
	s.mu.Unlock()
	return ctx.Err()
}

// discard is a ResponseWriter that keeps the headers only.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}
