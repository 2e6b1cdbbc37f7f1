package server

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
)

// TestDenyCacheServe: weir serve on Redis answers a flooded key's denials
// from memory, an unblock on another instance reaches this one's cache,
// and the metrics and the dashboard show it.
func TestDenyCacheServe(t *testing.T) {
	r := redistest.Standalone(t)
	a, baseA := newRedisServer(t, r.Addr, "a")
	b, baseB := newRedisServer(t, r.Addr, "b")
	if a.deny == nil || b.deny == nil {
		t.Fatal("no deny cache on a Redis store (on by default)")
	}
	if a.stack != weir.Store(a.deny) || a.holder.Load().Guard() != a.guard {
		t.Fatal("the deny cache is not in front of the guard: decisions must enter at the cache, fall back through the guard")
	}
	eventually(t, time.Minute, "both caches live", func() bool { return a.deny.Live() && b.deny.Live() })
	allowed := 0
	for range 20 {
		if _, d := check(t, baseA, "api", "k", 1); d["allowed"] == true {
			allowed++
		}
	}
	if allowed != 5 {
		t.Fatalf("%d of 20 allowed under 5/m", allowed)
	}
	if st := a.deny.Stats(); st.Hits < 10 {
		t.Fatalf("denials not answered from memory: %+v", st)
	}
	code, d := check(t, baseA, "api", "k", 1)
	if code != 429 || d["allowed"] != false {
		t.Fatalf("cached answer: %d %v", code, d)
	}
	if ra, _ := d["retry_after_ms"].(float64); ra <= 0 {
		t.Fatalf("a cached denial without retry_after: %v", d)
	}
	before := a.deny.Stats().Invalidations["reset"]
	if resp, body := call(t, "DELETE", baseB+"/v1/state?rule=api&key=k", "", bearer(token)...); resp.StatusCode != 200 {
		t.Fatalf("reset on b: %d %s", resp.StatusCode, body)
	}
	eventually(t, time.Minute, "a hears of b's reset", func() bool { return a.deny.Stats().Invalidations["reset"] > before })
	if _, d := check(t, baseA, "api", "k", 1); d["allowed"] != true {
		t.Fatalf("after a reset on another instance: %v", d)
	}
	_, body := call(t, "GET", baseA+"/metrics", "")
	for _, want := range []string{"weir_deny_cache_hits_total ", "weir_deny_cache_herd_total ", "weir_deny_cache_misses_total ", `weir_deny_cache_invalidations_total{reason="reset"}`, "weir_deny_cache_live 1"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// A rule change on b flushes every instance's cache.
	flushes := a.deny.Stats().Invalidations["flush"]
	if resp, body := call(t, "PUT", baseB+"/v1/rules", "rules:\n  - name: api\n    limit: 7/m\n", bearer(token)...); resp.StatusCode != 200 {
		t.Fatalf("PUT /v1/rules: %d %s", resp.StatusCode, body)
	}
	eventually(t, time.Minute, "a's cache flushed after a rule change", func() bool { return a.deny.Stats().Invalidations["flush"] > flushes })
	snap := a.snapshot(httptest.NewRequest("GET", "/v1/dashboard/snapshot", nil))
	if dc := snap.Store.DenyCache; dc == nil || dc.HitsTotal < 10 || !dc.Live {
		t.Fatalf("snapshot: %+v", dc)
	}
}

func TestDenyCacheOff(t *testing.T) {
	r := redistest.Standalone(t)
	s, err := New(WithConfig(mustParse(t, testConfig+"store:\n  timeout: 2s\n  deny_cache: false\n")), WithRedisURL("redis://"+r.Addr),
		WithAdminToken(token), WithLogger(quietLogger()), withFastLoops())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.deny != nil || s.snapshot(httptest.NewRequest("GET", "/v1/dashboard/snapshot", nil)).Store.DenyCache != nil {
		t.Fatal("store.deny_cache: false left a deny cache")
	}
}
