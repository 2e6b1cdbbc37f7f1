package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/store/memstore"
)

// Five login attempts per 15 minutes per client IP, then a 15-minute
// penalty box.
func ExampleNew() {
	lim := weir.NewLimiter(memstore.New())
	login := weir.Limit{Algorithm: weir.SlidingLog, Rate: 5, Period: 15 * time.Minute, Block: 15 * time.Minute}
	// Clients by IP, an IPv6 client by its /64 (KeyByIP's default).
	mw := httplimit.New(lim, login, httplimit.WithName("login"), httplimit.KeyByIPPrefix(32, 64))

	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "welcome")
	}))

	for i := 1; i <= 6; i++ {
		r := httptest.NewRequest(http.MethodPost, "/login", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "login";r=4;t=900
	// 200 "login";r=3;t=900
	// 200 "login";r=2;t=900
	// 200 "login";r=1;t=900
	// 200 "login";r=0;t=900
	// 429 "login";r=0;t=900
}

// Behind a proxy: believe the client address the proxy at 10.0.0.0/8
// writes, and group clients by /24 (IPv4) and /56 (IPv6).
func ExampleKeyByIPPrefix() {
	lim := weir.NewLimiter(memstore.New())
	one := weir.Limit{Algorithm: weir.FixedWindow, Rate: 1, Period: time.Minute}
	mw := httplimit.New(lim, one,
		httplimit.KeyByIPPrefix(24, 56, netip.MustParsePrefix("10.0.0.0/8")),
		httplimit.WithClientIPHeader("X-Real-IP"))
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, client := range []string{"2001:db8:1:100::1", "2001:db8:1:1ff::2", "2001:db8:2::1"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "10.0.0.1:5000"
		r.Header.Set("X-Real-IP", client)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(client, w.Code)
	}
	// Output:
	// 2001:db8:1:100::1 200
	// 2001:db8:1:1ff::2 429
	// 2001:db8:2::1 200
}

// A client that paces itself by the rate-limit headers of the servers it
// calls: every goroutine using client shares one budget per host.
func ExampleNewTransport() {
	client := &http.Client{Transport: httplimit.NewTransport(http.DefaultTransport)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://api.example.com/v1/items", nil)
	resp, err := client.Do(req)
	if errors.Is(err, httplimit.ErrPaced) {
		// the budget is spent until after the deadline; nothing was sent
		return
	}
	if err == nil {
		resp.Body.Close()
	}
}
