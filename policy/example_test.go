package policy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/guard"
	"github.com/weir-dev/weir/store/memstore"
)

func ExampleParse() {
	_, err := policy.Parse([]byte(`
rules:
  - name: login
    match: {methods: [POST], path: /login}
    limit: 5/15x
    algoritm: sliding_log
`), "weir.yaml")
	fmt.Println(err)
	// Output:
	// weir.yaml:5:12: invalid limit "5/15x": period "15x" is not a duration (use s, m, h, d, 30s, 15m, 7d)
	// weir.yaml:6:5: unknown field "algoritm" in rule (did you mean "algorithm"?)
}

func ExampleNew() {
	cfg, err := policy.Parse([]byte(`
rules:
  - {name: api, identity: header:X-API-Key, limit: 100/m burst 10}
  - {name: login, match: {path: /login}, limit: 5/15m, algorithm: sliding_log, block: 15m}
`), "weir.yaml")
	if err != nil {
		panic(err)
	}
	// A Guard holds the circuit breaker and the local fallback store; build
	// it once and pass it to every New so that reloads keep them.
	g := guard.New(memstore.New(), guard.Config{})
	p, err := policy.New(cfg, g)
	if err != nil {
		panic(err)
	}
	for _, r := range p.Rules() {
		fmt.Printf("%s %v %q %s block=%q\n", r.Name, r.Identity, r.Limit, r.Algorithm, r.Block)
	}
	// Output:
	// api [header:X-API-Key] "100/m burst 10" gcra block=""
	// login [ip] "5/15m" sliding_log block="15m0s"
}

func ExamplePolicy_Check() {
	cfg, _ := policy.Parse([]byte(`
rules:
  - name: login
    match: {methods: [POST], path: /login}
    identity: ip
    limit: 2/m
    algorithm: fixed_window
`), "weir.yaml")
	p, _ := policy.New(cfg, nil) // nil: an in-memory store
	for i := 0; i < 3; i++ {
		r := httptest.NewRequest("POST", "/login", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		v := p.Check(context.Background(), r)
		res, _ := v.Limited()
		fmt.Printf("allowed=%v rule=%s identity=%s remaining=%d\n", v.Allowed, res.Rule, res.Identity, res.Result.Remaining)
	}
	// Output:
	// allowed=true rule=login identity=192.0.2.1 remaining=1
	// allowed=true rule=login identity=192.0.2.1 remaining=0
	// allowed=false rule=login identity=192.0.2.1 remaining=0
}

// Rules from weir.yaml: every request matching a rule is counted by it, and
// the headers report them all.
func ExampleMiddleware() {
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
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
