package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// leaseConfig has one leased rule, a global limit keyed by a constant, and
// takes its instance count from the fleet registry.
const leaseConfig = `
instances: auto
instances_floor: 1
store:
  timeout: 2s
rules:
  - {name: global, identity: const:all, limit: 90/h, algorithm: fixed_window, lease: 20}
`

// TestRedisLeaseAndInstancesAuto: two instances on one Redis. instances:
// auto finds both in the fleet registry, and when one shuts down, one; a
// leased rule admits exactly its limit across both, its lease capped at
// 90 / 2 instances; the dashboard snapshot and the metrics show the lease.
func TestRedisLeaseAndInstancesAuto(t *testing.T) {
	r := redistest.Standalone(t)
	cfg := WithConfig(mustParse(t, leaseConfig))
	a, baseA := newRedisServer(t, r.Addr, "a", cfg)
	b, baseB := newRedisServer(t, r.Addr, "b", cfg)
	eventually(t, 30*time.Second, "both instances to count two", func() bool {
		return a.Policy().Instances() == 2 && b.Policy().Instances() == 2
	})
	allowed := 0
	for i := range 200 {
		base := []string{baseA, baseB}[i%2]
		if _, d := check(t, base, "global", "all", 1); d["allowed"] == true {
			allowed++
		}
	}
	if allowed != 90 {
		t.Errorf("%d of 200 admitted across two instances under 90/h with lease 20, want 90", allowed)
	}
	// The requests alternate, so a takes 20, b 20, a 20, b 20, a the
	// last 10 (a lease of 20 is under 90/2), and each then one refusal
	// that it remembers: four calls on a, three on b, for 200 decisions.
	sa, sb := a.leases.Stats(), b.leases.Stats()
	if sa.Taken != 50 || sa.Spent != 50 || sb.Taken != 40 || sb.Spent != 40 || sa.Calls != 4 || sb.Calls != 3 {
		t.Errorf("a: %+v, b: %+v; want 50 and 40 taken and spent, in 4 and 3 calls", sa, sb)
	}
	_, body := call(t, "GET", baseA+"/v1/dashboard/snapshot", "")
	var snap Snapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		t.Fatal(err)
	}
	if len(snap.Rules) != 1 || snap.Rules[0].Lease != 20 || snap.Store.Instances != 2 || snap.Store.Leases.Spent != 50 {
		t.Errorf("snapshot: rules %+v, store %+v", snap.Rules, snap.Store)
	}
	resp, err := http.Get(baseA + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`weir_lease_units_total{event="spent"} 50`, `weir_lease_calls_total{result="empty"} 1`, `weir_instances 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// b shuts down: it withdraws its report, and a counts one.
	b.Close()
	eventually(t, 30*time.Second, "a to count one instance", func() bool { return a.Policy().Instances() == 1 })
}
