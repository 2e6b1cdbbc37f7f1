package dashboard

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/redistest"
)

// TestDashboardStoreOutageBanner: `weir serve` on a real redis-server with
// on_error: deny, under traffic. The test stops Redis: the page's top says
// so in a banner that names the fallback in force and since when, and the
// header's state leaves plain "live"; it restarts Redis: the banner goes.
// The screenshot of the outage goes to docs/img/dashboard-outage.png when
// WEIR_UPDATE_SCREENSHOT=1 or when that file is missing.
func TestDashboardStoreOutageBanner(t *testing.T) {
	chromium := chromiumPath(t)
	r := redistest.Standalone(t)
	bin := buildWeir(t)
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	// Without the protect rules: an adaptive concurrency limit may shed
	// checks while each waits for the store's timeout.
	conf, _, _ := strings.Cut(e2eConfig, "protect:")
	conf = strings.Replace(conf, "store:\n  type: memory\n",
		"store:\n  type: redis\n  redis: {addrs: [\""+r.Addr+"\"]}\n  timeout: 200ms\n  on_error: deny\n", 1)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	base := startWeir(t, bin, cfg, e2eToken)

	shot := filepath.Join(t.TempDir(), "dashboard-outage.png")
	committed, err := filepath.Abs(filepath.Join("..", "..", "..", "docs", "img", "dashboard-outage.png"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(committed); os.Getenv("WEIR_UPDATE_SCREENSHOT") == "1" || os.IsNotExist(err) {
		shot = committed
	}

	c := &checker{base: base, client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	t.Cleanup(c.client.CloseIdleConnections)
	b := newTab(t, chromium)
	stop := make(chan struct{})
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		c.traffic(stop, "203.0.113.77", b.problem)
	}()
	t.Cleanup(func() { close(stop); <-trafficDone })

	b.viewport(1280, 800)
	b.colorScheme("light")
	if resp := b.navigate(base + "/"); resp.Status != 200 {
		t.Fatalf("GET / gave %d", resp.Status)
	}
	banner := css(`[data-testid="outage-banner"]`)
	conn := func() string {
		var s string
		if err := b.evalJS("document.getElementById('conn').dataset.state", &s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	b.waitFor("the store's type on the page", 60*time.Second, pollEvery, func() (bool, any, error) {
		s := b.innerText(css(`[data-testid="store-health"]`))
		return strings.Contains(s, "redis") && strings.Contains(s, "breaker closed"), s, nil
	})
	b.waitFor("decisions in the chart", 60*time.Second, pollEvery, func() (bool, any, error) {
		var total float64
		err := b.evalJS(`Number(document.querySelector('[data-testid="decisions-chart"]').dataset.total)`, &total)
		return err == nil && total > 0, total, err
	})
	if n := b.count(banner.visible()); n != 0 || conn() != "live" {
		t.Fatalf("with Redis up: banner shown %d, connection %q", n, conn())
	}

	r.Stop()
	stopped := time.Now()
	var text string
	b.waitFor("the outage banner", 60*time.Second, pollEvery, func() (bool, any, error) {
		if b.count(banner.visible()) != 1 {
			return false, "hidden", nil
		}
		text = b.innerText(banner)
		return strings.Contains(text, "on_error: deny") && strings.Contains(text, "since"), text, nil
	})
	if s := conn(); s != "degraded" {
		t.Fatalf("during the outage the header's state is %q, want degraded", s)
	}
	if s := b.innerText(css("#conn")); !strings.Contains(s, "store outage") {
		t.Fatalf("during the outage the header says %q", s)
	}
	var since float64
	if err := b.evalJS("window.weirDashboard.snapshot.store.fallback_since_ms", &since); err != nil {
		t.Fatal(err)
	}
	if s := time.UnixMilli(int64(since)); s.Before(stopped.Add(-time.Second)) || s.After(time.Now()) {
		t.Fatalf("fallback_since_ms %v, want between the stop (%v) and now", s, stopped)
	}
	// The banner is at the top of the page, above the fold.
	var top float64
	if err := b.evalJS(`W.one(W.css([document], '[data-testid="outage-banner"]'), 'banner').getBoundingClientRect().top`, &top); err != nil {
		t.Fatal(err)
	}
	if top < 0 || top > 100 {
		t.Fatalf("the banner's top is at %vpx", top)
	}
	t.Logf("banner: %s", text)

	time.Sleep(3 * time.Second) // a few seconds of outage in the chart
	if err := b.evalJS("(document.activeElement?.blur(), window.scrollTo(0, 0), null)", nil); err != nil {
		t.Fatal(err)
	}
	b.mouseMove(0, 0)
	time.Sleep(200 * time.Millisecond)
	b.screenshot(shot, false, nil)
	t.Logf("screenshot %s", shot)

	r.Start()
	b.waitFor("the banner to clear", 90*time.Second, pollEvery, func() (bool, any, error) {
		n := b.count(banner.visible())
		return n == 0, n, nil
	})
	if s := conn(); s != "live" {
		t.Fatalf("after the outage the header's state is %q, want live", s)
	}
	if bad := without(b.Problems()); len(bad) > 0 {
		t.Fatalf("browser reported problems:\n  %s", strings.Join(bad, "\n  "))
	}
}
