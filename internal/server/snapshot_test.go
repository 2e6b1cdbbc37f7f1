package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/weir-dev/weir/internal/redistest"
)

// keysOf returns the sorted keys of a JSON object.
func keysOf(t *testing.T, v any, where string) []string {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s is not an object: %v", where, v)
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func wantKeys(t *testing.T, v any, where string, want ...string) map[string]any {
	t.Helper()
	got := keysOf(t, v, where)
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s has keys %v, want %v", where, got, want)
	}
	return v.(map[string]any)
}

// TestSnapshotContract pins GET /v1/dashboard/snapshot to the shape the
// dashboard reads.
func TestSnapshotContract(t *testing.T) {
	_, ts := newTestServer(t, WithAdminToken(token), WithInstanceID("test-1"), WithVersion("9.9.9"))
	for range 5 {
		check(t, ts.URL, "login", "1.2.3.4", 1)
	}
	check(t, ts.URL, "api", "k", 1)
	resp, b := call(t, "GET", ts.URL+"/v1/dashboard/snapshot", "", bearer(token)...)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	top := wantKeys(t, doc, "snapshot", "now_ms", "instance", "admin_enabled", "identities", "store", "series", "instances", "rules", "top", "blocked", "protect")
	if prot, ok := top["protect"].([]any); !ok || len(prot) != 0 {
		t.Fatalf("protect without protect rules: %v, want []", top["protect"])
	}
	if top["now_ms"].(float64) <= 0 || top["admin_enabled"] != true || top["identities"] != "full" {
		t.Fatalf("now_ms/admin_enabled: %v %v", top["now_ms"], top["admin_enabled"])
	}
	inst := wantKeys(t, top["instance"], "instance", "id", "version")
	if inst["id"] != "test-1" || inst["version"] != "9.9.9" {
		t.Fatalf("instance: %v", inst)
	}
	st := wantKeys(t, top["store"], "store", "type", "topology", "nodes", "healthy", "breaker", "latency_p50_ms", "latency_p99_ms", "errors_total", "fallback", "fallback_since_ms", "fallback_decisions_total", "instances", "leases")
	if st["type"] != "memory" || st["topology"] != "memory" || st["healthy"] != true || st["breaker"] != "closed" || st["fallback"] != "" {
		t.Fatalf("store: %v", st)
	}
	if _, ok := st["nodes"].([]any); !ok {
		t.Fatalf("nodes is not an array: %v", st["nodes"])
	}
	if st["latency_p99_ms"].(float64) <= 0 || st["latency_p99_ms"].(float64) < st["latency_p50_ms"].(float64) {
		t.Fatalf("latency: %v", st)
	}
	series := wantKeys(t, top["series"], "series", "interval_ms", "start_ms", "total", "rules")
	if series["interval_ms"].(float64) != 1000 || series["start_ms"].(float64) > top["now_ms"].(float64)-300000 {
		t.Fatalf("series: interval %v start %v now %v", series["interval_ms"], series["start_ms"], top["now_ms"])
	}
	checkCounts := func(v any, where string) map[string]any {
		c := wantKeys(t, v, where, "allowed", "limited", "shadow_limited", "fallback")
		for k, arr := range c {
			if a, ok := arr.([]any); !ok || len(a) != 300 {
				t.Fatalf("%s.%s: want 300 points, got %v", where, k, arr)
			}
		}
		return c
	}
	checkCounts(series["total"], "series.total")
	rules := series["rules"].(map[string]any)
	for _, name := range []string{"login", "api", "trial", "tiered"} {
		checkCounts(rules[name], "series.rules."+name)
	}

	instances := top["instances"].([]any)
	if len(instances) != 1 {
		t.Fatalf("instances: %v", instances)
	}
	iv := instances[0].(map[string]any)
	for _, k := range []string{"id", "last_seen_ms", "allowed_per_s", "limited_per_s", "shadow_limited_per_s"} {
		if _, ok := iv[k]; !ok {
			t.Fatalf("instance lacks %s: %v", k, iv)
		}
	}

	rs := top["rules"].([]any)
	if len(rs) != 4 {
		t.Fatalf("rules: %v", rs)
	}
	login := wantKeys(t, rs[0], "rules[0]", "name", "match", "identity", "limit", "algorithm", "shadow", "block", "tiers",
		"decisions", "limited_pct", "near_limit", "near_limit_ratio", "latency_p50_ms", "latency_p99_ms", "spark")
	if login["name"] != "login" || login["match"] != "POST /api/login" || login["identity"] != "ip" || login["limit"] != "3/m" ||
		login["algorithm"] != "sliding_log" || login["block"] != "1m" || login["shadow"] != false {
		t.Fatalf("login rule: %v", login)
	}
	if spark := login["spark"].([]any); len(spark) != 60 {
		t.Fatalf("spark has %d points", len(spark))
	}
	tiered := rs[3].(map[string]any)
	tiers := tiered["tiers"].([]any)
	if len(tiers) != 2 {
		t.Fatalf("tiers: %v", tiered)
	}
	wantKeys(t, tiers[0], "tiers[0]", "name", "limit", "algorithm")

	topLimited := top["top"].(map[string]any)
	l := topLimited["login"].([]any)
	e := l[0].(map[string]any)
	if e["identity"] != "1.2.3.4" || e["count"].(float64) != 2 {
		t.Fatalf("top: %v", topLimited)
	}
	blocked := top["blocked"].([]any)
	if len(blocked) != 1 {
		t.Fatalf("blocked: %v", blocked)
	}
	be := wantKeys(t, blocked[0], "blocked[0]", "rule", "identity", "blocked_until_ms")
	if be["rule"] != "login" || be["identity"] != "1.2.3.4" || be["blocked_until_ms"].(float64) <= top["now_ms"].(float64) {
		t.Fatalf("blocked: %v", be)
	}
}

// TestSnapshotCountsDecisions checks that the current second's decisions
// reach the series once it completes.
func TestSnapshotCountsDecisions(t *testing.T) {
	s, ts := newTestServer(t)
	for range 4 {
		check(t, ts.URL, "login", "1.2.3.4", 1)
	}
	eventually(t, 30e9, "the second to complete", func() bool {
		snap := s.snapshot(newReq())
		login := snap.Series.Rules["login"]
		return login != nil && sum(login.Allowed) == 3 && sum(login.Limited) == 1 &&
			sum(snap.Series.Total.Allowed) == 3 && snap.Rules[0].Decisions == 4 && snap.Rules[0].LimitedPct == 25
	})
}

func newReq() *http.Request { return httptest.NewRequest("GET", "/v1/dashboard/snapshot", nil) }

// TestSnapshotNodesNeedAdmin: the public snapshot (no admin token) lists
// no Redis node address; with the admin token it lists them.
func TestSnapshotNodesNeedAdmin(t *testing.T) {
	r := redistest.Standalone(t)
	_, base := newRedisServer(t, r.Addr, "a")
	nodes := func(hdr ...string) []any {
		resp, b := call(t, "GET", base+"/v1/dashboard/snapshot", "", hdr...)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if strings.Contains(string(b), r.Addr) && len(hdr) == 0 {
			t.Fatalf("the public snapshot names the Redis address %s", r.Addr)
		}
		n, ok := decode(t, b)["store"].(map[string]any)["nodes"].([]any)
		if !ok {
			t.Fatalf("nodes is not an array: %s", b)
		}
		return n
	}
	if n := nodes(bearer(token)...); len(n) != 1 || n[0] != r.Addr {
		t.Fatalf("with the admin token: nodes %v, want [%s]", n, r.Addr)
	}
	if n := nodes(); len(n) != 0 {
		t.Fatalf("without the admin token: nodes %v, want []", n)
	}
}
