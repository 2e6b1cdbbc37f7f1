// Package grafana holds weir's Grafana dashboard, weir.json; its test
// checks every query.
package grafana

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/weir-dev/weir/internal/promtest"
)

// TestDashboardQueries: every panel has queries; every metric they name
// is one weir serve exports; promtool parses each as PromQL. The
// Prometheus end-to-end test (examples/prometheus) also evaluates them
// against a real Prometheus scraping weir serve.
func TestDashboardQueries(t *testing.T) {
	exported := promtest.Exported(t, filepath.Join("..", ".."))
	exprs := promtest.DashboardExprs(t, "weir.json", "1m", ".*", ".*")
	for name, e := range exprs {
		if !strings.Contains(e, "weir_") {
			t.Errorf("%s: %q reads no weir metric", name, e)
		}
		if bad := promtest.Unknown(e, exported); len(bad) > 0 {
			t.Errorf("%s: %q names metrics weir does not export: %v", name, e, bad)
		}
	}
	// The near-limit signal is on the dashboard.
	var near bool
	for _, e := range exprs {
		near = near || strings.Contains(e, "weir_near_limit_total")
	}
	if !near {
		t.Error("no panel shows weir_near_limit_total")
	}
	promtest.CheckExprs(t, exprs)
}

// TestUnknownCatchesTypos: the name check fails a misspelt metric, so
// TestDashboardQueries would.
func TestUnknownCatchesTypos(t *testing.T) {
	exported := promtest.Exported(t, filepath.Join("..", ".."))
	if bad := promtest.Unknown(`rate(weir_decision_total[1m]) + weir_store_latency_seconds_bucket + rule:weir_x:rate5m`, exported); len(bad) != 1 || bad[0] != "weir_decision_total" {
		t.Fatalf("Unknown = %v", bad)
	}
}
