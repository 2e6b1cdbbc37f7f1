// Command tiers is an API with a free and a pro plan: each API key may make
// 10 requests a minute on the free plan, and 1000 a minute, 100 at once,
// on the pro plan.
//
//	go run ./examples/tiers
//	curl -i -H 'X-API-Key: free-key-1' http://127.0.0.1:8090/api/items
//	curl -i -H 'X-API-Key: pro-key-1' http://127.0.0.1:8090/api/items
//
// It listens on $ADDR (default 127.0.0.1:8090). The embedded weir.yaml has
// one rule, counted per API key, whose tiers are picked by the X-Plan
// header. The plan must not come from the client: the apiKeys middleware
// looks the key up, refuses unknown keys, and overwrites X-Plan with the
// key's plan before policy.Middleware applies the rule.
package main

import (
	_ "embed"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy"
)

//go:embed weir.yaml
var rulesYAML []byte

// plans maps API keys to plans: a stand-in for a database.
var plans = map[string]string{
	"free-key-1": "free",
	"free-key-2": "free",
	"pro-key-1":  "pro",
}

// newPolicy compiles the embedded rules over store (nil: in memory).
func newPolicy(store weir.Store) (*policy.Policy, error) {
	cfg, err := policy.Parse(rulesYAML, "weir.yaml")
	if err != nil {
		return nil, err
	}
	return policy.New(cfg, store)
}

// newHandler returns the API under p's rules.
func newHandler(p *policy.Policy) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/items", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"plan":  r.Header.Get("X-Plan"),
			"items": []string{"apple", "banana", "cherry"},
		})
	})
	return apiKeys(policy.Middleware(p)(mux))
}

// apiKeys refuses requests without a known API key and sets X-Plan to the
// key's plan, replacing whatever the client sent.
func apiKeys(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plan, ok := plans[r.Header.Get("X-API-Key")]
		if !ok {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"unknown API key"}` + "\n"))
			return
		}
		r.Header.Set("X-Plan", plan)
		next.ServeHTTP(w, r)
	})
}

func main() {
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8090"
	}
	p, err := newPolicy(nil)
	if err != nil {
		slog.Error("bad rules", "err", err)
		os.Exit(1)
	}
	srv := &http.Server{Addr: addr, Handler: newHandler(p), ReadHeaderTimeout: 10 * time.Second}
	slog.Info("listening", "addr", "http://"+addr)
	if err := srv.ListenAndServe(); err != nil {
		slog.Error("server stopped", "err", err)
		os.Exit(1)
	}
}
