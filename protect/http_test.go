package protect

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestWrapRejects: a shed request gets 503, Retry-After and the problem
// body naming the rule; a 5xx and a panic count as failures and open the
// breaker, which then answers circuit_open.
func TestWrapRejects(t *testing.T) {
	c := newClock()
	r := mustRule(t, Config{Name: "payments", Concurrency: 1, Now: c.Now,
		Breaker: &BreakerConfig{Errors: 2, MinRequests: 2, OpenFor: 30 * time.Second}})
	release := make(chan struct{})
	entered := make(chan struct{})
	var calls atomic.Int64
	h := r.Wrap(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		switch req.URL.Path {
		case "/block":
			close(entered)
			<-release
		case "/fail":
			w.WriteHeader(http.StatusBadGateway)
		case "/panic":
			panic(http.ErrAbortHandler)
		}
	}), HeaderPriority("X-Priority"))

	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/block", nil))
	}()
	<-entered
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/x", nil)
	req.Header.Set("X-Priority", "critical")
	h.ServeHTTP(rec, req)
	checkProblem(t, rec, "overloaded", "payments", "1")
	close(release)
	<-done

	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/fail", nil))
	func() {
		defer func() { _ = recover() }()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/panic", nil))
	}()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	checkProblem(t, rec, "circuit_open", "payments", "30")
	if n := calls.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3 (the shed and refused requests never reach it)", n)
	}
	if st := r.Stats(); st.InFlight != 0 || st.Failed != 2 {
		t.Fatalf("stats %+v: want nothing in flight, 2 failures (the 502 and the panic)", st)
	}
}

func checkProblem(t *testing.T, rec *httptest.ResponseRecorder, reason, rule, retry string) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", rec.Code)
	}
	if got := rec.Header().Get("Retry-After"); got != retry {
		t.Errorf("Retry-After %q, want %q", got, retry)
	}
	if ct := rec.Header().Get("Content-Type"); ct != ProblemContentType {
		t.Errorf("Content-Type %q", ct)
	}
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body["error"] != reason || body["protect"] != rule || body["status"] != float64(503) {
		t.Fatalf("body %s, want error %q protect %q", rec.Body, reason, rule)
	}
}

// TestTransport: a dependency answering 500 trips the breaker of the
// transport, whose calls then fail at once without reaching it; after
// open_for a good probe closes it.
func TestTransport(t *testing.T) {
	var hits atomic.Int64
	var failing atomic.Bool
	failing.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	c := newClock()
	r := mustRule(t, Config{Name: "upstream", Now: c.Now,
		Breaker: &BreakerConfig{ErrorRatio: 0.5, MinRequests: 4, OpenFor: 5 * time.Second}})
	client := &http.Client{Transport: &Transport{Rule: r, Base: srv.Client().Transport}}
	get := func() (*http.Response, error) {
		resp, err := client.Get(srv.URL)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	for range 4 {
		if _, err := get(); err != nil {
			t.Fatal(err)
		}
	}
	_, err := get()
	if !errors.Is(err, ErrCircuitOpen) {
		t.Fatalf("after 4 failures: %v, want ErrCircuitOpen", err)
	}
	if n := hits.Load(); n != 4 {
		t.Fatalf("dependency hit %d times, want 4", n)
	}
	failing.Store(false)
	c.Advance(5 * time.Second)
	if resp, err := get(); err != nil || resp.StatusCode != 200 {
		t.Fatalf("probe: %v", err)
	}
	if st := r.Stats(); st.State != Closed {
		t.Fatalf("after a good probe: %v", st.State)
	}
}

func TestParsePriority(t *testing.T) {
	for in, want := range map[string]Priority{
		"critical": Critical, " CRITICAL ": Critical, "sheddable": Sheddable, "normal": Normal,
		"": Normal, "urgent": Normal, "critical,critical": Normal, "0": Normal,
	} {
		if got := ParsePriority(in); got != want {
			t.Errorf("ParsePriority(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestConfigProblems(t *testing.T) {
	bad := []Config{
		{Name: "a", Concurrency: -1},
		{Name: "a", Adaptive: true, MinConcurrency: 10, MaxConcurrency: 5},
		{Name: "a", Concurrency: 5, Reserve: 1.2},
		{Name: "a", Breaker: &BreakerConfig{ErrorRatio: 1.5}},
		{Name: "a", Breaker: &BreakerConfig{Errors: 1, OpenFor: -time.Second}},
		{Name: "a", Breaker: &BreakerConfig{SlowCall: time.Second}},
		{Name: "a"},
		{Concurrency: 1},
	}
	for _, c := range bad {
		if ps := c.Problems(); len(ps) == 0 {
			t.Errorf("%+v: no problem found", c)
		}
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted it", c)
		}
	}
}
