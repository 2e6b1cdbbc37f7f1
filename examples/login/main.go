// Command login is a login form guarded the way login forms should be: 5
// attempts per 15 minutes per account and per client IP, then a 15-minute
// penalty box. The page counts down to the end of the box from the
// blocked_until field of the 429 response.
//
//	go run ./examples/login
//	open http://127.0.0.1:8090/    (alice / wonderland)
//
// It listens on $ADDR (default 127.0.0.1:8090). The rules live in the
// embedded weir.yaml and are applied by policy.Middleware. Policies
// identify clients by IP, headers, cookies or query parameters, never by
// the body, so a small middleware copies the form's username into the
// X-Account header that the login-account rule counts by.
//
// A per-account penalty box lets anyone lock an account out for 15
// minutes by failing on purpose; that is the usual price of stopping
// password guessing across many IPs. A successful sign-in clears the
// account's count.
package main

import (
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/policy"
)

//go:embed weir.yaml
var rulesYAML []byte

//go:embed login.html
var loginPage []byte

// users are the demo accounts.
var users = map[string]string{"alice": "wonderland", "bob": "builder"}

// newPolicy compiles the embedded rules over store (nil: in memory).
func newPolicy(store weir.Store) (*policy.Policy, error) {
	cfg, err := policy.Parse(rulesYAML, "weir.yaml")
	if err != nil {
		return nil, err
	}
	return policy.New(cfg, store)
}

// newHandler returns the application under p's rules.
func newHandler(p *policy.Policy) http.Handler {
	limited := policy.Middleware(p)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(loginPage)
	})
	mux.Handle("POST /login", accountHeader(limited(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		login(w, r, p)
	}))))
	return mux
}

// accountHeader sets X-Account to the normalized username of the form
// (or of the X-Account header an API client sent), so that the rules and
// the handler agree on the account.
func accountHeader(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		account := r.PostForm.Get("username")
		if account == "" {
			account = r.Header.Get("X-Account")
		}
		account = strings.ToLower(strings.TrimSpace(account))
		if account == "" {
			r.Header.Del("X-Account")
		} else {
			r.Header.Set("X-Account", account)
		}
		next.ServeHTTP(w, r)
	})
}

// login checks the password of the account in X-Account.
func login(w http.ResponseWriter, r *http.Request, p *policy.Policy) {
	account := r.Header.Get("X-Account")
	want, known := users[account]
	password := r.PostForm.Get("password")
	w.Header().Set("Content-Type", "application/json")
	if account == "" {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"detail": "Username missing."})
		return
	}
	// Compare even for unknown accounts, so timing does not tell them apart.
	ok := subtle.ConstantTimeCompare([]byte(password), []byte(want)) == 1 && known
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
		_ = json.NewEncoder(w).Encode(map[string]string{"detail": "Wrong username or password."})
		return
	}
	// A successful sign-in forgives the account's earlier failures.
	if err := p.Reset(r.Context(), "login-account", account); err != nil {
		slog.Warn("reset failed", "account", account, "err", err)
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"user": account})
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
