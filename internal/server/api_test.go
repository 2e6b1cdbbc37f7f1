package server

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/server/envoyrls"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/guard"
)

func TestCheckDecides(t *testing.T) {
	_, ts := newTestServer(t)
	for i := 1; i <= 3; i++ {
		code, d := check(t, ts.URL, "login", "192.0.2.1", 1)
		if code != 200 || d["allowed"] != true || d["remaining"].(float64) != float64(3-i) || d["limit"].(float64) != 3 {
			t.Fatalf("hit %d: %d %v", i, code, d)
		}
		for _, f := range []string{"rule", "allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "blocked_until"} {
			if _, ok := d[f]; !ok {
				t.Fatalf("answer lacks %q: %v", f, d)
			}
		}
	}
	code, d := check(t, ts.URL, "login", "192.0.2.1", 1)
	if code != 429 || d["allowed"] != false || d["retry_after_ms"].(float64) <= 0 || d["blocked_until"].(float64) == 0 || d["error"] != "rate_limited" {
		t.Fatalf("4th hit: %d %v", code, d)
	}
	// Another key is independent; hits defaults to 1; hits 0 peeks.
	resp, b := call(t, "POST", ts.URL+"/v1/check", `{"rule":"login","key":"192.0.2.2"}`, "Content-Type", "application/json")
	if d := decode(t, b); resp.StatusCode != 200 || d["remaining"].(float64) != 2 {
		t.Fatalf("default hits: %s", b)
	}
	if resp.Header.Get("RateLimit-Policy") != `"login";q=3;w=60` || resp.Header.Get("RateLimit") == "" {
		t.Fatalf("check response headers: %v", resp.Header)
	}
	for range 3 {
		if _, d := check(t, ts.URL, "login", "192.0.2.2", 0); d["remaining"].(float64) != 2 || d["allowed"] != true {
			t.Fatalf("peek consumed or wrong: %v", d)
		}
	}
	// A weighted request.
	if _, d := check(t, ts.URL, "api", "k1", 4); d["remaining"].(float64) != 1 {
		t.Fatalf("hits 4: %v", d)
	}
	// A shadow rule never rejects but says what it would have done.
	check(t, ts.URL, "trial", "x", 1)
	if _, d := check(t, ts.URL, "trial", "x", 1); d["allowed"] != true || d["shadow"] != true || d["shadow_limited"] != true {
		t.Fatalf("shadow: %v", d)
	}
	// A tier by name.
	resp, b = call(t, "POST", ts.URL+"/v1/check", `{"rule":"tiered","key":"k","tier":"pro"}`, "Content-Type", "application/json")
	if d := decode(t, b); d["limit"].(float64) != 10 || d["tier"] != "pro" {
		t.Fatalf("tier: %d %s", resp.StatusCode, b)
	}
}

func TestCheckRejectsBadInput(t *testing.T) {
	_, ts := newTestServer(t)
	huge := `{"rule":"login","key":"` + strings.Repeat("a", 70<<10) + `"}`
	for _, tc := range []struct {
		name, body, ctype string
		status            int
		code, mention     string
	}{
		{"malformed", `{"rule":"login",`, "", 400, "bad_request", "malformed JSON"},
		{"syntax", "{\n  \"rule\": login}", "", 400, "bad_request", "line 2"},
		{"empty", ``, "", 400, "bad_request", "empty"},
		{"array", `[1,2]`, "", 400, "bad_request", "object"},
		{"unknown field", `{"rule":"login","key":"a","hist":1}`, "", 400, "bad_request", `"hist"`},
		{"negative hits", `{"rule":"login","key":"a","hits":-1}`, "", 400, "bad_request", "-1"},
		{"hits type", `{"rule":"login","key":"a","hits":"2"}`, "", 400, "bad_request", `"hits"`},
		{"fractional hits", `{"rule":"login","key":"a","hits":1.5}`, "", 400, "bad_request", `"hits"`},
		{"too many hits", `{"rule":"login","key":"a","hits":4}`, "", 400, "bad_request", `rule "login": cost 4 for key "login:a" is outside 0..3`},
		{"no rule", `{"key":"a"}`, "", 400, "bad_request", `"rule"`},
		{"no key", `{"rule":"login"}`, "", 400, "bad_request", `"key"`},
		{"unknown rule", `{"rule":"nope","key":"a"}`, "", 404, "unknown_rule", "login"},
		{"trailing", `{"rule":"login","key":"a"} {}`, "", 400, "bad_request", "after"},
		{"too large", huge, "", 413, "body_too_large", "64 KB"},
		{"content type", `{"rule":"login","key":"a"}`, "application/x-www-form-urlencoded", 415, "unsupported_media_type", `"application/x-www-form-urlencoded" is not JSON`},
		{"both", `{"rule":"login","domain":"d","descriptors":[]}`, "", 400, "bad_request", "both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := []string{"Content-Type", "application/json"}
			if tc.ctype != "" {
				hdr = []string{"Content-Type", tc.ctype}
			}
			resp, b := call(t, "POST", ts.URL+"/v1/check", tc.body, hdr...)
			d := decode(t, b)
			if resp.StatusCode != tc.status || d["error"] != tc.code || !strings.Contains(d["detail"].(string), tc.mention) {
				t.Fatalf("got %d %s; want %d %s mentioning %q", resp.StatusCode, b, tc.status, tc.code, tc.mention)
			}
			// Each layer's context once: no Go package prefixes.
			if detail := d["detail"].(string); strings.Contains(detail, "policy: ") || strings.Contains(detail, "weir: ") {
				t.Errorf("detail %q names Go packages", detail)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
		})
	}
	resp, b := call(t, "GET", ts.URL+"/v1/check", "")
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" || decode(t, b)["error"] != "method_not_allowed" {
		t.Fatalf("GET /v1/check: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	resp, b = call(t, "GET", ts.URL+"/v1/nope", "")
	if resp.StatusCode != 404 || decode(t, b)["error"] != "not_found" {
		t.Fatalf("unknown endpoint: %d %s", resp.StatusCode, b)
	}
}

func TestCheckEnvoyStyle(t *testing.T) {
	ecfg, err := envoyrls.Parse([]byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`), "edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, ts := newTestServer(t, WithEnvoyConfig(ecfg))
	body := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.1.1"}]}]}`
	for i := range 2 {
		resp, b := call(t, "POST", ts.URL+"/v1/check", body, "Content-Type", "application/json")
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"OK"`) {
			t.Fatalf("call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	resp, b := call(t, "POST", ts.URL+"/v1/check", body, "Content-Type", "application/json")
	if resp.StatusCode != 429 || !strings.Contains(string(b), "OVER_LIMIT") {
		t.Fatalf("over the limit: %d %s", resp.StatusCode, b)
	}
	resp, b = call(t, "POST", ts.URL+"/v1/check", `{"domain":"other","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, "Content-Type", "application/json")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"OK"`) {
		t.Fatalf("unknown domain: %d %s", resp.StatusCode, b)
	}
	resp, b = call(t, "POST", ts.URL+"/v1/check", `{"domain":"edge","descriptors":[]}`, "Content-Type", "application/json")
	if resp.StatusCode != 400 || !strings.Contains(string(b), "error") {
		t.Fatalf("empty descriptors: %d %s", resp.StatusCode, b)
	}
	// The rule shows in /v1/rules and the metrics count it by its path.
	_, b = call(t, "GET", ts.URL+"/v1/rules", "")
	if !strings.Contains(string(b), `"envoy"`) || !strings.Contains(string(b), "edge.remote_address") {
		t.Fatalf("rules: %s", b)
	}
	_, b = call(t, "GET", ts.URL+"/metrics", "")
	if !strings.Contains(string(b), `weir_decisions_total{result="limited",rule="edge.remote_address"} 1`) {
		t.Fatalf("envoy decisions not counted:\n%s", grepLines(string(b), "weir_decisions_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, ln := range strings.Split(s, "\n") {
		if strings.Contains(ln, sub) {
			out = append(out, ln)
		}
	}
	return strings.Join(out, "\n")
}

// auth asks /v1/auth about a request.
func auth(t testing.TB, base, query, method, uri string, header ...string) (*http.Response, []byte) {
	t.Helper()
	h := append([]string{"X-Original-URI", uri, "X-Original-Method", method}, header...)
	return call(t, "GET", base+"/v1/auth"+query, "", h...)
}

func TestAuthEndpoint(t *testing.T) {
	_, ts := newTestServer(t)
	for i := range 3 {
		resp, b := auth(t, ts.URL, "", "POST", "/api/login?next=/")
		if resp.StatusCode != 200 || len(b) != 0 {
			t.Fatalf("login %d: %d %s", i, resp.StatusCode, b)
		}
		if resp.Header.Get("RateLimit-Policy") != `"login";q=3;w=60` || resp.Header.Get("RateLimit") != `"login";r=`+strconv.Itoa(2-i)+`;t=60` {
			t.Fatalf("headers: %v", resp.Header)
		}
	}
	resp, b := auth(t, ts.URL, "", "POST", "/api/login")
	d := decode(t, b)
	if resp.StatusCode != 403 || resp.Header.Get("Retry-After") != "60" || resp.Header.Get("RateLimit") == "" ||
		d["error"] != "rate_limited" || d["rule"] != "login" || d["blocked_until"].(float64) == 0 || d["retry_after_ms"].(float64) <= 0 {
		t.Fatalf("limited: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	resp, _ = auth(t, ts.URL, "?status=429", "POST", "/api/login")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("?status=429: %d", resp.StatusCode)
	}
	// GET /api/login matches no POST rule: allowed, no headers.
	resp, _ = auth(t, ts.URL, "", "GET", "/api/login")
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != "" {
		t.Fatalf("GET login: %d %v", resp.StatusCode, resp.Header)
	}
	// Traefik and Caddy's header names; header identities come through.
	for i := range 6 {
		resp, _ := call(t, "GET", ts.URL+"/v1/auth?status=429", "", "X-Forwarded-Uri", "/api/items", "X-Forwarded-Method", "GET", "X-API-Key", "key-1")
		want := 200
		if i == 5 {
			want = 429
		}
		if resp.StatusCode != want {
			t.Fatalf("api %d: %d", i, resp.StatusCode)
		}
	}
	// Any method reaches the endpoint: nginx's subrequest keeps the
	// original's.
	for _, m := range []string{"DELETE", "PUT", "PATCH", "HEAD"} {
		if resp, _ := call(t, m, ts.URL+"/v1/auth", "", "X-Original-URI", "/x"); resp.StatusCode != 200 {
			t.Fatalf("%s /v1/auth: %d", m, resp.StatusCode)
		}
	}
	// A shadow rule never limits.
	for range 3 {
		if resp, _ := auth(t, ts.URL, "", "GET", "/trial"); resp.StatusCode != 200 {
			t.Fatalf("shadow rule limited: %d", resp.StatusCode)
		}
	}
	// Bad requests.
	resp, b = call(t, "GET", ts.URL+"/v1/auth", "")
	if resp.StatusCode != 400 || !strings.Contains(string(b), "X-Original-URI") {
		t.Fatalf("no URI: %d %s", resp.StatusCode, b)
	}
	resp, _ = auth(t, ts.URL, "?status=500", "GET", "/")
	if resp.StatusCode != 400 {
		t.Fatalf("status=500: %d", resp.StatusCode)
	}
	resp, _ = auth(t, ts.URL, "", "GE T", "/")
	if resp.StatusCode != 400 {
		t.Fatalf("bad method: %d", resp.StatusCode)
	}
}

// authFrom calls the handler directly with a chosen peer address.
func authFrom(s *Server, peer, uri string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/v1/auth", nil)
	r.RemoteAddr = peer
	r.Header.Set("X-Original-URI", uri)
	r.Header.Set("X-Original-Method", "POST")
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	return w
}

func TestAuthTrustsForwardedOnlyFromTrustedProxies(t *testing.T) {
	s, _ := newTestServer(t)
	// From a trusted proxy (10/8), X-Forwarded-For names the client: three
	// clients behind one proxy each get their own quota.
	for _, client := range []string{"192.0.2.10", "192.0.2.11", "192.0.2.12"} {
		for i := range 4 {
			w := authFrom(s, "10.0.0.2:4000", "/api/login", "X-Forwarded-For", client+", 10.0.0.1")
			if want := map[bool]int{true: 403, false: 200}[i == 3]; w.Code != want {
				t.Fatalf("client %s hit %d: %d", client, i, w.Code)
			}
		}
	}
	// X-Real-IP too, from a trusted proxy.
	if w := authFrom(s, "10.0.0.2:4000", "/api/login", "X-Real-IP", "192.0.2.99"); w.Code != 200 {
		t.Fatalf("X-Real-IP: %d", w.Code)
	}
	// From an untrusted peer, the headers are ignored: the peer is the
	// client, whatever it claims.
	for i := range 4 {
		w := authFrom(s, "192.0.2.50:1234", "/api/login", "X-Forwarded-For", "192.0.2."+strconv.Itoa(100+i), "X-Real-IP", "192.0.2.200")
		if want := map[bool]int{true: 403, false: 200}[i == 3]; w.Code != want {
			t.Fatalf("spoofing client hit %d: %d", i, w.Code)
		}
	}
	// Deny list: 403 without Retry-After; allow list: 200, never limited.
	w := authFrom(s, "203.0.113.9:1", "/api/login")
	if w.Code != 403 || w.Header().Get("Retry-After") != "" || !strings.Contains(w.Body.String(), "forbidden") {
		t.Fatalf("deny-listed: %d %v %s", w.Code, w.Header(), w.Body)
	}
	for range 5 {
		if w := authFrom(s, "198.51.100.7:1", "/api/login"); w.Code != 200 {
			t.Fatalf("allow-listed: %d", w.Code)
		}
	}
}

func TestRedisURLErrorsHidePasswords(t *testing.T) {
	_, err := New(WithRedisURL("redis://user:hunter2@host:notaport/0"), WithLogger(quietLogger()))
	// The secret never shows; the bad value does (the store redacts the
	// password itself, the server again for any error that quotes it).
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "notaport") {
		t.Fatalf("error: %v", err)
	}
	if got := redactURL(`bad "redis://u:p%40ss@h:1"`, "redis://u:p%40ss@h:1"); strings.Contains(got, "p%40ss") {
		t.Fatal(got)
	}
}

// TestRedisURLKeepsTuning: --redis says where Redis is; the config's
// coalescing settings and key prefix survive it.
func TestRedisURLKeepsTuning(t *testing.T) {
	cfg := mustParse(t, "store:\n  redis: {addrs: [\"a:1\"], max_in_flight: 3, max_batch: 9, prefix: blue}\n")
	if err := applyRedisURL(cfg, "redis://u:pw@h:7/2"); err != nil {
		t.Fatal(err)
	}
	r := cfg.Store.Redis
	if len(r.Addrs) != 1 || r.Addrs[0] != "h:7" || r.DB != 2 || r.Username != "u" || r.MaxInFlight != 3 || r.MaxBatch != 9 {
		t.Fatalf("after --redis: %v", r)
	}
	if rc, _ := redisConfig(cfg.Store); rc.MaxInFlight != 3 || rc.MaxBatch != 9 || rc.Timeout != guard.DefaultTimeout || rc.Prefix != "blue" || rc.Linger != config.DefaultLinger {
		t.Fatalf("store config: in flight %d, batch %d, timeout %v, prefix %q, linger %v", rc.MaxInFlight, rc.MaxBatch, rc.Timeout, rc.Prefix, rc.Linger)
	}
	for yaml, want := range map[string]time.Duration{"0s": 0, "0": 0, "3ms": 3 * time.Millisecond} {
		cfg := mustParse(t, "store:\n  redis: {addrs: [\"a:1\"], linger: "+yaml+"}\n")
		if err := applyRedisURL(cfg, "redis://h:7"); err != nil {
			t.Fatal(err)
		}
		if rc, _ := redisConfig(cfg.Store); rc.Linger != want {
			t.Fatalf("linger: %s: store config's linger %v, want %v", yaml, rc.Linger, want)
		}
	}
}
