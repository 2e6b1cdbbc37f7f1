package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

type app struct {
	t     *testing.T
	clock *storetest.Clock
	h     http.Handler
}

func newApp(t *testing.T) *app {
	clock := storetest.NewClock(storetest.Epoch)
	p, err := newPolicy(memstore.New(memstore.WithClock(clock.Now)))
	if err != nil {
		t.Fatal(err)
	}
	return &app{t: t, clock: clock, h: newHandler(p)}
}

// login posts the form from ip and returns the response.
func (a *app) login(ip, user, password string) *httptest.ResponseRecorder {
	form := url.Values{"username": {user}, "password": {password}}
	r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Accept", "application/json")
	r.RemoteAddr = ip + ":5555"
	w := httptest.NewRecorder()
	a.h.ServeHTTP(w, r)
	return w
}

func problem(t *testing.T, w *httptest.ResponseRecorder) httplimit.Problem {
	t.Helper()
	var p httplimit.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return p
}

func TestPage(t *testing.T) {
	a := newApp(t)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	a.h.ServeHTTP(w, r)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `<form id="f" method="post" action="/login">`) ||
		!strings.Contains(w.Body.String(), "body.blocked_until") {
		t.Errorf("GET /: %d\n%s", w.Code, w.Body)
	}
	if w.Header().Get("RateLimit") != "" {
		t.Error("the page itself is rate limited")
	}
}

func TestPerAccount(t *testing.T) {
	a := newApp(t)
	// Five wrong passwords for alice, each from a different IP.
	for i := 0; i < 5; i++ {
		w := a.login("198.51.100."+string(rune('1'+i)), "alice", "guess")
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d %s", i, w.Code, w.Body)
		}
		a.clock.Advance(time.Second)
	}
	// The sixth, even with the right password from a fresh IP, is refused.
	w := a.login("198.51.100.9", "Alice ", "wonderland")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th attempt: %d %s", w.Code, w.Body)
	}
	p := problem(t, w)
	until := a.clock.Now().Add(15 * time.Minute)
	if p.Rule != "login-account" || p.Error != "rate_limited" || p.BlockedUntil != until.UnixMilli() || p.RetryAfterMS != 900_000 {
		t.Errorf("problem %+v, want login-account blocked until %d", p, until.UnixMilli())
	}
	if got := w.Header().Get("Retry-After"); got != "900" {
		t.Errorf("Retry-After %q", got)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"login-ip";q=5;w=900, "login-account";q=5;w=900` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	// bob is not affected; alice is, until the box ends.
	if w := a.login("198.51.100.9", "bob", "builder"); w.Code != 200 {
		t.Errorf("bob: %d", w.Code)
	}
	a.clock.Advance(15*time.Minute - time.Second)
	if w := a.login("198.51.100.10", "alice", "wonderland"); w.Code != 429 {
		t.Errorf("alice just before the end of the box: %d", w.Code)
	}
	a.clock.Advance(time.Second)
	if w := a.login("198.51.100.10", "alice", "wonderland"); w.Code != 200 || !strings.Contains(w.Body.String(), `"user":"alice"`) {
		t.Errorf("alice after the box: %d %s", w.Code, w.Body)
	}
}

func TestPerIP(t *testing.T) {
	a := newApp(t)
	// One IP tries five accounts...
	for _, user := range []string{"u1", "u2", "u3", "u4", "u5"} {
		if w := a.login("203.0.113.7", user, "x"); w.Code != http.StatusUnauthorized {
			t.Fatalf("%s: %d", user, w.Code)
		}
	}
	// ...and is boxed, whatever account it tries next.
	w := a.login("203.0.113.7", "bob", "builder")
	if w.Code != 429 {
		t.Fatalf("6th attempt from the IP: %d", w.Code)
	}
	if p := problem(t, w); p.Rule != "login-ip" || p.BlockedUntil != a.clock.Now().Add(15*time.Minute).UnixMilli() {
		t.Errorf("problem %+v", p)
	}
	// A browser posting the form without scripts gets a page with the countdown.
	form := url.Values{"username": {"bob"}, "password": {"builder"}}
	r := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Accept", "text/html,*/*;q=0.8")
	r.RemoteAddr = "203.0.113.7:5555"
	rec := httptest.NewRecorder()
	a.h.ServeHTTP(rec, r)
	if rec.Code != 429 || !strings.Contains(rec.Body.String(), `<strong id="s">900</strong>`) {
		t.Errorf("HTML rejection: %d\n%s", rec.Code, rec.Body)
	}
}

func TestSuccessClearsAccount(t *testing.T) {
	a := newApp(t)
	for i := 0; i < 4; i++ {
		a.login("198.51.100.1", "alice", "guess")
	}
	if w := a.login("198.51.100.2", "alice", "wonderland"); w.Code != 200 {
		t.Fatalf("sign-in: %d", w.Code)
	}
	// The four failures are forgiven: five more attempts before the box.
	for i := 0; i < 5; i++ {
		if w := a.login("198.51.100.3", "alice", "guess"); w.Code != http.StatusUnauthorized {
			t.Fatalf("attempt %d after the sign-in: %d", i, w.Code)
		}
	}
	if w := a.login("198.51.100.4", "alice", "guess"); w.Code != 429 {
		t.Errorf("6th attempt: %d", w.Code)
	}
}
