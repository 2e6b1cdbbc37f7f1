package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

const token = "s3cret-token"

func bearer(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

func TestAdminAuth(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		_, ts := newTestServer(t)
		for _, ep := range []struct{ method, path string }{
			{"GET", "/v1/state?rule=login&key=a"}, {"DELETE", "/v1/state?rule=login&key=a"},
			{"GET", "/v1/blocked"}, {"DELETE", "/v1/blocked?rule=login&key=a"},
			{"PUT", "/v1/rules"}, {"DELETE", "/v1/rules"},
		} {
			resp, b := call(t, ep.method, ts.URL+ep.path, "", bearer(token)...)
			d := decode(t, b)
			if resp.StatusCode != 404 || d["error"] != "admin_disabled" || !strings.Contains(d["detail"].(string), "WEIR_ADMIN_TOKEN") {
				t.Fatalf("%s %s with the admin API off: %d %s", ep.method, ep.path, resp.StatusCode, b)
			}
		}
		// Public endpoints stay public.
		if resp, _ := call(t, "GET", ts.URL+"/v1/rules", ""); resp.StatusCode != 200 {
			t.Fatalf("GET /v1/rules: %d", resp.StatusCode)
		}
	})
	t.Run("on", func(t *testing.T) {
		_, ts := newTestServer(t, WithAdminToken(token))
		for _, h := range [][]string{
			nil,
			bearer("wrong"),
			bearer(token + "x"),
			bearer(""),
			{"Authorization", "Basic " + token},
			{"Authorization", token},
		} {
			resp, b := call(t, "GET", ts.URL+"/v1/blocked", "", h...)
			if resp.StatusCode != 401 || decode(t, b)["error"] != "unauthorized" || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("header %v: %d %s", h, resp.StatusCode, b)
			}
		}
		resp, b := call(t, "GET", ts.URL+"/v1/blocked", "", bearer(token)...)
		if resp.StatusCode != 200 {
			t.Fatalf("right token: %d %s", resp.StatusCode, b)
		}
		resp, _ = call(t, "GET", ts.URL+"/v1/blocked", "", "Authorization", "bearer "+token)
		if resp.StatusCode != 200 {
			t.Fatalf("scheme is case-insensitive: %d", resp.StatusCode)
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("MY_WEIR_TOKEN", "from-env")
		s, ts := newTestServer(t, func(o *options) { o.adminToken = nil }, WithAdminTokenEnv("MY_WEIR_TOKEN"))
		if !s.AdminEnabled() {
			t.Fatal("token from the environment not picked up")
		}
		if resp, _ := call(t, "GET", ts.URL+"/v1/blocked", "", bearer("from-env")...); resp.StatusCode != 200 {
			t.Fatalf("%d", resp.StatusCode)
		}
	})
}

func TestAdminStateAndPenaltyBox(t *testing.T) {
	_, ts := newTestServer(t, WithAdminToken(token))
	adm := bearer(token)
	for range 4 {
		check(t, ts.URL, "login", "192.0.2.7", 1)
	}
	// Inspect: remaining 0, blocked; inspecting consumes nothing.
	for range 2 {
		resp, b := call(t, "GET", ts.URL+"/v1/state?rule=login&key=192.0.2.7", "", adm...)
		d := decode(t, b)
		if resp.StatusCode != 200 || d["allowed"] != false || d["remaining"].(float64) != 0 || d["blocked_until"].(float64) == 0 || d["key"] != "192.0.2.7" {
			t.Fatalf("state: %d %s", resp.StatusCode, b)
		}
	}
	_, b := call(t, "GET", ts.URL+"/v1/state?rule=login&key=192.0.2.8", "", adm...)
	if d := decode(t, b); d["remaining"].(float64) != 3 {
		t.Fatalf("fresh key: %s", b)
	}
	// The penalty box lists it.
	resp, b := call(t, "GET", ts.URL+"/v1/blocked", "", adm...)
	var list struct {
		Blocked []BlockedEntry `json:"blocked"`
	}
	if err := json.Unmarshal(b, &list); err != nil || resp.StatusCode != 200 || len(list.Blocked) != 1 ||
		list.Blocked[0].Rule != "login" || list.Blocked[0].Identity != "192.0.2.7" || list.Blocked[0].BlockedUntilMS < time.Now().UnixMilli() {
		t.Fatalf("blocked: %d %s", resp.StatusCode, b)
	}
	// Unblock: it leaves the list and is admitted again.
	resp, b = call(t, "DELETE", ts.URL+"/v1/blocked?rule=login&key=192.0.2.7", "", adm...)
	if resp.StatusCode != 200 || decode(t, b)["unblocked"] != true {
		t.Fatalf("unblock: %d %s", resp.StatusCode, b)
	}
	_, b = call(t, "GET", ts.URL+"/v1/blocked", "", adm...)
	if strings.Contains(string(b), "192.0.2.7") {
		t.Fatalf("still listed after unblock: %s", b)
	}
	if _, d := check(t, ts.URL, "login", "192.0.2.7", 1); d["allowed"] != true || d["remaining"].(float64) != 2 {
		t.Fatalf("not admitted after unblock: %v", d)
	}
	// Reset.
	resp, _ = call(t, "DELETE", ts.URL+"/v1/state?rule=login&key=192.0.2.7", "", adm...)
	if resp.StatusCode != 200 {
		t.Fatalf("reset: %d", resp.StatusCode)
	}
	if _, d := check(t, ts.URL, "login", "192.0.2.7", 0); d["remaining"].(float64) != 3 {
		t.Fatalf("after reset: %v", d)
	}
	// Errors.
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/v1/state?rule=login", 400},
		{"GET", "/v1/state?key=a", 400},
		{"GET", "/v1/state?rule=nope&key=a", 404},
		{"DELETE", "/v1/state?rule=nope&key=a", 404},
		{"DELETE", "/v1/blocked?rule=login", 400},
		{"POST", "/v1/state?rule=login&key=a", 405},
	} {
		resp, b := call(t, tc.method, ts.URL+tc.path, "", adm...)
		if resp.StatusCode != tc.status || decode(t, b)["detail"] == "" {
			t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, resp.StatusCode, b, tc.status)
		}
	}
}

func TestRulesReplacedAtRunTime(t *testing.T) {
	s, ts := newTestServer(t, WithAdminToken(token))
	adm := bearer(token)
	_, b := call(t, "GET", ts.URL+"/v1/rules", "")
	if !strings.Contains(string(b), `"name":"login"`) {
		t.Fatalf("rules: %s", b)
	}
	newRules := "rules:\n  - name: burst\n    match: {path: /}\n    limit: 2/m\n    algorithm: fixed_window\n"
	resp, b := call(t, "PUT", ts.URL+"/v1/rules", newRules, adm...)
	if resp.StatusCode != 200 || decode(t, b)["scope"] != "instance" {
		t.Fatalf("PUT: %d %s", resp.StatusCode, b)
	}
	_, b = call(t, "GET", ts.URL+"/v1/rules", "")
	if !strings.Contains(string(b), `"name":"burst"`) || strings.Contains(string(b), `"name":"login"`) || !strings.Contains(string(b), `"source":"api"`) {
		t.Fatalf("rules after PUT: %s", b)
	}
	if code, _ := check(t, ts.URL, "login", "a", 1); code != 404 {
		t.Fatalf("old rule still there: %d", code)
	}
	if _, d := check(t, ts.URL, "burst", "a", 1); d["limit"].(float64) != 2 {
		t.Fatalf("new rule: %v", d)
	}
	// The deny list of the config stays: the body had no deny section.
	if w := authFrom(s, "203.0.113.1:1", "/"); w.Code != 403 {
		t.Fatalf("deny list lost: %d", w.Code)
	}
	// Bad rule sets are rejected with every problem; the rules stay.
	for _, tc := range []struct{ body, mention string }{
		{"rules:\n  - name: x\n    limit: 5/q\n", "5/q"},
		{"rules:\n  - name: x\n    limit: 5/m\n    algoritm: gcra\n", "algoritm"},
		{"store:\n  type: memory\nrules: []\n", "store"},
		{"allow: [10.0.0.0/8]\n", "rules"},
		{"rules: [\n", "YAML"},
		{"- just\n- a list\n", "mapping"},
	} {
		resp, b := call(t, "PUT", ts.URL+"/v1/rules", tc.body, adm...)
		d := decode(t, b)
		if resp.StatusCode != 400 || d["error"] != "invalid_rules" || !strings.Contains(d["detail"].(string), tc.mention) {
			t.Fatalf("PUT %q: %d %s", tc.body, resp.StatusCode, b)
		}
	}
	if _, d := check(t, ts.URL, "burst", "a", 0); d["limit"].(float64) != 2 {
		t.Fatalf("rules changed by a rejected PUT: %v", d)
	}
	// DELETE restores the config's rules.
	resp, _ = call(t, "DELETE", ts.URL+"/v1/rules", "", adm...)
	if resp.StatusCode != 200 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	if code, _ := check(t, ts.URL, "login", "a", 1); code != 200 {
		t.Fatalf("config rules not restored: %d", code)
	}
	_, b = call(t, "GET", ts.URL+"/metrics", "")
	if !strings.Contains(string(b), `weir_config_reloads_total{result="success"} 2`) {
		t.Fatalf("reloads not counted:\n%s", grepLines(string(b), "reloads"))
	}
}

func TestConfigFileReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "weir.yaml")
	write := func(s string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - name: one\n    limit: 1/m\n")
	s, ts := newTestServer(t, WithConfig(nil), WithConfigFile(path))
	if code, _ := check(t, ts.URL, "one", "a", 1); code != 200 {
		t.Fatalf("rule one: %d", code)
	}
	write("rules:\n  - name: two\n    limit: 2/m\n")
	eventually(t, 30*time.Second, "the new file", func() bool {
		_, err := s.Policy().Limit("two", "")
		return err == nil
	})
	write("rules:\n  - name: three\n    limit: nonsense\n")
	_, b := call(t, "GET", ts.URL+"/metrics", "")
	eventually(t, 30*time.Second, "the bad file to be counted", func() bool {
		_, b = call(t, "GET", ts.URL+"/metrics", "")
		return strings.Contains(string(b), `weir_config_reloads_total{result="failure"} 1`)
	})
	if _, err := s.Policy().Limit("two", ""); err != nil {
		t.Fatalf("a bad file replaced the rules: %v", err)
	}
	if !strings.Contains(string(b), `weir_config_reloads_total{result="success"} 1`) {
		t.Fatalf("%s", grepLines(string(b), "reloads"))
	}
	// Reload by hand (SIGHUP) reports the bad file's error.
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), "nonsense") {
		t.Fatalf("Reload: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	s, ts := newTestServer(t)
	for i := range 100 {
		check(t, ts.URL, "api", "identity-"+string(rune('a'+i%26))+"-secret", 1)
	}
	for range 6 {
		check(t, ts.URL, "login", "192.0.2.77", 1)
	}
	check(t, ts.URL, "trial", "x", 1)
	check(t, ts.URL, "trial", "x", 1)
	authFrom(s, "203.0.113.5:1", "/")
	resp, b := call(t, "GET", ts.URL+"/metrics", "")
	body := string(b)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{
		`weir_decisions_total{result="allowed",rule="login"} 3`,
		`weir_decisions_total{result="limited",rule="login"} 3`,
		`weir_decisions_total{result="shadow_limited",rule="trial"} 1`,
		`weir_decisions_total{result="allowed",rule="api"} 100`,
		"# TYPE weir_store_latency_seconds histogram",
		"weir_store_latency_seconds_bucket{le=",
		"weir_store_errors_total 0",
		"weir_circuit_breaker_state 0",
		`weir_config_reloads_total{result="success"} 0`,
		`weir_config_reloads_total{result="failure"} 0`,
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// Label values are bounded: rule names and results, never identities.
	if strings.Contains(body, "secret") || strings.Contains(body, "192.0.2.77") {
		t.Fatalf("an identity leaked into the metrics")
	}
	re := regexp.MustCompile(`(?m)^weir_decisions_total\{result="([^"]*)",rule="([^"]*)"\}`)
	results := map[string]bool{"allowed": true, "limited": true, "shadow_limited": true, "error": true, "denied": true}
	rules := map[string]bool{"login": true, "api": true, "trial": true, "tiered": true, ruleDenyList: true, ruleAllowList: true}
	n := 0
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		n++
		if !results[m[1]] || !rules[m[2]] {
			t.Errorf("unexpected series %s", m[0])
		}
	}
	if n == 0 || n > len(results)*len(rules) {
		t.Fatalf("%d decision series", n)
	}
}

// wrappedErrStore fails every call, as a dead Redis does.
type wrappedErrStore struct{}

func (wrappedErrStore) Take(context.Context, string, weir.Limit, int64) (weir.Result, error) {
	return weir.Result{}, fmt.Errorf("%w: dial tcp 127.0.0.1:1: connection refused", weir.ErrStore)
}
func (wrappedErrStore) Do(context.Context, []weir.Request, []weir.Result) error {
	return fmt.Errorf("%w: dial tcp 127.0.0.1:1: connection refused", weir.ErrStore)
}

func TestHealthAndReadiness(t *testing.T) {
	_, ts := newTestServer(t)
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, b := call(t, "GET", ts.URL+p, ""); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
	s, ts2 := newTestServer(t, WithStore(wrappedErrStore{}))
	if resp, _ := call(t, "GET", ts2.URL+"/healthz", ""); resp.StatusCode != 200 {
		t.Fatalf("healthz with a dead store: %d", resp.StatusCode)
	}
	// Ready all the same: this instance answers (by on_error); the store's
	// own health has its own endpoint and metric.
	resp, b := call(t, "GET", ts2.URL+"/readyz", "")
	if resp.StatusCode != 200 || decode(t, b)["status"] != "ready" || decode(t, b)["store_healthy"] != false {
		t.Fatalf("readyz with a dead store: %d %s", resp.StatusCode, b)
	}
	resp, b = call(t, "GET", ts2.URL+"/healthz/store", "")
	if resp.StatusCode != 503 || decode(t, b)["status"] != "down" || decode(t, b)["last_error"] == nil {
		t.Fatalf("healthz/store with a dead store: %d %s", resp.StatusCode, b)
	}
	if resp, b := call(t, "GET", ts.URL+"/healthz/store", ""); resp.StatusCode != 200 || decode(t, b)["status"] != "up" || decode(t, b)["breaker"] != "closed" {
		t.Fatalf("healthz/store: %d %s", resp.StatusCode, b)
	}
	// Decisions fall back (on_error local by default) and are counted by
	// what the fallback decided; after a few failures the breaker opens.
	for range 10 {
		if code, d := check(t, ts2.URL, "login", "a", 1); code != map[bool]int{true: 200, false: 429}[d["allowed"] == true] || d["fallback"] != "local" {
			t.Fatalf("fallback: %d %v", code, d)
		}
	}
	_, b = call(t, "GET", ts2.URL+"/metrics", "")
	if !strings.Contains(string(b), `weir_decisions_total{result="allowed",rule="login"} 3`) ||
		!strings.Contains(string(b), `weir_fallback_decisions_total{fallback="local",result="limited",rule="login"} 7`) ||
		strings.Contains(string(b), "weir_store_errors_total 0") || !strings.Contains(string(b), "weir_circuit_breaker_state 2") {
		t.Fatalf("%s", grepLines(string(b), "weir_"))
	}
	snap := s.snapshot(httptest.NewRequest("GET", "/v1/dashboard/snapshot", nil))
	if snap.Store.Healthy || snap.Store.Breaker != "open" || snap.Store.Fallback != "local" || snap.Store.ErrorsTotal < 10 {
		t.Fatalf("snapshot store: %+v", snap.Store)
	}
}

func TestTopEndpoint(t *testing.T) {
	_, ts := newTestServer(t, WithAdminToken(token))
	for i := range 5 {
		for range 3 + i + 2 { // identity i is limited i+2 times
			check(t, ts.URL, "login", "192.0.2."+string(rune('0'+i)), 1)
		}
	}
	resp, b := call(t, "GET", ts.URL+"/v1/top?rule=login&n=3", "", bearer(token)...)
	var top struct {
		Rule string     `json:"rule"`
		Top  []TopEntry `json:"top"`
	}
	if err := json.Unmarshal(b, &top); err != nil || resp.StatusCode != 200 || len(top.Top) != 3 ||
		top.Top[0].Identity != "192.0.2.4" || top.Top[0].Count != 6 || top.Top[2].Identity != "192.0.2.2" {
		t.Fatalf("top: %d %s", resp.StatusCode, b)
	}
	_, b = call(t, "GET", ts.URL+"/v1/top", "")
	if !strings.Contains(string(b), `"login":[`) {
		t.Fatalf("all rules: %s", b)
	}
	if resp, _ := call(t, "GET", ts.URL+"/v1/top?rule=api", ""); resp.StatusCode != 200 {
		t.Fatalf("rule without limits: %d", resp.StatusCode)
	}
	for _, q := range []string{"?rule=nope", "?n=0", "?n=x"} {
		if resp, _ := call(t, "GET", ts.URL+"/v1/top"+q, ""); resp.StatusCode/100 != 4 {
			t.Fatalf("%s: %d", q, resp.StatusCode)
		}
	}
}

// slowStore makes every decision take d, ignoring cancellation.
type slowStore struct {
	weir.Store
	d       time.Duration
	started chan struct{}
	once    sync.Once
}

func (s *slowStore) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	if n > 0 {
		s.once.Do(func() { close(s.started) })
		time.Sleep(s.d)
	}
	return s.Store.Take(ctx, key, l, n)
}

func TestShutdownDrainsInFlightRequests(t *testing.T) {
	cfg := mustParse(t, testConfig+"store:\n  timeout: 5s\n")
	store := &slowStore{Store: memstore.New(), d: 500 * time.Millisecond, started: make(chan struct{})}
	s, err := New(WithConfig(cfg), WithStore(store), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	base, stop := serveOn(t, s)
	type result struct {
		code int
		body map[string]any
	}
	done := make(chan result, 1)
	go func() {
		code, d := check(t, base, "login", "192.0.2.1", 1)
		done <- result{code, d}
	}()
	<-store.started
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	r := <-done
	if r.code != 200 || r.body["allowed"] != true {
		t.Fatalf("in-flight request: %d %v", r.code, r.body)
	}
	<-stopped
	// New connections are refused once drained.
	if resp, err := http.Get(base + "/healthz"); err == nil {
		resp.Body.Close()
		t.Fatal("still serving after shutdown")
	}
}

// TestRulesReplaceClientIPHeader: client_ip_header travels with
// trusted_proxies in a run-time replacement, since the two only make sense
// together.
func TestRulesReplaceClientIPHeader(t *testing.T) {
	s, ts := newTestServer(t, WithAdminToken(token))
	body := "trusted_proxies: [10.0.0.0/8]\nclient_ip_header: CF-Connecting-IP\nrules:\n  - name: one\n    match: {path: /}\n    identity: [ip]\n    limit: 1/m\n"
	if resp, b := call(t, "PUT", ts.URL+"/v1/rules", body, bearer(token)...); resp.StatusCode != 200 {
		t.Fatalf("PUT: %d %s", resp.StatusCode, b)
	}
	// Two clients behind one trusted proxy, told apart only by the header
	// the replacement names: each gets its own budget.
	for _, client := range []string{"192.0.2.1", "192.0.2.2"} {
		if w := authFrom(s, "10.0.0.1:1", "/", "CF-Connecting-IP", client); w.Code != 200 {
			t.Fatalf("first request of %s: %d %s", client, w.Code, w.Body)
		}
	}
	if w := authFrom(s, "10.0.0.1:1", "/", "CF-Connecting-IP", "192.0.2.1"); w.Code != 403 {
		t.Fatalf("second request of 192.0.2.1: %d, want 403", w.Code)
	}
}
