package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

func allowedHandler() (http.Handler, *http.Request, *httptest.ResponseRecorder) {
	lim := weir.NewLimiter(memstore.New())
	h := httplimit.New(lim, weir.Limit{Algorithm: weir.GCRA, Rate: 1e9, Period: time.Hour})(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	return h, r, httptest.NewRecorder()
}

// TestNewAllowedAllocs bounds the allowed path of New: the store key and
// the two header values, nothing else.
func TestNewAllowedAllocs(t *testing.T) {
	h, r, w := allowedHandler()
	n := testing.AllocsPerRun(200, func() {
		clear(w.Header())
		h.ServeHTTP(w, r)
	})
	if n > 3 {
		t.Errorf("an allowed request costs %v allocations, want at most 3", n)
	}
	if got := w.Header().Get("RateLimit"); got == "" || w.Header().Get("RateLimit-Policy") == "" {
		t.Fatalf("headers missing: %v", w.Header())
	}
}

// TestNewIPv6Allocs: an IPv6 client, keyed by its /64, costs its
// identity string besides the key and the two header values.
func TestNewIPv6Allocs(t *testing.T) {
	h, r, w := allowedHandler()
	r.RemoteAddr = "[2001:db8::1]:1234"
	n := testing.AllocsPerRun(200, func() {
		clear(w.Header())
		h.ServeHTTP(w, r)
	})
	if n > 4 {
		t.Errorf("an allowed IPv6 request costs %v allocations, want at most 4", n)
	}
}

func BenchmarkNewAllowed(b *testing.B) {
	h, r, w := allowedHandler()
	b.ReportAllocs()
	for b.Loop() {
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
}
