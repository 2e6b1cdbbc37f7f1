package policy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
)

// countYAML is "3 failed logins per 15 minutes" under algorithm %s.
const countYAML = `
store: {timeout: 30s}
rules:
  - name: login
    match: { methods: [POST], path: /login }
    limit: 3/15m
    algorithm: %s
    count: { status: [401, 403] }
`

// countStores are the stores the count tests run on: memstore and a real
// Redis, both on the test's clock.
var countStores = []struct {
	name  string
	store func(t *testing.T, c *clock) weir.Store
}{
	{"memstore", func(t *testing.T, c *clock) weir.Store { return memstore.New(memstore.WithClock(c.Now)) }},
	{"redis", func(t *testing.T, c *clock) weir.Store { return redisOn(t, c, []string{redistest.Standalone(t).Addr}) }},
}

// burstServer serves h over HTTP/2 with TLS; its client forces HTTP/2.
func burstServer(t *testing.T, h http.Handler) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cl := srv.Client()
	cl.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	return srv, cl
}

// loginBurst sends n concurrent POST /login over HTTP/2 through the
// middleware of p to a handler answering status. The handler holds every
// request it gets until each of the n has either reached it or been
// answered without it (or more than the limit reached it), so that all of
// them are decided while the first ones are still in the handler. It
// returns how many reached the handler, and the answers by status.
func loginBurst(t *testing.T, p *policy.Policy, n, limit, status int) (int64, map[int]int) {
	t.Helper()
	var reached, refused atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	check := func() {
		if r := reached.Load(); r > int64(limit) || r+refused.Load() >= int64(n) {
			open()
		}
	}
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		check()
		<-release
		w.WriteHeader(status)
	}))
	srv, cl := burstServer(t, h)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code := 0
			resp, err := cl.Post(srv.URL+"/login", "text/plain", nil)
			if err == nil {
				code = resp.StatusCode
				if resp.ProtoMajor != 2 {
					code = -resp.ProtoMajor
				}
				resp.Body.Close()
			} else {
				t.Logf("a client call failed: %v", err) // says why in the failure's output
			}
			if code != status {
				refused.Add(1)
				check()
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	open()
	return reached.Load(), codes
}

// TestCountBurstReachesLimitOnly: 300 concurrent failing logins over HTTP/2
// under "3 failed logins per 15 minutes": exactly 3 reach the handler (the
// count rule takes before the handler), the others get 429; a sliding log
// admits exactly 3 again one period later, not the whole burst.
func TestCountBurstReachesLimitOnly(t *testing.T) {
	for _, sc := range countStores {
		for _, alg := range []string{"fixed_window", "sliding_log"} {
			t.Run(sc.name+"/"+alg, func(t *testing.T) {
				if sc.name != "memstore" && testing.Short() {
					t.Skip("Redis in -short")
				}
				clk := newClock()
				p := newPolicyOn(t, sc.store(t, clk), fmt.Sprintf(countYAML, alg))
				for round := range 2 {
					reached, codes := loginBurst(t, p, 300, 3, http.StatusUnauthorized)
					if reached != 3 || codes[http.StatusUnauthorized] != 3 || codes[http.StatusTooManyRequests] != 297 {
						t.Fatalf("round %d: %d of 300 concurrent failing logins reached the handler (answers %v), want exactly 3 (and 297 × 429)", round+1, reached, codes)
					}
					if got := remaining(t, p, "login", "127.0.0.1"); got != 0 {
						t.Fatalf("round %d: %d remaining after 3 counted failures", round+1, got)
					}
					clk.Advance(15 * time.Minute)
				}
			})
		}
	}
}

// TestCountGivesBackUncounted: under every algorithm a count rule takes,
// a response whose status is not counted gives its take back, dated: a
// request that outlives its window (or whose bucket refilled meanwhile)
// gives nothing back into the next one, so a late success cannot let a
// fourth failure through there.
func TestCountGivesBackUncounted(t *testing.T) {
	for _, sc := range countStores {
		for _, alg := range []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra", "leaky_bucket"} {
			t.Run(sc.name+"/"+alg, func(t *testing.T) {
				if sc.name != "memstore" && testing.Short() {
					t.Skip("Redis in -short")
				}
				clk := newClock()
				p := newPolicyOn(t, sc.store(t, clk), fmt.Sprintf(countYAML, alg))
				var status atomic.Int64
				status.Store(200)
				hold := make(chan struct{})
				held := make(chan struct{})
				h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("X-Hold") != "" {
						close(held)
						<-hold
					}
					w.WriteHeader(int(status.Load()))
				}))
				const addr = "192.0.2.7:1"
				for i := range 10 {
					if w := send(h, "POST", "/login", addr); w.Code != 200 {
						t.Fatalf("good login %d: %d", i+1, w.Code)
					}
				}
				if got := remaining(t, p, "login", "192.0.2.7"); got != 3 {
					t.Fatalf("after 10 good logins: %d remaining, want 3", got)
				}
				// A good login that outlives its period and the next one.
				done := make(chan int)
				go func() { done <- send(h, "POST", "/login", addr, "X-Hold", "1").Code }()
				<-held
				clk.Advance(30 * time.Minute)
				status.Store(401)
				for i := range 3 {
					if w := send(h, "POST", "/login", addr); w.Code != 401 {
						t.Fatalf("failure %d in the next period: %d", i+1, w.Code)
					}
				}
				status.Store(200)
				close(hold)
				if code := <-done; code != 200 {
					t.Fatalf("the long good login: %d", code)
				}
				status.Store(401)
				if w := send(h, "POST", "/login", addr); w.Code != 429 {
					t.Fatalf("a fourth failure in the period after a late success: %d, want 429", w.Code)
				}
			})
		}
	}
}

// blockYAML is countYAML with a penalty box.
const blockYAML = `
store: {timeout: 30s}
rules:
  - name: login
    match: { methods: [POST], path: /login }
    limit: 3/15m
    algorithm: fixed_window
    block: 1h
    count: { status: [401, 403] }
`

// TestCountBurstBoxed: a concurrent burst of failing logins is boxed (the
// requests refused while the limit is used up start the box); three
// concurrent good logins under a limit of 3 are not, and give their takes
// back.
func TestCountBurstBoxed(t *testing.T) {
	for _, sc := range countStores {
		t.Run(sc.name, func(t *testing.T) {
			if sc.name != "memstore" && testing.Short() {
				t.Skip("Redis in -short")
			}
			clk := newClock()
			p := newPolicyOn(t, sc.store(t, clk), blockYAML)
			if reached, codes := loginBurst(t, p, 3, 3, http.StatusOK); reached != 3 || codes[200] != 3 {
				t.Fatalf("3 concurrent good logins: %d reached, answers %v", reached, codes)
			}
			if got := remaining(t, p, "login", "127.0.0.1"); got != 3 {
				t.Fatalf("after 3 good logins: %d remaining, want 3 (not boxed)", got)
			}
			if reached, codes := loginBurst(t, p, 200, 3, http.StatusUnauthorized); reached != 3 || codes[429] != 197 {
				t.Fatalf("200 concurrent failing logins: %d reached, answers %v", reached, codes)
			}
			clk.Advance(15 * time.Minute) // the window is over; the box is not
			rr, err := p.CheckKey(t.Context(), policy.KeyRequest{Rule: "login", Key: "127.0.0.1", N: 0})
			if err != nil || rr.Result.Allowed || rr.Result.BlockedUntil.IsZero() {
				t.Fatalf("after the burst and its window: %+v %v, want boxed", rr.Result, err)
			}
		})
	}
}

// TestMeteredLeaseRefused: cost and count settle in the store, which a
// lease's units do not go back to: a rule with a lease refuses both.
func TestMeteredLeaseRefused(t *testing.T) {
	for _, extra := range []string{"cost: header:X-N", "count: { status: [401] }"} {
		doc := "rules:\n  - name: a\n    limit: 10/m\n    algorithm: fixed_window\n    lease: 5\n    " + extra + "\n"
		cfg, err := policy.Parse([]byte(doc), "weir.yaml")
		if err == nil {
			_, err = policy.New(cfg, nil)
		}
		if err == nil || !strings.Contains(err.Error(), "weir.yaml:5:12: lease 5 and cost or count do not combine") {
			t.Errorf("%s on a leased rule: %v", extra, err)
		}
	}
}

// TestCountGivenBackWhenLeftWhileDelayed: a request that a shaping rule
// delays and whose client leaves before it is served never reaches the
// handler: what its count rule took goes back.
func TestCountGivenBackWhenLeftWhileDelayed(t *testing.T) {
	c := newClock()
	p := newPolicy(t, c, `
rules:
  - name: shaped
    limit: 10/s
    algorithm: leaky_bucket
    burst: 4
    max_delay: 300ms
  - name: login
    match: { methods: [POST], path: /login }
    limit: 3/15m
    algorithm: fixed_window
    count: { status: [401] }
`)
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(401) }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 2 { // the second is delayed
		r := httptest.NewRequest(http.MethodPost, "/login", nil).WithContext(ctx)
		r.RemoteAddr = "192.0.2.1:1"
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	if got := remaining(t, p, "login", "192.0.2.1"); got != 2 {
		t.Fatalf("after one failure and one request that left while delayed: %d remaining, want 2", got)
	}
}
