package policy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/store/redisstore"
)

const costYAML = `
rules:
  - name: llm
    match: { path: /v1/chat }
    identity: [header:Authorization]
    limit: 1000/m
    algorithm: token_bucket
    cost: header:X-Max-Tokens
  - name: rows
    match: { path: /v1/query }
    identity: [header:Authorization]
    limit: 100/m
    algorithm: fixed_window
    cost: query:limit
  - name: login
    match: { path: /login }
    limit: 3/15m
    algorithm: fixed_window
    count: { status: [401, 403] }
`

// remaining peeks at a rule's key through CheckKeyTier.
func remaining(t *testing.T, p *policy.Policy, rule, key string) int64 {
	t.Helper()
	rr, err := p.CheckKey(context.Background(), policy.KeyRequest{Rule: rule, Key: key, N: 0})
	if err != nil {
		t.Fatal(err)
	}
	return rr.Result.Remaining
}

// TestCostSettlesWithCharge: the estimate a header names is taken before
// the handler; the real cost the handler charges is settled after it, up
// (debit, into debt) or down (refund).
func TestCostSettlesWithCharge(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, costYAML)
	if rs := p.Rules(); rs[0].Cost != "header:X-Max-Tokens" || len(rs[2].CountStatus) != 2 {
		t.Fatalf("GET /v1/rules would not show cost and count: %+v", rs)
	}
	var charge int64
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if charge >= 0 && !httplimit.Charge(r, charge) {
			t.Error("Charge found no meter under a cost rule")
		}
	}))
	charge = 120
	w := send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "500")
	if w.Code != 200 || !strings.Contains(w.Header().Get("RateLimit"), "r=500") {
		t.Fatalf("first call: %d %v", w.Code, w.Header())
	}
	if got := remaining(t, p, "llm", "k1"); got != 880 {
		t.Fatalf("after a 500 estimate settled at 120: %d remaining, want 880", got)
	}
	// Uncharged: the estimate stays.
	charge = -1
	send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "300")
	if got := remaining(t, p, "llm", "k1"); got != 580 {
		t.Fatalf("an uncharged request: %d remaining, want 580", got)
	}
	// Over the estimate: billed in full, into debt; the next request is 429.
	charge = 1000
	send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "100")
	if w := send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "1"); w.Code != 429 || w.Header().Get("Retry-After") == "" {
		t.Fatalf("a key in debt: %d %v", w.Code, w.Header())
	}
	// A query-parameter cost.
	charge = 7
	send(h, "GET", "/v1/query?limit=50", "192.0.2.1:1", "Authorization", "k1")
	if got := remaining(t, p, "rows", "k1"); got != 93 {
		t.Fatalf("rows: %d remaining, want 93", got)
	}
}

// TestCostBadInput: a cost the request cannot carry is a 400 naming it,
// and nothing is counted.
func TestCostBadInput(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, costYAML)
	called := false
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called = true }))
	for _, v := range []string{"abc", "-5", "1001", "2.5", "99999999999999999999"} {
		w := send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k2", "X-Max-Tokens", v)
		if w.Code != 400 || !strings.Contains(w.Body.String(), "X-Max-Tokens") || called {
			t.Fatalf("X-Max-Tokens %q: %d %s (handler called %v)", v, w.Code, w.Body, called)
		}
	}
	if got := remaining(t, p, "llm", "k2"); got != 1000 {
		t.Fatalf("bad input counted: %d remaining", got)
	}
}

// TestCostStreamClientGone: a streaming handler charges as it goes; the
// client goes away mid-stream; what was charged is still settled.
func TestCostStreamClientGone(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, costYAML)
	gone := make(chan struct{})
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := int64(1); ; i++ {
			if _, err := w.Write([]byte("data: chunk\n\n")); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
			httplimit.Charge(r, 10*i)
			if i == 5 {
				close(gone) // the client hangs up after 50 tokens
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-gone; cancel() }()
	r := httptest.NewRequest("POST", "/v1/chat", nil).WithContext(ctx)
	r.RemoteAddr = "192.0.2.1:1"
	r.Header.Set("Authorization", "k3")
	r.Header.Set("X-Max-Tokens", "200")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if !w.Flushed {
		t.Fatal("the stream was not flushed through the middleware")
	}
	// 50 or 60 tokens, as the cancel races the next chunk; never 200.
	if got := remaining(t, p, "llm", "k3"); got != 950 && got != 940 {
		t.Fatalf("after a stream cut at 50 tokens: %d remaining, want 950 (or 940)", got)
	}
}

// TestCountOnlyStatuses: "5 failed logins per 15 minutes" counts only the
// failures, and a key at its limit is refused before the handler runs.
func TestCountOnlyStatuses(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, costYAML)
	status, calls := 200, 0
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(status)
	}))
	for range 10 {
		if w := send(h, "POST", "/login", "192.0.2.9:1"); w.Code != 200 {
			t.Fatalf("a good login was refused: %d", w.Code)
		}
	}
	status = 401
	for i := range 3 {
		if w := send(h, "POST", "/login", "192.0.2.9:1"); w.Code != 401 {
			t.Fatalf("failed login %d: %d", i+1, w.Code)
		}
	}
	calls = 0
	if w := send(h, "POST", "/login", "192.0.2.9:1"); w.Code != 429 || calls != 0 {
		t.Fatalf("after 3 failures: %d, handler calls %d; want 429 before the handler", w.Code, calls)
	}
	// Another client is not affected; a 500 does not count.
	status = 500
	for range 5 {
		send(h, "POST", "/login", "192.0.2.10:1")
	}
	if w := send(h, "POST", "/login", "192.0.2.10:1"); w.Code != 500 {
		t.Fatalf("uncounted statuses counted: %d", w.Code)
	}
	c.Advance(15 * time.Minute)
	if w := send(h, "POST", "/login", "192.0.2.9:1"); w.Code != 500 {
		t.Fatalf("the window did not reopen: %d", w.Code)
	}
}

func TestCostConfigErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"rules:\n  - name: a\n    limit: 5/m\n    algorithm: concurrency\n    cost: header:X-N\n", "weir.yaml:5:11: cost and count settle after the handler with debits and refunds, which concurrency does not support"},
		{"rules:\n  - name: a\n    limit: 5/m\n    cost: lots\n", `weir.yaml:4:11: cost "lots" is neither a whole number nor header:NAME or query:NAME`},
		{"rules:\n  - name: a\n    limit: 5/m\n    cost: 6\n", `weir.yaml:4:11: cost 6 is more than tier "default" can ever admit (5)`},
		{"rules:\n  - name: a\n    limit: 5/m\n    count: { status: [401, 99] }\n", "weir.yaml:4:28: status must be at least 100, got 99"},
		{"rules:\n  - name: a\n    limit: 5/m\n    count: { status: [] }\n", "weir.yaml:4:22: count needs a status list of 1 to 32"},
	} {
		cfg, err := policy.Parse([]byte(c.yaml), "weir.yaml")
		if err == nil {
			_, err = policy.New(cfg, nil)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant %q", c.yaml, err, c.want)
		}
	}
}

// TestProtectRefusalRefundsCost: a request that the rate limit admits,
// charging its estimate, and that overload protection then refuses is
// never served, so its estimate goes back.
func TestProtectRefusalRefundsCost(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, costYAML+`
protect:
  - name: chat
    match: { path: /v1/chat }
    concurrency: 1
`)
	hold, entered := make(chan struct{}), make(chan struct{})
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			close(entered)
			<-hold
		}
		httplimit.Charge(r, 100)
	}))
	done := make(chan int)
	go func() {
		w := send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "200", "X-Hold", "1")
		done <- w.Code
	}()
	<-entered
	// 200 reserved by the request in flight.
	if got := remaining(t, p, "llm", "k1"); got != 800 {
		t.Fatalf("with one request in flight: %d remaining, want 800", got)
	}
	if w := send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "500"); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("over the protect rule's concurrency: %d, want 503", w.Code)
	}
	if got := remaining(t, p, "llm", "k1"); got != 800 {
		t.Fatalf("after a refused request: %d remaining, want 800 (its estimate of 500 refunded)", got)
	}
	close(hold)
	if code := <-done; code != 200 {
		t.Fatalf("the request held: %d", code)
	}
	if got := remaining(t, p, "llm", "k1"); got != 900 {
		t.Fatalf("after the held request charged 100: %d remaining, want 900", got)
	}
}

// TestCostSettlesLate: a cost rule's refund goes by the take's time.
// rows is a fixed window of 100 a minute: 100 taken at 0:59,
// others take 100 at 1:01 while the handler runs, the handler charges 0:
// nothing comes back, so the window admits 100, not 200.
func TestCostSettlesLate(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, costYAML)
	c.Advance(59 * time.Second)
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.Advance(2 * time.Second)
		if rr, err := p.CheckKey(r.Context(), policy.KeyRequest{Rule: "rows", Key: "k1", N: 100}); err != nil || !rr.Result.Allowed {
			t.Errorf("others in the next window: %+v %v", rr, err)
		}
		httplimit.Charge(r, 0)
	}))
	if w := send(h, "GET", "/v1/query?limit=100", "192.0.2.1:1", "Authorization", "k1"); w.Code != 200 {
		t.Fatalf("the request: %d", w.Code)
	}
	if got := remaining(t, p, "rows", "k1"); got != 0 {
		t.Fatalf("a late settle gave back %d in the next window, want 0", got)
	}
}

// costBesideYAML is the LLM gateway's common policy: requests and tokens
// per minute per key, one all-or-nothing batch per request.
const costBesideYAML = `
rules:
  - name: requests
    match: { path: /v1/chat }
    identity: [header:Authorization]
    limit: 60/m
    algorithm: gcra
  - name: tokens
    match: { path: /v1/chat }
    identity: [header:Authorization]
    limit: 10/m
    algorithm: fixed_window
    cost: header:X-Max-Tokens
`

// TestCostBesideOtherRulesSettlesLate: a cost rule decided together with
// another rule (one batch, weir.StampAllStore) refunds by its take's time
// too. tokens is a fixed window of 10 a minute: 10 reserved at
// 0:59 beside a request of the requests rule, others take 10 at 1:01
// while the handler runs, the handler charges 0: nothing comes back, so
// the window admits 10, not 20. On memstore, Redis, and a Redis Cluster
// (the two rules' keys in two slots).
func TestCostBesideOtherRulesSettlesLate(t *testing.T) {
	for _, c := range []struct {
		name  string
		store func(t *testing.T, c *clock) weir.Store
	}{
		{"memstore", func(t *testing.T, c *clock) weir.Store { return memstore.New(memstore.WithClock(c.Now)) }},
		{"redis", func(t *testing.T, c *clock) weir.Store {
			return redisOn(t, c, []string{redistest.Standalone(t).Addr})
		}},
		{"cluster", func(t *testing.T, c *clock) weir.Store { return redisOn(t, c, redistest.Cluster(t).Addrs) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name != "memstore" && testing.Short() {
				t.Skip("Redis in -short")
			}
			clk := newClock()
			p := newPolicyOn(t, c.store(t, clk), costBesideYAML)
			clk.Advance(59 * time.Second)
			h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := remaining(t, p, "requests", "k1"); got != 59 {
					t.Errorf("the requests rule: %d remaining, want 59 (decided in the batch)", got)
				}
				clk.Advance(2 * time.Second)
				if rr, err := p.CheckKey(r.Context(), policy.KeyRequest{Rule: "tokens", Key: "k1", N: 10}); err != nil || !rr.Result.Allowed {
					t.Errorf("others in the next window: %+v %v", rr, err)
				}
				httplimit.Charge(r, 0)
			}))
			if w := send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "10"); w.Code != 200 {
				t.Fatalf("the request: %d", w.Code)
			}
			if got := remaining(t, p, "tokens", "k1"); got != 0 {
				t.Fatalf("a late settle gave back %d in the next window, want 0", got)
			}
			// On time: the refund is exact.
			clk.Advance(time.Minute)
			h = policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { httplimit.Charge(r, 3) }))
			send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "10")
			if got := remaining(t, p, "tokens", "k1"); got != 7 {
				t.Fatalf("an immediate settle of 3 of 10: %d remaining, want 7", got)
			}
		})
	}
}

// redisOn is a redisstore on addrs with c's clock, closed when t ends.
func redisOn(t *testing.T, c *clock, addrs []string) weir.Store {
	t.Helper()
	s, err := redisstore.New(context.Background(), redisstore.Config{Addrs: addrs, Clock: c.Now, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// batchCounter is a store wrapper of the user's own: it counts TakeAll
// batches of several requests and does not date them (no
// weir.StampAllStore).
type batchCounter struct {
	weir.Store
	batches int
}

func (b *batchCounter) Do(ctx context.Context, reqs []weir.Request, results []weir.Result) error {
	if len(reqs) > 1 {
		b.batches++
	}
	return b.Store.Do(ctx, reqs, results)
}

func (b *batchCounter) Unwrap() weir.Store { return b.Store }

// TestCostBesideKeepsUserWrapper: the dated batch of a cost rule beside
// other rules never reaches past a wrapper of the user's own that dates
// nothing to the memstore beneath it: the wrapper decides the batch, and
// the settlement's refund goes into the state as it is.
func TestCostBesideKeepsUserWrapper(t *testing.T) {
	clk := newClock()
	bc := &batchCounter{Store: memstore.New(memstore.WithClock(clk.Now))}
	p := newPolicyOn(t, bc, costBesideYAML)
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { httplimit.Charge(r, 3) }))
	if w := send(h, "POST", "/v1/chat", "192.0.2.1:1", "Authorization", "k1", "X-Max-Tokens", "10"); w.Code != 200 {
		t.Fatalf("the request: %d", w.Code)
	}
	if bc.batches != 1 {
		t.Fatalf("the user's wrapper decided %d batches, want 1", bc.batches)
	}
	if got := remaining(t, p, "tokens", "k1"); got != 7 {
		t.Fatalf("a settle of 3 of 10: %d remaining, want 7", got)
	}
}
