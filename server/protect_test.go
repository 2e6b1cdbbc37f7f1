package server

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestProtectMetricsAndSnapshot: weir serve applies its config's protect
// rules to its own API, and reports them in /metrics and the dashboard
// snapshot; probes and scrapes are not counted.
func TestProtectMetricsAndSnapshot(t *testing.T) {
	cfg := testConfig + `
protect:
  - name: checks
    match: {path: /v1/check}
    concurrency: 5
    priority: header:X-Priority
    reserve: 20%
  - name: deps
    match: {path: /v1/nothing}
    breaker: {errors: 5}
system:
  max_inflight: 100
`
	_, ts := newTestServer(t, WithConfig(mustParse(t, cfg)))
	for range 3 {
		resp, _ := call(t, "POST", ts.URL+"/v1/check", `{"rule":"api","key":"k"}`, "X-Priority", "critical")
		if resp.StatusCode >= 500 {
			t.Fatalf("check: %d", resp.StatusCode)
		}
	}
	call(t, "GET", ts.URL+"/healthz", "")
	_, body := call(t, "GET", ts.URL+"/metrics", "")
	m := string(body)
	for _, want := range []string{
		`weir_protect_limit{protect="checks"} 5`,
		`weir_protect_in_flight{protect="checks"} 0`,
		`weir_protect_admitted_total{priority="critical",protect="checks"} 3`,
		`weir_protect_shed_total{priority="sheddable",protect="checks"} 0`,
		`weir_protect_limit{protect="system"} 100`,
		`weir_protect_breaker_state{protect="deps"} 0`,
		`weir_protect_breaker_transitions_total{protect="deps",state="open"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(m, `weir_protect_breaker_state{protect="checks"}`) {
		t.Error("a breaker state for a rule without a breaker")
	}
	_, body = call(t, "GET", ts.URL+"/v1/dashboard/snapshot", "")
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	// The JSON contract with the dashboard (protect.js).
	wantKeys(t, doc["protect"].([]any)[2], "protect entry", "name", "adaptive", "shadow", "limit", "in_flight",
		"base_rtt_ms", "admitted", "shed", "circuit_open", "breaker", "transitions")
	var snap Snapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Protect) != 3 {
		t.Fatalf("snapshot protect: %+v", snap.Protect)
	}
	sys, checks, deps := snap.Protect[0], snap.Protect[1], snap.Protect[2]
	// The system section saw the checks and the metrics scrape is exempt,
	// but this snapshot request itself is in flight.
	if sys.Name != "system" || sys.Admitted["normal"] != 3+1 || sys.InFlight != 1 {
		t.Errorf("system: %+v", sys)
	}
	if checks.Name != "checks" || checks.Admitted["critical"] != 3 || checks.Limit != 5 || checks.Breaker != "" {
		t.Errorf("checks: %+v", checks)
	}
	if deps.Breaker != "closed" || deps.Limit != 0 {
		t.Errorf("deps: %+v", deps)
	}
}
