package policy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/weir-dev/weir/policy"
)

// A breaker in the rules file: once the route has failed twice, the
// middleware answers 503 circuit_open without calling the handler.
func ExampleMiddleware_protect() {
	cfg, err := policy.Parse([]byte(`
protect:
  - name: payments
    match: { path: /pay }
    breaker: { errors: 2, min_requests: 2, open_for: 30s }
`), "weir.yaml")
	if err != nil {
		panic(err)
	}
	p, err := policy.New(cfg, nil)
	if err != nil {
		panic(err)
	}
	h := policy.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "provider down", http.StatusBadGateway)
	}))
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/pay", nil))
		var body struct{ Error, Protect string }
		_ = json.Unmarshal(w.Body.Bytes(), &body)
		if w.Code != http.StatusServiceUnavailable {
			fmt.Println(w.Code)
			continue
		}
		fmt.Println(w.Code, w.Header().Get("Retry-After"), body.Error, body.Protect)
	}
	// Output:
	// 502
	// 502
	// 503 30 circuit_open payments
}
