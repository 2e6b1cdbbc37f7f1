package server

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// TestNearLimitCounted: an admitted decision that leaves its key at or
// past the rule's near_limit share of the limit counts once in
// weir_near_limit_total{rule} and in the snapshot's near_limit. With 10/m
// at 80%, decisions 8, 9 and 10 count; 1 to 7 do not, nor the limited
// 11th, nor a peek. A rule with near_limit: off counts none, and Envoy
// rules use the global near_limit (90% here: the 9th and 10th).
func TestNearLimitCounted(t *testing.T) {
	ecfg, err := envoyrls.Parse([]byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_log}
`), "edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// sliding_log: no window boundary for the test to cross.
	s, ts := newTestServer(t, WithEnvoyConfig(ecfg), WithConfig(mustParse(t, `
near_limit: 90%
rules:
  - {name: ten, identity: header:X-Key, limit: 10/m, algorithm: sliding_log, near_limit: 80%}
  - {name: quiet, identity: header:X-Key, limit: 10/m, algorithm: sliding_log, near_limit: off}
`)))
	for _, rule := range []string{"ten", "quiet"} {
		for i := 1; i <= 11; i++ {
			code, m := check(t, ts.URL, rule, "k", 1)
			if allowed := m["allowed"] == true; allowed != (i <= 10) || code != map[bool]int{true: 200, false: 429}[allowed] {
				t.Fatalf("%s decision %d: %d %v", rule, i, code, m)
			}
		}
		if code, m := check(t, ts.URL, rule, "k", 0); code != 429 || m["remaining"] != 0.0 {
			t.Fatalf("%s peek: %d %v", rule, code, m)
		}
	}
	body := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.1.1"}]}]}`
	for i := 1; i <= 11; i++ {
		resp, b := call(t, "POST", ts.URL+"/v1/check", body, "Content-Type", "application/json")
		if (resp.StatusCode == 200) != (i <= 10) {
			t.Fatalf("envoy call %d: %d %s", i, resp.StatusCode, b)
		}
	}

	_, b := call(t, "GET", ts.URL+"/metrics", "")
	got := grepLines(string(b), "weir_near_limit_total{")
	want := `weir_near_limit_total{rule="edge.remote_address"} 2` + "\n" + `weir_near_limit_total{rule="ten"} 3`
	if got != want {
		t.Fatalf("near-limit series:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(string(b), `weir_decisions_total{result="allowed",rule="ten"} 10`) ||
		!strings.Contains(string(b), `weir_decisions_total{result="limited",rule="ten"} 2`) {
		t.Fatalf("decisions:\n%s", grepLines(string(b), "weir_decisions_total"))
	}

	_, b = call(t, "GET", ts.URL+"/v1/rules", "")
	for _, w := range []string{`"name":"ten"`, `"near_limit":0.8`, `"near_limit":0,`} {
		if !strings.Contains(string(b), w) {
			t.Fatalf("/v1/rules lacks %s: %s", w, b)
		}
	}

	// The series holds complete seconds: wait for this one to end.
	figures := func(snap Snapshot) string {
		var out []string
		for _, r := range snap.Rules {
			out = append(out, fmt.Sprintf("%s %d/%d@%v", r.Name, r.NearLimit, r.Decisions, r.NearLimitRatio))
		}
		return strings.Join(out, ", ")
	}
	// A peek at a full key counts as limited (its answer), not as near.
	want = "ten 3/12@0.8, quiet 0/12@0, edge.remote_address 2/11@0.9"
	var snap Snapshot
	eventually(t, 30*time.Second, "the snapshot to count the near-limit decisions", func() bool {
		snap = s.snapshot(httptest.NewRequest("GET", "/v1/dashboard/snapshot", nil))
		return figures(snap) == want
	})
	if d := snap.Series.Total; sum(d.Allowed) != 30 || sum(d.Limited) != 5 {
		t.Fatalf("near-limit decisions changed the totals: %+v", figures(snap))
	}
}

// TestNearLimitReplaceable: PUT /v1/rules may change the global near_limit
// along with the rules, as it may shadow.
func TestNearLimitReplaceable(t *testing.T) {
	cfg, present, err := parseReplacement([]byte("near_limit: 50%\nrules: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	base := mustParse(t, "near_limit: off\nrules: []\n")
	if eff := overlayOn(base, cfg, present); eff.NearLimit != "50%" {
		t.Fatalf("near_limit after the replacement: %q", eff.NearLimit)
	}
	if eff := overlayOn(base, mustParse(t, "rules: []\n"), map[string]bool{"rules": true}); eff.NearLimit != "off" {
		t.Fatalf("near_limit after a replacement without it: %q", eff.NearLimit)
	}
}
