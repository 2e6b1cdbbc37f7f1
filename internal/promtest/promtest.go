// Package promtest checks weir's Prometheus examples: the metric names
// that rules and dashboards use against those weir exports, PromQL through
// promtool, and a real Prometheus (Debian's package) scraping a test's
// weir serve.
package promtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Require returns the path of the Prometheus binary name ("promtool" or
// "prometheus"); without it the test is skipped, or fails when the CI
// environment variable is set (make deps installs Debian's prometheus).
func Require(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("promtest: %s not found (%v); CI is set: install Debian's prometheus package (make deps)", name, err)
	}
	t.Skipf("promtest: %s not found (%v)", name, err)
	return ""
}

var metricDef = regexp.MustCompile(`Name:\s*"(weir_[a-z0-9_]+)"`)

// Exported returns the names of the metrics weir serve exports, read from
// the metric definitions in the server package's sources under root (the
// module's root directory). A histogram's series (_bucket, _sum, _count)
// count as its name.
func Exported(t testing.TB, root string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "internal", "server", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("promtest: no server sources under %s: %v", root, err)
	}
	names := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range metricDef.FindAllSubmatch(b, -1) {
			names[string(m[1])] = true
		}
	}
	if !names["weir_decisions_total"] {
		t.Fatalf("promtest: weir_decisions_total not found among %v: the scan is broken", names)
	}
	return names
}

// metricRef matches a metric name in PromQL: weir_ and name characters,
// not part of a recording rule's name (which holds colons).
var metricRef = regexp.MustCompile(`(^|[^a-zA-Z0-9_:])(weir_[a-zA-Z0-9_]+)`)

// Unknown returns the weir metric names expr uses that exported lacks.
func Unknown(expr string, exported map[string]bool) []string {
	var out []string
	for _, m := range metricRef.FindAllStringSubmatch(expr, -1) {
		n := m[2]
		base := n
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suf); ok && exported[b] {
				base = b
			}
		}
		if !exported[base] {
			out = append(out, n)
		}
	}
	return out
}

// CheckExprs parses every expression with promtool, as the expressions of
// recording rules; names label the failures.
func CheckExprs(t testing.TB, exprs map[string]string) {
	t.Helper()
	promtool := Require(t, "promtool")
	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		// One file per expression, so that a failure names its expression.
		rules := "groups:\n  - name: check\n    rules:\n      - record: promtest:check\n        expr: " + strconv.Quote(exprs[k]) + "\n"
		f := filepath.Join(t.TempDir(), "rules.yml")
		if err := os.WriteFile(f, []byte(rules), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
			t.Errorf("%s: promtool rejects %q: %v\n%s", k, exprs[k], err, out)
		}
	}
}

// Prometheus is a running Prometheus server.
type Prometheus struct {
	URL string
}

// Target is what Prometheus scrapes: /metrics at Addr (host:port), over
// HTTPS when CA is set, presenting Cert and Key if set (mutual TLS).
type Target struct {
	Addr          string
	CA, Cert, Key string
}

// Start runs Prometheus scraping target every second with the rule files
// ruleFiles, evaluated every second, and stops it when t ends. If another
// process takes its port first, it tries again on another.
func Start(t testing.TB, target Target, ruleFiles ...string) *Prometheus {
	t.Helper()
	bin := Require(t, "prometheus")
	dir := t.TempDir()
	var rf strings.Builder
	for _, f := range ruleFiles {
		rf.WriteString("  - " + strconv.Quote(f) + "\n")
	}
	tlsCfg := ""
	if target.CA != "" {
		tlsCfg = fmt.Sprintf("    scheme: https\n    tls_config:\n      ca_file: %q\n", target.CA)
		if target.Cert != "" {
			tlsCfg += fmt.Sprintf("      cert_file: %q\n      key_file: %q\n", target.Cert, target.Key)
		}
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
%sscrape_configs:
  - job_name: weir
%s    static_configs:
      - targets: [%q]
`, rf.String(), tlsCfg, target.Addr)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		p, log, err := start(t, bin, cfgPath, filepath.Join(dir, fmt.Sprintf("data%d", attempt)))
		if err == nil {
			return p
		}
		if attempt < 3 && strings.Contains(log, "address already in use") {
			continue
		}
		t.Fatalf("promtest: %v\n%s", err, log)
	}
}

// start runs one Prometheus on a free port and waits until it is ready;
// on failure it returns its log.
func start(t testing.TB, bin, cfgPath, dataDir string) (*Prometheus, string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.Create(dataDir + ".log")
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+dataDir, "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, "", err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		logf.Close()
	})
	p := &Prometheus{URL: "http://" + addr}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p, "", nil
			}
		}
		select {
		case <-done:
			log, _ := os.ReadFile(logf.Name())
			return nil, string(log), errors.New("prometheus exited")
		default:
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			return nil, string(log), errors.New("prometheus not ready after 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Sample is one series of a query's answer.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// Query evaluates expr now; an error is Prometheus's refusal.
func (p *Prometheus) Query(expr string) ([]Sample, error) {
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string            `json:"resultType"`
			Result     []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(expr), &body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, body.Error)
	}
	var out []Sample
	for _, r := range body.Data.Result {
		var s struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(r, &s); err != nil {
			return nil, err
		}
		v, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
		out = append(out, Sample{s.Metric, v})
	}
	return out, nil
}

// Alert is an active alert.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// Alerts returns the active (pending and firing) alerts.
func (p *Prometheus) Alerts() ([]Alert, error) {
	var body struct {
		Data struct {
			Alerts []Alert `json:"alerts"`
		} `json:"data"`
	}
	err := p.get("/api/v1/alerts", &body)
	return body.Data.Alerts, err
}

// RuleHealth returns the rules whose last evaluation failed, with why.
func (p *Prometheus) RuleHealth() ([]string, error) {
	var body struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/rules", &body); err != nil {
		return nil, err
	}
	var bad []string
	n := 0
	for _, g := range body.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				bad = append(bad, r.Name+": "+r.LastError)
			}
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("no rules loaded")
	}
	return bad, nil
}

func (p *Prometheus) get(path string, v any) error {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(p.URL + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	return nil
}

// DashboardExprs returns the PromQL of every target and templating query
// of the Grafana dashboard at path, keyed by panel title and refId, with
// Grafana's variables replaced: $__rate_interval by rateInterval, $job and
// $rule by the given values.
func DashboardExprs(t testing.TB, path, rateInterval, job, rule string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	r := strings.NewReplacer("$__rate_interval", rateInterval, "$job", job, "$rule", rule)
	out := map[string]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", path, p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: panel %q target %s has no expr", path, p.Title, tg.RefID)
			}
			out[p.Title+" "+tg.RefID] = r.Replace(tg.Expr)
		}
	}
	// label_values(metric{...}, label) queries: the selector is PromQL.
	lv := regexp.MustCompile(`^label_values\((.+),\s*[a-z_]+\)$`)
	for _, v := range d.Templating.List {
		q, _ := v.Query.(string)
		if v.Type != "query" {
			continue
		}
		m := lv.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("%s: variable %s: query %q is not label_values(selector, label)", path, v.Name, q)
			continue
		}
		out["variable "+v.Name] = r.Replace(m[1])
	}
	if len(d.Panels) == 0 {
		t.Fatalf("%s: no panels", path)
	}
	return out
}
