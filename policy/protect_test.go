package policy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/protect"
)

// protectDoc is a protect and a system section with their common keys.
const protectDoc = `
rules: []
protect:
  - name: api
    match: {path: /api/}
    concurrency: adaptive      # or a fixed number of requests in flight
    max_concurrency: 1000
    priority: header:X-Priority
    reserve: 20%
  - name: payments
    match: {path: /api/pay}
    breaker: {slow_call: 500ms, slow_ratio: 0.5, error_ratio: 0.5, errors: 0, min_requests: 20, window: 10s, open_for: 10s}
system:
  max_cpu: 85%
  max_inflight: 2000
`

func TestParseProtect(t *testing.T) {
	cfg, err := Parse([]byte(protectDoc), "weir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []config.ProtectConfig{
		{Name: "api", Match: config.MatchConfig{Path: "/api/"}, Adaptive: true, MaxConcurrency: 1000, Priority: "header:X-Priority", Reserve: "20%"},
		{Name: "payments", Match: config.MatchConfig{Path: "/api/pay"}, Breaker: &protect.BreakerConfig{
			SlowCall: 500 * time.Millisecond, SlowRatio: 0.5, ErrorRatio: 0.5, MinRequests: 20, Window: 10 * time.Second, OpenFor: 10 * time.Second}},
	}
	if len(cfg.Protect) != 2 {
		t.Fatalf("protect: %+v", cfg.Protect)
	}
	for i := range want {
		g, w := cfg.Protect[i], want[i]
		if (g.Breaker == nil) != (w.Breaker == nil) || g.Breaker != nil && *g.Breaker != *w.Breaker {
			t.Errorf("protect[%d].breaker = %+v, want %+v", i, g.Breaker, w.Breaker)
		}
		g.Breaker, w.Breaker = nil, nil
		if g.Name != w.Name || g.Match.Path != w.Match.Path || g.Adaptive != w.Adaptive || g.MaxConcurrency != w.MaxConcurrency ||
			g.Priority != w.Priority || g.Reserve != w.Reserve || g.Concurrency != w.Concurrency {
			t.Errorf("protect[%d] = %+v, want %+v", i, g, w)
		}
	}
	if cfg.System != (config.SystemConfig{MaxCPU: "85%", MaxInFlight: 2000}) {
		t.Errorf("system = %+v", cfg.System)
	}
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := p.ProtectStats()
	if len(st) != 3 || st[0].Name != SystemRule || st[0].Limit != 2000 || st[1].Name != "api" || !st[1].Adaptive || st[2].Name != "payments" || !st[2].Breaker {
		t.Fatalf("stats %+v", st)
	}
}

// TestProtectValidation: every bad value in the list below is refused
// with its line and column, and the message names it.
func TestProtectValidation(t *testing.T) {
	doc := `protect:
  - name: a
    concurrency: adaptive
    min_concurrency: 50
    max_concurrency: 10
    reserve: 120%
    priority: X-Priority
  - name: b
    breaker: {slow_call: -1s, slow_ratio: 1.5, error_ratio: 2, min_requests: 0}
  - name: c
    concurrency: lots
  - name: d
    concurrency: 5
    reserve: 10%
system:
  max_cpu: 185%
  max_inflight: 0
`
	_, err := Parse([]byte(doc), "weir.yaml")
	if err == nil {
		t.Fatal("accepted")
	}
	got := err.Error()
	for _, want := range []string{
		`weir.yaml:4:22: min_concurrency 50 is above max_concurrency 10`,
		`weir.yaml:6:14: reserve "120%" must be a share of the limit from 0% to below 100%`,
		`weir.yaml:7:15: priority "X-Priority" must be header:NAME`,
		`weir.yaml:9:26: slow_call must be positive, got "-1s"`,
		`weir.yaml:9:43: slow_ratio must be between 0 and 1, got 1.5`,
		`weir.yaml:9:61: error_ratio must be between 0 and 1, got 2`,
		`weir.yaml:9:78: min_requests must be at least 1, got 0`,
		`weir.yaml:11:18: concurrency must be adaptive or a number of requests in flight of at least 1, got "lots"`,
		`weir.yaml:14:14: reserve keeps a share for critical requests, and without priority no request is critical`,
		`weir.yaml:16:12: max_cpu "185%" must be a share of the CPU above 0% and at most 100%`,
		`weir.yaml:17:17: max_inflight must be at least 1, got 0`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

// TestMiddlewareProtect: through policy.Middleware, a request beyond the
// limit gets 503 with the problem body; a critical one uses the reserve
// only where the rule names the header, and a made-up priority value is
// normal.
func TestMiddlewareProtect(t *testing.T) {
	doc := `
protect:
  - name: api
    match: {path: /api/}
    concurrency: 10
    priority: header:X-Priority
    reserve: 20%
  - name: other
    match: {path: /other/}
    concurrency: 1
`
	p := mustPolicy(t, doc, nil)
	hold := make(chan struct{})
	var entered sync.WaitGroup
	h := Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			entered.Done()
			<-hold
		}
	}))
	var done sync.WaitGroup
	start := func(target string, hdr ...string) {
		entered.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req("GET", target, hdr...))
			if rec.Code != 200 {
				t.Errorf("%s: %d", target, rec.Code)
			}
		}()
		entered.Wait()
	}
	for range 8 {
		start("/api/x?hold=1")
	}
	do := func(target string, hdr ...string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req("GET", target, hdr...))
		return rec
	}
	// 8 in flight: normal ones stop at 8 (reserve 20% of 10).
	for _, v := range []string{"", "normal", "CRITICAL!", "urgent"} {
		rec := do("/api/y", "X-Priority", v)
		if rec.Code != 503 || !strings.Contains(rec.Body.String(), `"error":"overloaded","protect":"api"`) || rec.Header().Get("Retry-After") != "1" {
			t.Fatalf("priority %q at 8 in flight: %d %s", v, rec.Code, rec.Body)
		}
	}
	start("/api/x?hold=1", "X-Priority", "critical")
	start("/api/x?hold=1", "X-Priority", "critical")
	if rec := do("/api/y", "X-Priority", "critical"); rec.Code != 503 {
		t.Fatalf("critical at 10 in flight: %d", rec.Code)
	}
	// The other rule names no header: critical means nothing there.
	start("/other/?hold=1", "X-Priority", "critical")
	if rec := do("/other/", "X-Priority", "critical"); rec.Code != 503 || !strings.Contains(rec.Body.String(), `"protect":"other"`) {
		t.Fatalf("other rule: %d %s", rec.Code, rec.Body)
	}
	close(hold)
	done.Wait()
	for _, s := range p.ProtectStats() {
		if s.InFlight != 0 {
			t.Fatalf("%s: %d still in flight", s.Name, s.InFlight)
		}
	}
	if rec := do("/api/y"); rec.Code != 200 {
		t.Fatalf("after: %d", rec.Code)
	}
}

// TestMiddlewareBreaker: 5xx answers and panics open the breaker, which
// then answers circuit_open without calling the handler.
func TestMiddlewareBreaker(t *testing.T) {
	doc := `
protect:
  - name: payments
    match: {path: /pay}
    breaker: {errors: 3, min_requests: 3, open_for: 10s}
`
	clock := newClock()
	p := mustPolicy(t, doc, nil, WithClock(clock.Now))
	calls := 0
	h := Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if r.URL.Query().Get("panic") != "" {
			panic("boom")
		}
		w.WriteHeader(http.StatusInternalServerError)
	}))
	for i := range 3 {
		func() {
			defer func() { _ = recover() }()
			target := "/pay"
			if i == 2 {
				target = "/pay?panic=1"
			}
			h.ServeHTTP(httptest.NewRecorder(), req("POST", target))
		}()
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req("POST", "/pay"))
	var body map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if rec.Code != 503 || body["error"] != "circuit_open" || body["protect"] != "payments" || rec.Header().Get("Retry-After") != "10" {
		t.Fatalf("%d %v %v", rec.Code, rec.Header(), body)
	}
	if calls != 3 {
		t.Fatalf("handler called %d times, want 3", calls)
	}
}

// TestReloadKeepsInFlight: a reload through the Holder lowers the limit;
// the requests admitted before it still count against the new limit and
// give their slots back when done.
func TestReloadKeepsInFlight(t *testing.T) {
	mk := func(n string) *Policy {
		return mustPolicy(t, "protect:\n  - name: api\n    concurrency: "+n+"\n", nil)
	}
	h := NewHolder(mk("5"))
	old := h.Load()
	var held []*Admission
	for range 4 {
		a, rej := old.Protect(req("GET", "/"))
		if rej != nil {
			t.Fatal(rej)
		}
		held = append(held, a)
	}
	h.Swap(mk("4"))
	cur := h.Load()
	if _, rej := cur.Protect(req("GET", "/")); rej == nil {
		t.Fatal("admitted a fifth request under a limit of 4 with 4 in flight from before the reload")
	}
	for _, a := range held {
		a.Done(false)
	}
	st := cur.ProtectStats()
	if st[0].InFlight != 0 || st[0].Limit != 4 {
		t.Fatalf("after the old requests ended: %+v", st[0])
	}
	if a, rej := cur.Protect(req("GET", "/")); rej != nil {
		t.Fatal(rej)
	} else {
		a.Done(false)
	}
}

// TestProtectionDocExamples parses the yaml blocks of docs/protection.md.
func TestProtectionDocExamples(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "protection.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(data), "```yaml\n")
	if len(blocks) < 2 {
		t.Fatal("no yaml block in docs/protection.md")
	}
	for i, b := range blocks[1:] {
		doc := b[:strings.Index(b, "```")]
		if _, err := Parse([]byte(doc), "protection.md"); err != nil {
			t.Errorf("docs/protection.md yaml block %d:\n%s\n%v", i+1, doc, err)
		}
	}
}
