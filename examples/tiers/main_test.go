package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

func newApp(t *testing.T) (http.Handler, *storetest.Clock) {
	clock := storetest.NewClock(storetest.Epoch)
	p, err := newPolicy(memstore.New(memstore.WithClock(clock.Now)))
	if err != nil {
		t.Fatal(err)
	}
	return newHandler(p), clock
}

func get(h http.Handler, key string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/api/items", nil)
	r.RemoteAddr = "192.0.2.1:1"
	if key != "" {
		r.Header.Set("X-API-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// admitted counts the requests key gets through before the first 429.
func admitted(h http.Handler, key string, hdr ...string) int {
	for n := 0; n < 10_000; n++ {
		if w := get(h, key, hdr...); w.Code != http.StatusOK {
			return n
		}
	}
	return -1
}

func TestTiers(t *testing.T) {
	h, _ := newApp(t)
	w := get(h, "free-key-1")
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"plan":"free"`) {
		t.Fatalf("free: %d %s", w.Code, w.Body)
	}
	if got := w.Header().Get("RateLimit-Policy"); got != `"api";q=10;w=60` {
		t.Errorf("free RateLimit-Policy %q", got)
	}
	if got := w.Header().Get("RateLimit"); got != `"api";r=9;t=6` {
		t.Errorf("free RateLimit %q", got)
	}
	if n := admitted(h, "free-key-1"); n != 9 {
		t.Errorf("free key admitted %d more, want 9", n)
	}
	// Claiming the pro plan does not help: the server sets X-Plan.
	if w := get(h, "free-key-1", "X-Plan", "pro"); w.Code != http.StatusTooManyRequests {
		t.Errorf("free key claiming pro: %d", w.Code)
	}
	// Each key has its own count.
	if n := admitted(h, "free-key-2"); n != 10 {
		t.Errorf("second free key admitted %d, want 10", n)
	}

	w = get(h, "pro-key-1")
	if got := w.Header().Get("RateLimit-Policy"); got != `"api";q=1000;w=60` {
		t.Errorf("pro RateLimit-Policy %q", got)
	}
	if n := admitted(h, "pro-key-1"); n != 99 {
		t.Errorf("pro key admitted %d more at once, want 99 (burst 100)", n)
	}
}

func TestTiersRefill(t *testing.T) {
	h, clock := newApp(t)
	admitted(h, "free-key-1")
	w := get(h, "free-key-1")
	if w.Code != 429 || w.Header().Get("Retry-After") != "6" {
		t.Fatalf("free key exhausted: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	clock.Advance(6 * time.Second) // the free plan earns one request every 6 s
	if w := get(h, "free-key-1"); w.Code != 200 {
		t.Errorf("after 6 s: %d", w.Code)
	}
}

func TestUnknownKey(t *testing.T) {
	h, _ := newApp(t)
	for _, key := range []string{"", "stolen"} {
		if w := get(h, key); w.Code != http.StatusUnauthorized {
			t.Errorf("key %q: %d", key, w.Code)
		}
	}
}
