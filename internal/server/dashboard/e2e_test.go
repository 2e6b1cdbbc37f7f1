package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
)

// The browser test: `weir serve` with a penalty-box rule, real traffic, and
// the dashboard driven in Debian's headless Chromium (no sandbox) through
// the DevTools protocol with chromedp (browser_test.go). Without chromium
// the test is skipped, unless CI is set, where it fails: `make test`
// installs it. CHROMIUM names another browser binary.
//
// The 1280×1120 screenshot goes to docs/img/dashboard.png when
// WEIR_UPDATE_SCREENSHOT=1 or when that file is missing (after about 32
// seconds of traffic in the chart, 8 otherwise; WEIR_CHART_POINTS sets it),
// and to a temporary directory otherwise. WEIR_SHOT_DIR keeps the extra
// screenshots (the whole page, dark scheme, 390 px wide; WEIR_SHOT_CLIPS=1
// adds the 390 px page in 800 px slices) for a look.
//
// The service must have these rules: login (sliding_log, 3 per 30m, block
// 30m, identity ip), api, search (shadow) and upload, and the protect rules
// checks (adaptive) and payments (breaker); see e2eConfig.

const e2eConfig = `# weir serve config for the dashboard browser test
store:
  type: memory
rules:
  - name: login
    match: { methods: [POST], path: /api/login }
    identity: [ip]
    limit: 3/30m
    algorithm: sliding_log
    block: 30m
    events: true
  - name: api
    match: { path: /api/ }
    identity: ["header:X-API-Key"]
    limit: 180/m
    algorithm: gcra
    burst: 20
  - name: search
    match: { methods: [GET], path: /search }
    identity: [ip]
    limit: 5/10s
    algorithm: sliding_window
    shadow: true
  - name: upload
    match: { methods: [POST], path: /upload }
    identity: ["header:X-User"]
    limit: 10/m
    algorithm: token_bucket
protect:
  - name: checks
    match: { path: /v1/check }
    concurrency: adaptive
    max_concurrency: 500
  - name: payments
    match: { path: /v1/nothing }
    breaker: { error_ratio: 0.5, min_requests: 20 }
`

const e2eToken = "e2e-admin-token-3f9c"

// chromiumPath finds chromium ($CHROMIUM, or Debian's /usr/bin/chromium), or
// skips the test (fails it under CI).
func chromiumPath(t *testing.T) string {
	t.Helper()
	ci := os.Getenv("CI") != ""
	if testing.Short() && !ci {
		t.Skip("browser test skipped in -short mode")
	}
	chromium := os.Getenv("CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		if ci {
			t.Fatalf("CI is set but the browser test cannot run: missing %s (apt-get install chromium)", chromium)
		}
		t.Skipf("browser test skipped: missing %s (apt-get install chromium)", chromium)
	}
	return chromium
}

// checker sends POST /v1/check to the service, from the test and from the
// background traffic.
type checker struct {
	base    string
	client  *http.Client
	slowest atomic.Int64 // nanoseconds
}

// check asks for a decision; a status other than 200 or 429, or a body that
// is not JSON, is an error.
func (c *checker) check(rule, key string, hits int) (map[string]any, error) {
	body, _ := json.Marshal(map[string]any{"rule": rule, "key": key, "hits": hits})
	start := time.Now()
	resp, err := c.client.Post(c.base+"/v1/check", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("POST /v1/check %s/%s: %w", rule, key, err)
	}
	text, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	for d := int64(time.Since(start)); ; {
		old := c.slowest.Load()
		if d <= old || c.slowest.CompareAndSwap(old, d) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("POST /v1/check %s/%s: status %d: %w", rule, key, resp.StatusCode, err)
	}
	var d map[string]any
	if err := json.Unmarshal(text, &d); err != nil {
		return nil, fmt.Errorf("POST /v1/check %s/%s: status %d, not JSON: %s", rule, key, resp.StatusCode, text)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		return nil, fmt.Errorf("POST /v1/check %s/%s: status %d: %s", rule, key, resp.StatusCode, text)
	}
	return d, nil
}

// traffic sends background checks, about 10 ticks a second, until stop
// closes, then waits for those in flight: steady legitimate use that rises
// and falls, a scraper that bursts past its limit every 15 s, a crawler
// counted by the shadow rule, and a password-guesser (attacker) held in the
// penalty box. Checks are not awaited, so that one slow answer does not
// stall the traffic (and dent the chart), but at most 64 are in flight.
// It returns how many checks it sent; failures go to problem.
func (c *checker) traffic(stop <-chan struct{}, attacker string, problem func(string, ...any)) int {
	var (
		wg       sync.WaitGroup
		inflight atomic.Int64
		sent     int
		loginSeq int
	)
	keys := []string{"alpha", "bravo", "charlie", "delta", "echo", "foxtrot"}
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	for tick := 1; !stopped(); tick++ {
		sec := float64(tick) / 10
		type job struct{ rule, key string }
		var jobs []job
		p := 0.16 + 0.06*math.Sin(sec/6) // legitimate load: 1..2.2 checks per key per second, under the limit
		for _, k := range keys {
			if rand.Float64() < p {
				jobs = append(jobs, job{"api", "key-" + k})
			}
		}
		if math.Mod(sec, 15) < 6 { // 20/s for 6 s: the burst of 20 passes, then 3/s
			jobs = append(jobs, job{"api", "key-scraper"}, job{"api", "key-scraper"})
		}
		if rand.Float64() < 0.25 {
			jobs = append(jobs, job{"search", fmt.Sprintf("192.0.2.%d", 10+tick%40)})
		}
		if tick%4 == 0 {
			jobs = append(jobs, job{"search", "192.0.2.99"}) // shadow-limited
		}
		if tick%8 == 0 {
			jobs = append(jobs, job{"login", fmt.Sprintf("10.1.%d.%d", loginSeq/200, loginSeq%200)})
			loginSeq++
		}
		if tick%4 == 0 {
			jobs = append(jobs, job{"login", attacker})
		}
		if tick%12 == 0 {
			jobs = append(jobs, job{"upload", fmt.Sprintf("user-%d", (tick/12)%3)})
		}
		sent += len(jobs)
		for _, j := range jobs {
			inflight.Add(1)
			wg.Go(func() {
				defer inflight.Add(-1)
				if _, err := c.check(j.rule, j.key, 1); err != nil {
					problem("traffic: %v", err)
				}
			})
		}
		time.Sleep(100 * time.Millisecond)
		for inflight.Load() > 64 && !stopped() {
			time.Sleep(20 * time.Millisecond)
		}
	}
	wg.Wait()
	return sent
}

// adminCall sends an admin API request with body as JSON (nil: none) and
// fails t unless it answers 200.
func adminCall(t *testing.T, base, method, path string, body any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, text)
	}
}

// freePort returns a loopback address with a port nobody listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// buildWeir builds cmd/weir into a temporary directory.
func buildWeir(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found from %s: %v", root, err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "weir")
	start := time.Now()
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/weir")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/weir: %v\n%s", err, out)
	}
	t.Logf("built weir in %v", time.Since(start).Round(time.Millisecond))
	return bin
}

// startWeir runs `weir serve` and waits until it answers.
func startWeir(t *testing.T, bin, config, token string) string {
	t.Helper()
	httpAddr, grpcAddr := freePort(t), freePort(t)
	cmd := exec.Command(bin, "serve", "--config", config, "--http", httpAddr, "--grpc", grpcAddr)
	cmd.Env = append(os.Environ(), "WEIR_ADMIN_TOKEN="+token)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "weir.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("weir serve log:\n%s", b)
			}
		}
	})
	url := "http://" + httpAddr
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logFile.Name())
			t.Fatalf("weir serve exited: %v\n%s", err, b)
		default:
		}
		resp, err := http.Get(url + "/v1/dashboard/snapshot")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return url
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("weir serve did not answer on %s within 20s (last: %v)", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestDashboardInBrowser(t *testing.T) {
	chromium := chromiumPath(t) // skip early, before building anything
	bin := buildWeir(t)
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(cfg, []byte(e2eConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startWeir(t, bin, cfg, e2eToken)

	shot := filepath.Join(t.TempDir(), "dashboard.png")
	committed, err := filepath.Abs(filepath.Join("..", "..", "..", "docs", "img", "dashboard.png"))
	if err != nil {
		t.Fatal(err)
	}
	// Seconds of traffic in the chart before the screenshot; for the
	// committed picture, about half a minute. WEIR_CHART_POINTS overrides.
	points := 8
	if _, err := os.Stat(committed); os.Getenv("WEIR_UPDATE_SCREENSHOT") == "1" || os.IsNotExist(err) {
		shot, points = committed, 32
	}
	if v := os.Getenv("WEIR_CHART_POINTS"); v != "" {
		if points, err = strconv.Atoi(v); err != nil {
			t.Fatalf("WEIR_CHART_POINTS=%q: %v", v, err)
		}
	}
	shotDir := os.Getenv("WEIR_SHOT_DIR")
	if shotDir == "" {
		shotDir = t.TempDir()
	}

	t0 := time.Now()
	logf := func(format string, args ...any) {
		t.Helper()
		t.Logf("[%.1fs] "+format, append([]any{time.Since(t0).Seconds()}, args...)...)
	}
	const (
		target   = "198.51.100.23" // the identity this test gets blocked and unblocks
		attacker = "203.0.113.77"  // stays blocked, so the screenshot shows a countdown
	)
	c := &checker{base: base, client: &http.Client{
		Timeout:   time.Minute,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64},
	}}
	t.Cleanup(c.client.CloseIdleConnections)
	check := func(rule, key string) map[string]any {
		t.Helper()
		d, err := c.check(rule, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	b := newTab(t, chromium)

	// The background traffic runs until the end of the test; what it fails
	// at is a problem of the test.
	stop := make(chan struct{})
	var sent int
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		sent = c.traffic(stop, attacker, b.problem)
	}()
	stopTraffic := sync.OnceFunc(func() { close(stop); <-trafficDone })
	t.Cleanup(stopTraffic)

	b.viewport(1280, 800)
	b.colorScheme("light")

	resp := b.navigate(base + "/")
	if resp.Status != 200 {
		t.Fatalf("GET / gave %d", resp.Status)
	}
	csp := header(resp, "Content-Security-Policy")
	if !regexp.MustCompile(`script-src 'self'`).MatchString(csp) || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("weak or missing CSP: %s", csp)
	}
	logf("page loaded")

	// Every section is there.
	for _, id := range []string{"decisions-chart", "rules-table", "top-limited", "blocked-list", "store-health", "try-it"} {
		b.waitVisible(css(`[data-testid="`+id+`"]`), actionTimeout)
	}
	rules := css(`[data-testid="rules-table"]`)
	b.waitFor("rules in the table", 60*time.Second, pollEvery, func() (bool, any, error) {
		n := b.count(rules.css("tbody tr"))
		return n >= 4, n, nil
	})
	for _, r := range []string{"login", "api", "search", "upload"} {
		if n := b.count(rules.css(`tr[data-rule="` + r + `"]`)); n != 1 {
			t.Fatalf("rule %s missing from rules-table (%d rows)", r, n)
		}
	}
	loginRow := b.innerText(rules.css(`tr[data-rule="login"]`))
	for _, want := range []string{"sliding_log", "3/30m"} {
		if !strings.Contains(loginRow, want) {
			t.Fatalf("login row lacks %s: %s", want, loginRow)
		}
	}
	if b.count(rules.css(`tr[data-rule="search"] .badge.shadow`)) != 1 {
		t.Fatal("search rule not marked shadow")
	}
	if n := b.count(rules.css("svg.spark")); n < 4 {
		t.Fatalf("sparklines missing: %d", n)
	}
	// login is 3/30m: each client's third attempt leaves it at 100% of the
	// limit, past the default near_limit of 80%, and is admitted.
	nonZero := regexp.MustCompile(`^[1-9]`)
	b.waitFor("a near-limit count for login", 60*time.Second, pollEvery, func() (bool, any, error) {
		s := b.innerText(rules.css(`tr[data-rule="login"] td.near`))
		return nonZero.MatchString(s), s, nil
	})
	storeText := b.innerText(css(`[data-testid="store-health"]`))
	if !regexp.MustCompile(`in-memory|memory`).MatchString(storeText) || !strings.Contains(storeText, "breaker closed") {
		t.Fatalf("store-health: %s", storeText)
	}
	if !regexp.MustCompile(`Fallback decisions\s*0 · 0 in 5 min`).MatchString(storeText) {
		t.Fatalf("store-health lacks the fallback decisions: %s", storeText)
	}
	if !regexp.MustCompile(`Deny cache\s*off`).MatchString(storeText) {
		t.Fatalf("store-health lacks the deny cache (off on a memory store): %s", storeText)
	}
	logf("rules and store health rendered")

	// Overload protection: the adaptive rule counts the checks this test
	// sends; the breaker rule shows its state.
	prot := css(`[data-testid="protect-table"]`)
	counting := regexp.MustCompile(`checks\s+adaptive\s+\d+ / \d+`)
	zeroChecks := regexp.MustCompile(`checks[^\n]*\t0\t`)
	b.waitFor("protect rules counting checks", 60*time.Second, pollEvery, func() (bool, any, error) {
		s := b.innerText(prot)
		return counting.MatchString(s) && !zeroChecks.MatchString(s), s, nil
	})
	protText := b.innerText(prot)
	if !regexp.MustCompile(`payments\s+breaker`).MatchString(protText) || !strings.Contains(protText, "closed · 0 transitions") {
		t.Fatalf("protect-table: %s", protText)
	}
	logf("protect rules rendered")

	// The chart's data grows.
	type chartAttrs struct {
		Points  float64 `json:"points"`
		Updates float64 `json:"updates"`
		Total   float64 `json:"total"`
		Last    float64 `json:"last"`
		Plotted float64 `json:"plotted"`
	}
	attrs := func() (chartAttrs, error) {
		var a chartAttrs
		err := b.evalJS(`((el) => {
  const n = (v) => { const x = Number(v); return Number.isFinite(x) ? x : null; };
  return {
    points: n(el.dataset.points), updates: n(el.dataset.updates),
    total: n(el.dataset.total), last: n(el.dataset.lastMs),
    plotted: window.weirDashboard.chart.data[0].length,
  };
})(W.one(W.css([document], '[data-testid="decisions-chart"]'), 'decisions-chart'))`, &a)
		return a, err
	}
	var a0, a1 chartAttrs
	b.waitFor("first chart data", 60*time.Second, pollEvery, func() (bool, any, error) {
		a, err := attrs()
		a0 = a
		return err == nil && a.Updates >= 1 && a.Total > 0, a, err
	})
	b.waitFor("the chart to grow", 60*time.Second, pollEvery, func() (bool, any, error) {
		a, err := attrs()
		a1 = a
		return err == nil && a.Points > a0.Points && a.Total > a0.Total && a.Last > a0.Last && a.Updates > a0.Updates, a, err
	})
	if a1.Plotted < a1.Points {
		t.Fatalf("uPlot holds %v points, fewer than %v", a1.Plotted, a1.Points)
	}
	logf("chart grew: points %v→%v, decisions %v→%v, updates %v→%v", a0.Points, a1.Points, a0.Total, a1.Total, a0.Updates, a1.Updates)

	// Without a token the penalty box is read-only and says so.
	blocked := css(`[data-testid="blocked-list"]`)
	if s := b.innerText(blocked); !strings.Contains(s, "Read-only") {
		t.Fatalf("blocked-list does not say it is read-only: %s", s)
	}

	// Get target limited and blocked: 3 allowed, then rejected into the penalty box.
	for i := 1; i <= 3; i++ {
		if d := check("login", target); d["allowed"] != true {
			t.Fatalf("login check %d for %s was rejected: %s", i, target, jsString(d))
		}
	}
	rejected := check("login", target)
	if rejected["allowed"] != false {
		t.Fatalf("4th login check for %s was allowed: %s", target, jsString(rejected))
	}
	logf("target rejected: %s", jsString(rejected))

	// Without the token identities are hidden: target and attacker show as
	// tags (#<16 hex>), in the penalty box and in top-limited alike.
	tagRE := regexp.MustCompile(`^#[0-9a-f]{16}$`)
	loginRows := blocked.css(`li[data-rule="login"]`)
	b.waitFor("target and attacker in the penalty box, as tags", 60*time.Second, pollEvery, func() (bool, any, error) {
		n := b.count(loginRows)
		return n >= 2, n, nil
	})
	var tags []string
	if err := b.evalJS("("+string(loginRows)+").map((e) => e.dataset.identity)", &tags); err != nil {
		t.Fatal(err)
	}
	for _, tag := range tags {
		if !tagRE.MatchString(tag) {
			t.Fatalf("penalty box without a token shows %s, want tags", jsString(tags))
		}
	}
	for _, who := range []string{target, attacker} {
		var seen string
		if err := b.evalJS("document.body.innerText + JSON.stringify(window.weirDashboard.snapshot)", &seen); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(seen, who) {
			t.Fatalf("the page shows %s without a token", who)
		}
	}
	var identities string
	if err := b.evalJS("document.body.dataset.identities ?? null", &identities); err != nil {
		t.Fatal(err)
	}
	if identities != "redacted" {
		t.Fatalf("the snapshot is not marked redacted: %q", identities)
	}
	if s := b.innerText(css("#admin-note")); !strings.Contains(s, "Identities are hidden") {
		t.Fatalf("the note does not say identities are hidden: %s", s)
	}
	tagRow := loginRows.first()
	if n := b.count(tagRow.css("button").visible()); n != 0 {
		t.Fatalf("Unblock offered without a token (%d buttons)", n)
	}
	c1 := b.innerText(tagRow.css(".count"))
	if !regexp.MustCompile(`^\d+m \d\ds$`).MatchString(c1) {
		t.Fatalf("countdown looks wrong: %s", c1)
	}
	b.waitFor("the countdown to tick", 30*time.Second, pollEvery, func() (bool, any, error) {
		s := b.innerText(tagRow.css(".count"))
		return s != c1, s, nil
	})
	var topTags []string
	if err := b.evalJS(`W.css([document], '[data-testid="top-limited"] [data-rule="login"] li').map((e) => e.dataset.identity)`, &topTags); err != nil {
		t.Fatal(err)
	}
	allTags := len(topTags) > 0
	sharesTag := false
	for _, tag := range topTags {
		allTags = allTags && tagRE.MatchString(tag)
		sharesTag = sharesTag || slices.Contains(tags, tag)
	}
	if !allTags || !sharesTag {
		t.Fatalf("top-limited without a token shows %s; want the penalty box's tags %s", jsString(topTags), jsString(tags))
	}
	logf("without a token: %d login tags in blocked-list, countdown %s, no identity on the page", len(tags), c1)

	// Overrides, set and changed through the admin API: the card shows
	// none of it without the token.
	ovrCard := css(`[data-testid="overrides"]`)
	b.waitVisible(ovrCard.css("#overrides-note"), actionTimeout)
	if n := b.count(ovrCard.css("#overrides-body").visible()); n != 0 {
		t.Fatal("the overrides card shows its body without the token")
	}
	for _, o := range []map[string]any{
		{"rule": "api", "key": "key-alpha", "limit": "360/m", "note": "launch week"},
		{"rule": "api", "key": "key-team-*", "limit": "720/m"},
		{"rule": "upload", "key": "user-1", "limit": "20/m"},
		{"rule": "api", "key": "key-alpha", "limit": "720/m", "note": "launch week, raised"},
	} {
		adminCall(t, base, "PUT", "/v1/overrides", o)
	}
	adminCall(t, base, "DELETE", "/v1/overrides?rule=upload&key=user-1", nil)
	if s := b.innerText(ovrCard); strings.Contains(s, "key-alpha") {
		t.Fatalf("the overrides card shows an identity without the token: %s", s)
	}

	// A wrong token is refused, the right one is kept for the tab.
	tokenInput := doc.label("Admin token", false)
	b.fill(tokenInput, "not-the-token")
	b.click(doc.role("button", "Use token"))
	b.waitVisible(css("#admin-error"), actionTimeout)
	b.fill(tokenInput, e2eToken)
	b.pressEnter(tokenInput)
	b.waitVisible(css("#admin-set"), actionTimeout)
	var stored *string
	if err := b.evalJS("sessionStorage.getItem('weir.adminToken')", &stored); err != nil {
		t.Fatal(err)
	}
	if stored == nil || *stored != e2eToken {
		t.Fatal("token not kept in sessionStorage")
	}

	// With the token the snapshot shows identities.
	row := blocked.css(`li[data-identity="` + target + `"]`)
	b.waitVisible(row, actionTimeout)
	b.waitVisible(css(`[data-testid="top-limited"] [data-rule="login"] li[data-identity="`+target+`"]`), actionTimeout)
	if err := b.evalJS("document.body.dataset.identities ?? null", &identities); err != nil {
		t.Fatal(err)
	}
	if identities != "full" {
		t.Fatalf("the snapshot with the token is not full: %q", identities)
	}
	logf("with the token: target in top-limited and in blocked-list")

	// With the token the latest events show target's first refusal and
	// the thresholds its third login crossed.
	b.waitVisible(css(`[data-testid="latest-events"] li[data-kind="refused"][data-identity="`+target+`"]`), actionTimeout)
	if s := b.innerText(css(`[data-testid="latest-events"]`)); !strings.Contains(s, target) || !strings.Contains(s, "100% of the limit") {
		t.Fatalf("latest-events does not show %s's events: %s", target, s)
	}
	logf("with the token: target's events in latest-events")

	// With the token the overrides card lists the overrides in force per
	// rule and the latest changes, newest first.
	ovrRows := ovrCard.css("#overrides-rows tr")
	b.waitFor("the overrides in the card", 60*time.Second, pollEvery, func() (bool, any, error) {
		n := b.count(ovrRows)
		return n == 2, n, nil
	})
	alpha := b.innerText(ovrCard.css(`tr[data-rule="api"][data-key="key-alpha"]`))
	if !strings.Contains(alpha, "720/m") || !strings.Contains(alpha, "launch week, raised") || !strings.Contains(alpha, "no end") {
		t.Fatalf("the override of key-alpha reads %q", alpha)
	}
	if b.count(ovrCard.css(`tr[data-rule="api"][data-key="key-team-*"]`)) != 1 || b.count(ovrCard.css(`tr[data-rule="upload"]`)) != 0 {
		t.Fatalf("overrides card: %s", b.innerText(ovrCard))
	}
	var ops []string
	if err := b.evalJS(`W.css([document], '#overrides-audit li').map((e) => e.dataset.op + ' ' + e.dataset.rule + ' ' + e.dataset.key)`, &ops); err != nil {
		t.Fatal(err)
	}
	wantOps := []string{"delete upload user-1", "set api key-alpha", "set upload user-1", "set api key-team-*", "set api key-alpha"}
	if !slices.Equal(ops, wantOps) {
		t.Fatalf("audit entries %q, want %q", ops, wantOps)
	}
	if s := b.innerText(ovrCard.css("#overrides-audit li").first()); !strings.Contains(s, "deleted") || !strings.Contains(s, "upload · user-1 was 20/m") {
		t.Fatalf("the latest audit entry reads %q", s)
	}
	logf("overrides card: %d overrides, %d changes", b.count(ovrRows), len(ops))

	// Unblock target with the button: the page asks first. Cancel keeps
	// it blocked; confirmed, it leaves the list and stays gone.
	unblock := doc.role("button", "Unblock "+target+" from rule login")
	dialog := css("#confirm-unblock")
	b.waitVisible(unblock, actionTimeout)
	b.click(unblock)
	b.waitVisible(dialog, actionTimeout)
	if s := b.innerText(dialog); !strings.Contains(s, target) || !strings.Contains(s, "login") {
		t.Fatalf("the confirmation does not name the identity and the rule: %s", s)
	}
	b.click(dialog.role("button", "Cancel"))
	b.waitFor("the dialog to close", actionTimeout, pollEvery, func() (bool, any, error) {
		n := b.count(dialog.visible())
		return n == 0, n, nil
	})
	if d := check("login", target); d["allowed"] != false {
		t.Fatalf("%s admitted after Cancel: %s", target, jsString(d))
	}
	b.waitVisible(row, actionTimeout)
	b.click(unblock)
	b.waitVisible(dialog, actionTimeout)
	b.click(dialog.role("button", "Unblock"))
	b.waitDetached(row, actionTimeout)
	u0, err := attrs()
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor("two more refreshes", 60*time.Second, pollEvery, func() (bool, any, error) {
		a, err := attrs()
		return err == nil && a.Updates >= u0.Updates+2, a, err
	})
	if b.count(row) != 0 {
		t.Fatalf("%s came back to the blocked list after Unblock", target)
	}
	again := check("login", target)
	if again["allowed"] != true {
		t.Fatalf("%s not admitted after Unblock: %s", target, jsString(again))
	}
	logf("unblocked through the page; admitted again: %s", jsString(again))

	// Top limited shows three identities a rule, and all the snapshot has
	// (up to its bound) on demand: two more clients get limited on login.
	for _, ip := range []string{"198.51.100.41", "198.51.100.42"} {
		for range 4 {
			check("login", ip)
		}
	}
	loginTop := css(`[data-testid="top-limited"] [data-rule="login"]`)
	more := loginTop.role("button", "show all")
	b.waitVisible(more, 60*time.Second)
	if n := b.count(loginTop.css("li")); n != 3 {
		t.Fatalf("top-limited shows %d login identities before show all, want 3", n)
	}
	b.click(more)
	b.waitFor("every limited login identity", actionTimeout, pollEvery, func() (bool, any, error) {
		n := b.count(loginTop.css("li"))
		return n >= 4, n, nil
	})
	var snapTop int
	if err := b.evalJS(`window.weirDashboard.snapshot.top.login.length`, &snapTop); err != nil {
		t.Fatal(err)
	}
	if n := b.count(loginTop.css("li")); n != snapTop || n > 10 {
		t.Fatalf("show all lists %d login identities; the snapshot has %d (at most 10)", n, snapTop)
	}
	b.click(loginTop.role("button", "show fewer"))
	b.waitFor("three login identities again", actionTimeout, pollEvery, func() (bool, any, error) {
		n := b.count(loginTop.css("li"))
		return n == 3, n, nil
	})
	logf("top-limited: show all lists %d login identities, show fewer 3", snapTop)

	// Try it, by keyboard: pick a rule, type a key, press Enter.
	tryIt := css(`[data-testid="try-it"]`)
	summary := css("#try-summary")
	b.selectOption(tryIt.label("Rule", false), "login")
	b.fill(tryIt.label("Key (identity)", false), attacker)
	b.pressEnter(tryIt.label("Key (identity)", false))
	b.waitFor("a Try-it decision", 60*time.Second, pollEvery, func() (bool, any, error) {
		s := b.innerText(summary)
		return strings.Contains(s, "Limited"), s, nil
	})
	hdrs := b.innerText(css("#try-headers"))
	if !strings.Contains(hdrs, "RateLimit-Policy") || !strings.Contains(hdrs, "Retry-After") {
		t.Fatalf("Try it headers: %s", hdrs)
	}
	var tryJSON map[string]any
	if s := b.innerText(css("#try-json")); json.Unmarshal([]byte(s), &tryJSON) != nil {
		t.Fatalf("Try it JSON is not JSON: %s", s)
	}
	if tryJSON["allowed"] != false {
		t.Fatalf("Try it JSON: %s", jsString(tryJSON))
	}
	b.selectOption(tryIt.label("Rule", false), "api")
	b.fill(tryIt.label("Key (identity)", false), "key-demo")
	b.click(tryIt.role("button", "Send check"))
	b.waitFor("an allowed Try-it decision", 60*time.Second, pollEvery, func() (bool, any, error) {
		s := b.innerText(summary)
		return strings.Contains(s, "Allowed"), s, nil
	})
	logf("try it works")

	// The chart follows the rule selector.
	show := doc.label("Show", true)
	b.selectOption(show, "api")
	b.waitFor("the chart to show rule api", 60*time.Second, pollEvery, func() (bool, any, error) {
		s := b.innerText(css("#chart-span"))
		return strings.Contains(s, "rule api"), s, nil
	})
	b.selectOption(show, "")

	// Let traffic paint the chart, then take the pictures.
	b.waitFor(fmt.Sprintf("%d seconds in the chart", points), 60*time.Second+time.Duration(points)*1500*time.Millisecond, 500*time.Millisecond, func() (bool, any, error) {
		a, err := attrs()
		return err == nil && a.Points >= float64(points), a, err
	})
	b.waitVisible(blocked.css(`li[data-identity="`+attacker+`"]`), actionTimeout)

	if err := b.evalJS("(document.activeElement?.blur(), window.scrollTo(0, 0), null)", nil); err != nil {
		t.Fatal(err)
	}
	// Tall enough for the rules (with their near-limit column) and the
	// protection panel under the chart.
	b.viewport(1280, 1120)
	b.mouseMove(0, 0)
	time.Sleep(400 * time.Millisecond) // let the page settle (hover styles, the last paint)
	b.screenshot(shot, false, nil)
	logf("screenshot %s", shot)
	b.viewport(1280, 800)

	b.screenshot(filepath.Join(shotDir, "dashboard-full.png"), true, nil)
	if err := b.evalJS("(window.scrollTo(0, 0), null)", nil); err != nil {
		t.Fatal(err)
	}
	b.colorScheme("dark")
	time.Sleep(300 * time.Millisecond)
	b.screenshot(filepath.Join(shotDir, "dashboard-dark.png"), false, nil)
	b.colorScheme("light")
	b.viewport(390, 844)
	time.Sleep(400 * time.Millisecond)
	var overflow float64
	if err := b.evalJS("document.documentElement.scrollWidth - window.innerWidth", &overflow); err != nil {
		t.Fatal(err)
	}
	if overflow > 1 {
		t.Fatalf("page scrolls sideways by %vpx at 390px wide", overflow)
	}
	// Every cell of the protection table fits on screen at 390 px (each
	// rule is a card of labelled cells there), none hidden in a scroll.
	var cutOff []string
	if err := b.evalJS(`W.css([document], '[data-testid="protect-table"] tbody th, [data-testid="protect-table"] tbody td')
  .filter((c) => {
    const r = c.getBoundingClientRect();
    return r.left < 0 || r.right > window.innerWidth + 0.5;
  })
  .map((c) => (c.dataset.label || c.className) + ': ' + c.textContent)`, &cutOff); err != nil {
		t.Fatal(err)
	}
	if len(cutOff) > 0 {
		t.Fatalf("protection table cut off at 390px: %s", strings.Join(cutOff, "; "))
	}
	var protCells int
	if err := b.evalJS(`W.css([document], '[data-testid="protect-table"] tbody td').length`, &protCells); err != nil || protCells < 14 {
		t.Fatalf("protection table at 390px has %d cells (%v)", protCells, err)
	}
	b.screenshot(filepath.Join(shotDir, "dashboard-390.png"), true, nil)
	if os.Getenv("WEIR_SHOT_CLIPS") != "" {
		var height float64
		if err := b.evalJS("document.documentElement.scrollHeight", &height); err != nil {
			t.Fatal(err)
		}
		for y, i := 0.0, 0; y < height; y, i = y+800, i+1 {
			b.screenshot(filepath.Join(shotDir, fmt.Sprintf("dashboard-390-%d.png", i)), true,
				&page.Viewport{X: 0, Y: y, Width: 390, Height: math.Min(800, height-y)})
		}
	}
	logf("extra screenshots in %s", shotDir)

	// Everything the page and the traffic reported. The one 401 is the wrong
	// token this test typed on purpose; the 429 is the Try-it check of the
	// limited attacker (a refused check answers 429, which the browser
	// reports as a failed load).
	stopTraffic()
	problems := b.Problems()
	bad := without(problems, regexp.MustCompile(`status of 401`), regexp.MustCompile(`status of 429`))
	if len(bad) > 0 {
		t.Fatalf("browser reported problems:\n  %s", strings.Join(bad, "\n  "))
	}
	if len(problems) > 0 {
		logf("expected: %s", strings.Join(problems, "; "))
	}
	logf("ok (%d checks of background traffic; slowest check %v)", sent, time.Duration(c.slowest.Load()).Round(time.Millisecond))
	if _, err := os.Stat(shot); err != nil {
		t.Errorf("no screenshot: %v", err)
	}
}
