package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

func newTestLimiter() *weir.Limiter {
	now := time.Unix(1_700_000_000, 0)
	return weir.NewLimiter(memstore.New(memstore.WithClock(func() time.Time { return now })))
}

func get(h http.Handler, path, remote string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestEcho(t *testing.T) {
	h := newServer(newTestLimiter())
	for i := 0; i < 10; i++ {
		w := get(h, "/hello", "192.0.2.1:1")
		if w.Code != 200 || strings.TrimSpace(w.Body.String()) != `{"message":"hello, world"}` {
			t.Fatalf("request %d: %d %q", i, w.Code, w.Body)
		}
		if i == 0 && w.Header().Get("RateLimit") != `"per-ip";r=9;t=1` {
			t.Errorf("RateLimit = %q", w.Header().Get("RateLimit"))
		}
	}
	w := get(h, "/hello", "192.0.2.1:1")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("11th request: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	var p httplimit.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Error != "rate_limited" || p.Rule != "per-ip" {
		t.Errorf("body %q: %+v %v", w.Body, p, err)
	}
	if w := get(h, "/hello", "192.0.2.2:1"); w.Code != 200 {
		t.Errorf("another client: %d", w.Code)
	}
}

// A rejected request never reaches the handler, and a panicking handler
// still releases its concurrency lease.
func TestEchoAdapter(t *testing.T) {
	lim := newTestLimiter()
	one := weir.Limit{Algorithm: weir.Concurrency, Rate: 1, Period: time.Minute}
	e := echo.New()
	e.Use(middleware.Recover())
	e.Use(echo.WrapMiddleware(httplimit.New(lim, one)))
	e.GET("/panic", func(c *echo.Context) error { panic("boom") })
	e.GET("/ok", func(c *echo.Context) error { return c.String(http.StatusOK, "ok") })
	if w := get(e, "/panic", "192.0.2.1:1"); w.Code != http.StatusInternalServerError {
		t.Fatalf("panic: %d", w.Code)
	}
	if w := get(e, "/ok", "192.0.2.1:1"); w.Code != 200 || w.Body.String() != "ok" {
		t.Fatalf("after the panic: %d %q, want the slot released", w.Code, w.Body)
	}

	reached := false
	e2 := echo.New()
	e2.Use(echo.WrapMiddleware(httplimit.New(lim, weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute})))
	e2.GET("/", func(c *echo.Context) error { reached = true; return nil })
	get(e2, "/", "192.0.2.9:1")
	reached = false
	if w := get(e2, "/", "192.0.2.9:1"); w.Code != 429 || reached {
		t.Errorf("rejected request: %d, reached handler %v", w.Code, reached)
	}
}
