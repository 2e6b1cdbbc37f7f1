package httplimit

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
	"github.com/weir-dev/weir/store/memstore"
)

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

func newLimiter(c *clock) *weir.Limiter {
	return weir.NewLimiter(memstore.New(memstore.WithClock(c.Now)))
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = w.Write([]byte("hello"))
})

// do sends one request from remote (an "ip:port") through h.
func do(h http.Handler, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func wantHeader(t *testing.T, w *httptest.ResponseRecorder, name, want string) {
	t.Helper()
	if got := w.Header().Get(name); got != want {
		t.Errorf("%s = %q, want %q", name, got, want)
	}
}

func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) Problem {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != ProblemContentType {
		t.Fatalf("Content-Type = %q, want %q", ct, ProblemContentType)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return p
}

var login = weir.Limit{Algorithm: weir.SlidingLog, Rate: 5, Period: 15 * time.Minute}

func TestNewHeadersAndRejection(t *testing.T) {
	c := newClock()
	h := New(newLimiter(c), login, WithName("login"))(hello)
	for i := 1; i <= 5; i++ {
		w := do(h, "192.0.2.1:1234")
		if w.Code != http.StatusOK || w.Body.String() != "hello" {
			t.Fatalf("request %d: %d %q", i, w.Code, w.Body)
		}
		wantHeader(t, w, "RateLimit-Policy", `"login";q=5;w=900`)
		wantHeader(t, w, "RateLimit", `"login";r=`+string(rune('0'+5-i))+`;t=900`)
		wantHeader(t, w, "Retry-After", "")
		wantHeader(t, w, "X-RateLimit-Limit", "")
		c.Advance(time.Second)
	}
	// The first request leaves the log 900 s after it was made: 895 s from now.
	w := do(h, "192.0.2.1:1234")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request: status %d, want 429", w.Code)
	}
	wantHeader(t, w, "RateLimit-Policy", `"login";q=5;w=900`)
	wantHeader(t, w, "RateLimit", `"login";r=0;t=899`) // the log is empty when the 5th entry expires
	wantHeader(t, w, "Retry-After", "895")
	wantHeader(t, w, "Cache-Control", "no-store")
	p := decodeProblem(t, w)
	want := Problem{Type: "about:blank", Title: "Too Many Requests", Status: 429,
		Detail: `Rate limit "login" exceeded; retry in 895 s.`, Error: "rate_limited",
		Rule: "login", RetryAfterMS: 895_000, BlockedUntil: 0}
	if p != want {
		t.Errorf("problem = %+v\nwant      %+v", p, want)
	}
	if !strings.Contains(w.Body.String(), `"blocked_until":0`) {
		t.Errorf("body %s lacks blocked_until 0", w.Body)
	}
	// Another client is not affected.
	if w := do(h, "192.0.2.2:1234"); w.Code != http.StatusOK {
		t.Errorf("other client: %d", w.Code)
	}
}

func TestNewRetryAfterRoundsUp(t *testing.T) {
	c := newClock()
	h := New(newLimiter(c), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: 10 * time.Second})(hello)
	c.Advance(2500 * time.Millisecond) // 7.5 s left in the window
	do(h, "192.0.2.1:1")
	w := do(h, "192.0.2.1:1")
	if w.Code != 429 {
		t.Fatalf("status %d", w.Code)
	}
	wantHeader(t, w, "Retry-After", "8")
	wantHeader(t, w, "RateLimit", `"default";r=0;t=8`)
	if p := decodeProblem(t, w); p.RetryAfterMS != 7500 || p.Rule != "default" {
		t.Errorf("problem %+v", p)
	}
}

func TestNewPenaltyBox(t *testing.T) {
	c := newClock()
	l := login
	l.Block = 15 * time.Minute
	h := New(newLimiter(c), l, WithName("login"))(hello)
	for i := 0; i < 5; i++ {
		do(h, "192.0.2.1:1")
	}
	w := do(h, "192.0.2.1:1")
	p := decodeProblem(t, w)
	until := c.Now().Add(15 * time.Minute)
	if p.BlockedUntil != until.UnixMilli() || p.RetryAfterMS != 900_000 {
		t.Errorf("problem %+v, want blocked_until %d", p, until.UnixMilli())
	}
	if want := "Rate limit \"login\" exceeded; blocked until " + until.UTC().Format(time.RFC3339) + "."; p.Detail != want {
		t.Errorf("detail %q, want %q", p.Detail, want)
	}
	wantHeader(t, w, "Retry-After", "900")
	c.Advance(10 * time.Minute) // the log has room again, but the box holds
	w = do(h, "192.0.2.1:1")
	if w.Code != 429 {
		t.Fatalf("inside the penalty box: %d", w.Code)
	}
	wantHeader(t, w, "Retry-After", "300")
	wantHeader(t, w, "RateLimit", `"login";r=0;t=300`)
	c.Advance(5 * time.Minute)
	if w := do(h, "192.0.2.1:1"); w.Code != 200 {
		t.Errorf("after the penalty box: %d", w.Code)
	}
}

func TestNewLegacyHeaders(t *testing.T) {
	c := newClock()
	h := New(newLimiter(c), weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute, Burst: 20},
		WithLegacyHeaders(true), WithName("api"))(hello)
	w := do(h, "192.0.2.1:1")
	wantHeader(t, w, "RateLimit-Policy", `"api";q=10;w=60`)
	wantHeader(t, w, "RateLimit", `"api";r=19;t=6`)
	wantHeader(t, w, "X-RateLimit-Limit", "20")
	wantHeader(t, w, "X-RateLimit-Remaining", "19")
	wantHeader(t, w, "X-RateLimit-Reset", "6")
}

func TestNewHTMLNegotiation(t *testing.T) {
	c := newClock()
	h := New(newLimiter(c), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute}, WithName("<x>"))(hello)
	do(h, "192.0.2.1:1")
	browser := "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
	w := do(h, "192.0.2.1:1", "Accept", browser)
	if w.Code != 429 {
		t.Fatalf("status %d", w.Code)
	}
	wantHeader(t, w, "Content-Type", "text/html; charset=utf-8")
	body := w.Body.String()
	for _, s := range []string{"<title>429 Too Many Requests</title>", `<strong id="s">60</strong> seconds`, "&#34;&lt;x&gt;&#34;"} {
		if !strings.Contains(body, s) {
			t.Errorf("HTML lacks %q:\n%s", s, body)
		}
	}
	if strings.Contains(body, "<x>") {
		t.Errorf("rule name not escaped:\n%s", body)
	}
	for _, accept := range []string{"", "*/*", "application/json", "text/html;q=0.5, application/json", "text/html;q=0"} {
		w := do(h, "192.0.2.1:1", "Accept", accept)
		if ct := w.Header().Get("Content-Type"); ct != ProblemContentType {
			t.Errorf("Accept %q: Content-Type %q", accept, ct)
		}
	}
}

// failingStore fails every call.
type failingStore struct{}

var errDown = errors.New("store down")

func (failingStore) Take(context.Context, string, weir.Limit, int64) (weir.Result, error) {
	return weir.Result{}, errDown
}
func (failingStore) Do(context.Context, []weir.Request, []weir.Result) error { return errDown }

func TestNewStoreErrors(t *testing.T) {
	lim := weir.NewLimiter(failingStore{})
	var got []Observation
	obs := WithObserver(func(d Observation) { got = append(got, d) })
	w := do(New(lim, login, obs)(hello), "192.0.2.1:1")
	if w.Code != 200 || w.Body.String() != "hello" {
		t.Errorf("fail open: %d %q", w.Code, w.Body)
	}
	wantHeader(t, w, "RateLimit", "")
	if len(got) != 1 || !errors.Is(got[0].Err, errDown) || got[0].Allowed {
		t.Errorf("decisions %+v", got)
	}
	w = do(New(lim, login, WithErrorPolicy(FailClosed))(hello), "192.0.2.1:1")
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("fail closed: %d", w.Code)
	}
	if p := decodeProblem(t, w); p.Error != "unavailable" || p.Status != 503 {
		t.Errorf("problem %+v", p)
	}
}

func TestNewKeyFunc(t *testing.T) {
	c := newClock()
	errNoUser := errors.New("no user")
	key := WithKey(func(r *http.Request) (string, error) {
		switch u := r.Header.Get("X-User"); u {
		case "":
			return "", errNoUser
		case "admin":
			return "", ErrNoLimit
		default:
			return u, nil
		}
	})
	var got []Observation
	h := New(newLimiter(c), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute}, key,
		WithObserver(func(d Observation) { got = append(got, d) }))(hello)
	if w := do(h, "192.0.2.1:1", "X-User", "ann"); w.Code != 200 {
		t.Errorf("ann: %d", w.Code)
	}
	if w := do(h, "192.0.2.2:1", "X-User", "ann"); w.Code != 429 {
		t.Errorf("ann from another IP: %d, want 429", w.Code)
	}
	if w := do(h, "192.0.2.1:1", "X-User", "bob"); w.Code != 200 {
		t.Errorf("bob: %d", w.Code)
	}
	for i := 0; i < 3; i++ {
		if w := do(h, "192.0.2.1:1", "X-User", "admin"); w.Code != 200 {
			t.Errorf("admin: %d", w.Code)
		}
	}
	w := do(h, "192.0.2.1:1")
	if w.Code != 400 {
		t.Fatalf("no user: %d", w.Code)
	}
	if p := decodeProblem(t, w); p.Error != "bad_request" {
		t.Errorf("problem %+v", p)
	}
	if len(got) != 4 || got[0].Key != "ann" || !got[0].Allowed || got[1].Allowed || !errors.Is(got[3].Err, errNoUser) {
		t.Errorf("decisions %+v", got)
	}
}

func TestNewShadow(t *testing.T) {
	c := newClock()
	var got []Observation
	h := New(newLimiter(c), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute},
		WithShadow(true), WithObserver(func(d Observation) { got = append(got, d) }))(hello)
	do(h, "192.0.2.1:1")
	w := do(h, "192.0.2.1:1")
	if w.Code != 200 || w.Body.String() != "hello" {
		t.Fatalf("shadow rejected: %d", w.Code)
	}
	wantHeader(t, w, "RateLimit-Policy", `"default";q=1;w=60`)
	wantHeader(t, w, "RateLimit", `"default";r=0;t=60`)
	wantHeader(t, w, "Retry-After", "")
	if len(got) != 2 || !got[0].Allowed || got[1].Allowed || !got[1].Shadow {
		t.Errorf("decisions %+v", got)
	}
}

func TestNewOnRejected(t *testing.T) {
	c := newClock()
	h := New(newLimiter(c), weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute},
		OnRejected(func(w http.ResponseWriter, r *http.Request, rej Rejection) {
			if w.Header().Get("Retry-After") != "60" {
				t.Errorf("headers not set before OnRejected: %v", w.Header())
			}
			w.WriteHeader(http.StatusTeapot)
			_, _ = w.Write([]byte(rej.Rule))
		}))(hello)
	do(h, "192.0.2.1:1")
	if w := do(h, "192.0.2.1:1"); w.Code != http.StatusTeapot || w.Body.String() != "default" {
		t.Errorf("custom rejection: %d %q", w.Code, w.Body)
	}
}

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

func TestNewShaping(t *testing.T) {
	c := newClock()
	// 10/s, up to 3 queued: nginx's "rate=10r/s burst=3".
	shape := weir.Limit{Algorithm: weir.LeakyBucket, Rate: 10, Period: time.Second, Burst: 4, MaxDelay: 300 * time.Millisecond}
	var s sleeper
	var calls atomic.Int32
	h := New(newLimiter(c), shape, WithSleep(s.sleep))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
	}))
	for i := 0; i < 4; i++ {
		if w := do(h, "192.0.2.1:1"); w.Code != 200 {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	if len(s.delays) != len(want) {
		t.Fatalf("delays %v, want %v", s.delays, want)
	}
	for i := range want {
		if s.delays[i] != want[i] {
			t.Errorf("delays %v, want %v", s.delays, want)
		}
	}
	if calls.Load() != 4 {
		t.Errorf("handler ran %d times, want 4", calls.Load())
	}
	if w := do(h, "192.0.2.1:1"); w.Code != 429 {
		t.Errorf("beyond the burst: %d, want 429", w.Code)
	}

	// A client that goes away while it waits never reaches the handler.
	c.Advance(time.Second)
	do(h, "192.0.2.1:1") // empties the queue: this one passes at once
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)
	r.RemoteAddr = "192.0.2.1:1"
	w := httptest.NewRecorder()
	before := calls.Load()
	h.ServeHTTP(w, r)
	if calls.Load() != before {
		t.Error("handler ran for a client that went away")
	}
	if w.Code != StatusClientClosedRequest {
		t.Errorf("status %d, want %d", w.Code, StatusClientClosedRequest)
	}
}

func TestNewConcurrencyReleasesOnPanic(t *testing.T) {
	c := newClock()
	one := weir.Limit{Algorithm: weir.Concurrency, Rate: 1, Period: time.Minute}
	hold := make(chan struct{})
	inside := make(chan struct{})
	h := New(newLimiter(c), one)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/panic":
			panic("handler failed")
		case "/hold":
			close(inside)
			<-hold
		}
	}))
	req := func(path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.RemoteAddr = "192.0.2.1:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	// While one request holds the slot, a second is rejected.
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- req("/hold") }()
	<-inside
	w := req("/")
	if w.Code != 429 {
		t.Fatalf("second concurrent request: %d, want 429", w.Code)
	}
	wantHeader(t, w, "RateLimit", `"default";r=0;t=60`)
	close(hold)
	if w := <-done; w.Code != 200 {
		t.Fatalf("holder: %d", w.Code)
	}

	// A panicking handler still gives its slot back, and the panic goes on.
	func() {
		defer func() {
			if v := recover(); v != "handler failed" {
				t.Errorf("recovered %v, want the handler's panic", v)
			}
		}()
		req("/panic")
	}()
	if w := req("/"); w.Code != 200 {
		t.Errorf("after the panic the slot is still held: %d", w.Code)
	}
}

func TestNewPanicsOnBadInput(t *testing.T) {
	for name, f := range map[string]func(){
		"nil limiter": func() { New(nil, login) },
		"bad limit":   func() { New(newLimiter(newClock()), weir.Limit{Algorithm: "nope", Rate: 1, Period: time.Second}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestProblemOf(t *testing.T) {
	if p := ProblemOf(Rejection{Rule: "r", RetryAfter: 1500 * time.Microsecond}); p.Status != 429 || p.RetryAfterMS != 2 ||
		p.Detail != `Rate limit "r" exceeded; retry in 1 s.` {
		t.Errorf("zero status: %+v", p)
	}
	if p := ProblemOf(Rejection{Status: http.StatusPaymentRequired}); p.Error != "payment_required" || p.Title != "Payment Required" {
		t.Errorf("other status: %+v", p)
	}
}
