package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/memstore"
)

// Five login attempts per 15 minutes per client IP, then a 15-minute
// penalty box.
func ExampleNew() {
	lim := weir.NewLimiter(memstore.New())
	login := weir.Limit{Algorithm: weir.SlidingLog, Rate: 5, Period: 15 * time.Minute, Block: 15 * time.Minute}
	mw := httplimit.New(lim, login, httplimit.WithName("login"))

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

// Rules from weir.yaml: every request matching a rule is counted by it, and
// the headers report them all.
func ExampleFromPolicy() {
	cfg, err := policy.Parse([]byte(`
rules:
  - name: login
    match: { methods: [POST], path: /login }
    identity: [ip]
    limit: 5/15m
    algorithm: sliding_log
    block: 15m
  - name: site
    identity: [ip]
    limit: 100/m
    algorithm: sliding_log
`), "weir.yaml")
	if err != nil {
		panic(err)
	}
	p, err := policy.New(cfg, nil) // nil: a fresh in-memory store
	if err != nil {
		panic(err)
	}
	h := httplimit.FromPolicy(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	}))

	for _, method := range []string{http.MethodGet, http.MethodPost} {
		r := httptest.NewRequest(method, "/login", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(method, w.Code)
		fmt.Println("  RateLimit-Policy:", w.Header().Get("RateLimit-Policy"))
		fmt.Println("  RateLimit:", w.Header().Get("RateLimit"))
	}
	// Output:
	// GET 200
	//   RateLimit-Policy: "site";q=100;w=60
	//   RateLimit: "site";r=99;t=60
	// POST 200
	//   RateLimit-Policy: "login";q=5;w=900, "site";q=100;w=60
	//   RateLimit: "login";r=4;t=900
}
