// Package prometheus holds weir's Prometheus alerting and recording rules;
// its tests check them against weir's metrics and a real Prometheus.
// promtool's unit tests (tests.yml) run with make promtool-test.
package prometheus

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/promtest"
	"github.com/weir-dev/weir/internal/server"
	"github.com/weir-dev/weir/policy"
)

var exprLine = regexp.MustCompile(`(?m)^\s+expr:\s*(\|?)(.*)$`)

// TestRulesMetricNames: every weir metric the rules read is one weir
// serve exports.
func TestRulesMetricNames(t *testing.T) {
	exported := promtest.Exported(t, filepath.Join("..", ".."))
	n := 0
	for _, f := range []string{"recording.yml", "alerts.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// The whole file: multi-line expressions included; recording rule
		// names (with colons) are not metric names.
		if bad := promtest.Unknown(string(b), exported); len(bad) > 0 {
			t.Errorf("%s names metrics weir does not export: %v", f, bad)
		}
		n += len(exprLine.FindAll(b, -1))
	}
	if n < 15 {
		t.Fatalf("found %d expressions; the rule files have 15", n)
	}
}

// testRules writes copies of the rule files for a fast test: windows of
// 30s instead of minutes, and every for: of 5s.
func testRules(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	win := regexp.MustCompile(`\[(1m|5m|15m)\]`)
	forLine := regexp.MustCompile(`(?m)^(\s+for:)\s*\S+$`)
	var out []string
	for _, f := range []string{"recording.yml", "alerts.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b = win.ReplaceAll(b, []byte("[30s]"))
		b = forLine.ReplaceAll(b, []byte("$1 5s"))
		p := filepath.Join(dir, f)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestPrometheusE2E starts weir serve, with mutual TLS, and a real
// Prometheus (Debian's) scraping it over HTTPS with a client certificate
// and the example rules, drives traffic that a rule mostly limits, and
// waits for WeirHighLimitedShare to fire for that rule, and only for it;
// the store alerts stay quiet, every rule evaluates without error, and
// every dashboard query evaluates, those over decisions with data.
func TestPrometheusE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus")
	}
	promtest.Require(t, "prometheus")
	cfg, err := policy.Parse([]byte("rules:\n  - name: api\n    limit: 5/m\n    algorithm: sliding_log\n  - name: quiet\n    limit: 1000/m\n"), "e2e.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pki := certtest.New(t)
	srv, err := server.New(server.WithConfig(cfg), server.WithAdminToken(""), server.WithTLS(pki.Cert, pki.Key, pki.CA),
		server.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, hl, nil) }()
	defer func() { cancel(); <-served }()
	base := "https://" + hl.Addr().String()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(true)}, Timeout: 10 * time.Second}

	prom := promtest.Start(t, promtest.Target{Addr: hl.Addr().String(), CA: pki.CA, Cert: pki.ClientCert, Key: pki.ClientKey}, testRules(t)...)

	// Traffic until the test ends: "api" admits 5 a minute of ~20 a
	// second, "quiet" admits all.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, rule := range []string{"api", "quiet"} {
				body, _ := json.Marshal(map[string]any{"rule": rule, "key": "client-1", "hits": 1})
				resp, err := client.Post(base+"/v1/check", "application/json", bytes.NewReader(body))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	deadline := time.Now().Add(3 * time.Minute)
	var alerts []promtest.Alert
	for {
		alerts, err = prom.Alerts()
		firing := false
		for _, a := range alerts {
			if a.Labels["alertname"] == "WeirHighLimitedShare" && a.State == "firing" {
				if a.Labels["rule"] != "api" {
					t.Fatalf("WeirHighLimitedShare fired for rule %q: %+v", a.Labels["rule"], a)
				}
				firing = true
			}
		}
		if firing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("WeirHighLimitedShare not firing after 3 minutes; alerts %+v (err %v)", alerts, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, a := range alerts {
		switch a.Labels["alertname"] {
		case "WeirStoreErrors", "WeirCircuitBreakerOpen", "WeirStoreDown", "WeirFallbackInUse", "WeirConfigReloadFailed":
			t.Errorf("%s is active on a healthy memory store: %+v", a.Labels["alertname"], a)
		}
	}
	bad, err := prom.RuleHealth()
	if err != nil || len(bad) > 0 {
		t.Errorf("rule evaluation: %v %v", bad, err)
	}
	share, err := prom.Query(`rule:weir_limited_share:ratio_rate5m{rule="api"}`)
	if err != nil || len(share) != 1 || share[0].Value < 0.5 {
		t.Errorf("recorded limited share of api: %+v %v", share, err)
	}

	// The dashboard's queries against the real Prometheus.
	for name, e := range promtest.DashboardExprs(t, filepath.Join("..", "grafana", "weir.json"), "30s", "weir", ".*") {
		res, err := prom.Query(e)
		if err != nil {
			t.Errorf("dashboard %s: %v", name, err)
			continue
		}
		if strings.Contains(e, "weir_decisions_total") && !strings.Contains(e, "weir_near_limit_total") && len(res) == 0 {
			t.Errorf("dashboard %s: %q has no data while weir decides", name, e)
		}
	}
}
