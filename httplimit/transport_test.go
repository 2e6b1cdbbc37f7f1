package httplimit

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// fakeClock is a clock that only the Transport's sleeps move.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
	// slept records every wait.
	slept []time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	c.t = c.t.Add(d)
	return ctx.Err()
}

func fakeTransport(base http.RoundTripper) (*Transport, *fakeClock) {
	c := &fakeClock{t: time.Now()}
	tr := NewTransport(base)
	tr.now, tr.sleep = c.now, c.sleep
	return tr, c
}

// Against weir's own middleware: many goroutines share one budget, and the
// server never has to reject anything. What cannot be sent before the
// deadline fails at once with ErrPaced.
func TestTransportNeverOverrunsWeirMiddleware(t *testing.T) {
	var admitted, rejected atomic.Int64
	// The server's clock stands still, a minute into an hour: a run that
	// crossed the hour on the wall clock would open a new window (CI once
	// saw 21 admitted at 04:00).
	at := time.Date(2030, 1, 1, 10, 1, 0, 0, time.UTC)
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(func() time.Time { return at })))
	l := weir.Limit{Algorithm: weir.FixedWindow, Rate: 10, Period: time.Hour}
	h := New(lim, l, WithName("api"), WithObserver(func(d Observation) {
		if d.Allowed {
			admitted.Add(1)
		} else {
			rejected.Add(1)
		}
	}))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	client := &http.Client{Transport: NewTransport(nil)}
	var ok, paced atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 30; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 3; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
				resp, err := client.Do(req)
				cancel()
				switch {
				case err == nil:
					if resp.StatusCode != http.StatusOK {
						t.Errorf("status %d", resp.StatusCode)
					}
					resp.Body.Close()
					ok.Add(1)
				case errors.Is(err, ErrPaced) && errors.Is(err, context.DeadlineExceeded):
					paced.Add(1)
				default:
					t.Errorf("unexpected error %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 || paced.Load() != 80 {
		t.Fatalf("ok %d, paced %d; want 10 and 80", ok.Load(), paced.Load())
	}
	if admitted.Load() != 10 || rejected.Load() != 0 {
		t.Fatalf("the server admitted %d and rejected %d; want 10 and 0", admitted.Load(), rejected.Load())
	}
}

// retryAfterServer rejects the first `reject` requests with 429 and
// Retry-After only, then answers 200.
func retryAfterServer(reject int64, retryAfter string) (*httptest.Server, *atomic.Int64) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= reject {
			w.Header().Set("Retry-After", retryAfter)
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Body", string(b))
	}))
	return srv, &calls
}

func TestTransportRetriesIdempotentAfterRetryAfter(t *testing.T) {
	srv, calls := retryAfterServer(2, "7")
	defer srv.Close()
	tr, clock := fakeTransport(nil)
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("payload"))
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || calls.Load() != 3 {
		t.Fatalf("status %d after %d calls; want 200 after 3", resp.StatusCode, calls.Load())
	}
	if got := resp.Header.Get("X-Body"); got != "payload" {
		t.Fatalf("retried body %q", got)
	}
	if len(clock.slept) != 2 || clock.slept[0] != 7*time.Second || clock.slept[1] != 7*time.Second {
		t.Fatalf("waits %v; want [7s 7s]", clock.slept)
	}
}

func TestTransportDoesNotRetryPOSTButPacesNextRequest(t *testing.T) {
	srv, calls := retryAfterServer(1, "30")
	defer srv.Close()
	tr, clock := fakeTransport(nil)
	c := &http.Client{Transport: tr}
	resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || calls.Load() != 1 || len(clock.slept) != 0 {
		t.Fatalf("POST: status %d, %d calls, waits %v; want one 429 and no wait", resp.StatusCode, calls.Load(), clock.slept)
	}
	// The next request to the host waits out the Retry-After first.
	resp, err = c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || calls.Load() != 2 || len(clock.slept) != 1 || clock.slept[0] != 30*time.Second {
		t.Fatalf("GET: status %d, %d calls, waits %v; want 200, 2, [30s]", resp.StatusCode, calls.Load(), clock.slept)
	}
}

func TestTransportGivesUpAtDeadline(t *testing.T) {
	srv, calls := retryAfterServer(1, "120")
	defer srv.Close()
	tr, clock := fakeTransport(nil)
	c := &http.Client{Transport: tr}
	ctx, cancel := context.WithDeadline(context.Background(), clock.now().Add(time.Minute))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The retry would pass the deadline: the 429 is the answer, unretried.
	if resp.StatusCode != http.StatusTooManyRequests || calls.Load() != 1 || len(clock.slept) != 0 {
		t.Fatalf("status %d, %d calls, waits %v", resp.StatusCode, calls.Load(), clock.slept)
	}
	// A new request with the same deadline is not sent at all.
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if _, err := c.Do(req); !errors.Is(err, ErrPaced) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v; want ErrPaced and DeadlineExceeded", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("%d calls; the paced request must not be sent", calls.Load())
	}
}

// The RateLimit header's budget: r requests, then a wait of t seconds,
// then q from RateLimit-Policy.
func TestTransportSpendsRateLimitBudget(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		w.Header().Set("RateLimit-Policy", `"q";q=3;w=60`)
		w.Header().Set("RateLimit", `"q";r=`+strconv.FormatInt(max(3-n, 0), 10)+`;t=45`)
	}))
	defer srv.Close()
	tr, clock := fakeTransport(nil)
	c := &http.Client{Transport: tr}
	for i := 0; i < 4; i++ {
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if len(clock.slept) != 1 || clock.slept[0] != 45*time.Second {
		t.Fatalf("waits %v; want one of 45s before the fourth request", clock.slept)
	}
}

func TestTransportStateIsBounded(t *testing.T) {
	srv, _ := retryAfterServer(0, "")
	defer srv.Close()
	tr := NewTransport(nil)
	tr.MaxHosts = 2
	c := &http.Client{Transport: tr}
	for _, h := range []string{"a.test", "b.test", "c.test", "d.test"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Host = h
		req.URL.Host = strings.Replace(req.URL.Host, "127.0.0.1", h, 1)
		tr.Base = rewriteHost{srv.Listener.Addr().String()}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	tr.mu.Lock()
	n := len(tr.hosts)
	tr.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d hosts kept; want 2", n)
	}
}

// rewriteHost sends every request to addr whatever its URL says.
type rewriteHost struct{ addr string }

func (r rewriteHost) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.URL.Host = r.addr
	return http.DefaultTransport.RoundTrip(req)
}

func TestParseRateLimitItems(t *testing.T) {
	items := parseItems([]string{`"a,b";r=3;t=412, "c\"d";q=5;w=900`, `e;r=1`})
	if len(items) != 3 || items[0].name != "a,b" || items[0].params["r"] != 3 || items[0].params["t"] != 412 ||
		items[1].name != `c"d` || items[1].params["q"] != 5 || items[2].name != "e" || items[2].params["r"] != 1 {
		t.Fatalf("parsed %+v", items)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if d, ok := parseRetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now); !ok || d != 90*time.Second {
		t.Fatalf("HTTP-date Retry-After: %v %v", d, ok)
	}
	if _, ok := parseRetryAfter("-1", now); ok {
		t.Fatal("negative Retry-After accepted")
	}
}

// closeCounter is a request body that counts its Close calls.
type closeCounter struct {
	io.Reader
	closed atomic.Int32
}

func (c *closeCounter) Close() error { c.closed.Add(1); return nil }

// TestTransportClosesBodyWhenPaced: a RoundTripper closes the body it was
// given even when it never sends the request (http.Client relies on it).
func TestTransportClosesBodyWhenPaced(t *testing.T) {
	srv, _ := retryAfterServer(1, "120")
	defer srv.Close()
	tr, clock := fakeTransport(nil)
	ctx, cancel := context.WithDeadline(context.Background(), clock.now().Add(time.Minute))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	body := &closeCounter{Reader: strings.NewReader("x")}
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, body)
	if _, err := tr.RoundTrip(req); !errors.Is(err, ErrPaced) {
		t.Fatalf("err %v; want ErrPaced", err)
	}
	if body.closed.Load() == 0 {
		t.Fatal("the request body of a paced request was not closed")
	}
}

// scriptedRT answers each request with the RateLimit header the test
// hands it, when the test releases it: answers can be put in any order.
type scriptedRT struct {
	arrived chan chan string // one per request: send it the r to answer
}

func (s *scriptedRT) RoundTrip(req *http.Request) (*http.Response, error) {
	answer := make(chan string)
	s.arrived <- answer
	r := <-answer
	h := http.Header{}
	h.Set("RateLimit", `"q";r=`+r+`;t=3600`)
	return &http.Response{StatusCode: http.StatusOK, Header: h, Body: http.NoBody, Request: req}, nil
}

// Answers that arrive in another order than the server decided them lose
// no budget: once every answer is in, what the transport will send is
// exactly what the server has left.
func TestTransportBudgetExactAfterAnswersReorder(t *testing.T) {
	rt := &scriptedRT{arrived: make(chan chan string)}
	tr := NewTransport(rt)
	send := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			// A request the transport would hold for the hour fails at
			// once as paced instead.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.example/", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		return done
	}
	// The first answer says 5 are left.
	d := send()
	(<-rt.arrived) <- "5"
	if err := <-d; err != nil {
		t.Fatal(err)
	}
	// Three go out together; the server decides them 4, 3, 2 (2 left),
	// and the answers come back in the opposite order.
	var answers []chan string
	var dones []<-chan error
	for range 3 {
		dones = append(dones, send())
		answers = append(answers, <-rt.arrived)
	}
	for i, r := range []string{"2", "3", "4"} {
		answers[2-i] <- r
		if err := <-dones[2-i]; err != nil {
			t.Fatal(err)
		}
	}
	// Exactly 2 more may go: both are sent, the third is paced.
	for i, r := range []string{"1", "0"} {
		d := send()
		select {
		case a := <-rt.arrived:
			a <- r
		case err := <-d:
			t.Fatalf("request %d of the 2 left was not sent: %v", i+1, err)
		}
		if err := <-d; err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.example/", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, ErrPaced) {
		t.Fatalf("a request past the budget: %v, want ErrPaced", err)
	}
}
