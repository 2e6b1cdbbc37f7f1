package replay

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// chromium returns the headless browser's path, or skips (fails under CI,
// where make test installs it), as the dashboard's browser test does.
func chromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv("CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but %s is missing (apt-get install chromium)", path)
		}
		t.Skipf("browser test skipped: %s missing", path)
	}
	return path
}

// The HTML report is one self-contained page: headless Chromium, with
// every network request sent to a closed port, renders the chart with a
// bar per minute and the rule table, and the page references nothing
// outside itself.
func TestHTMLInChromium(t *testing.T) {
	browser := chromium(t)
	var lines []string
	for s := 0; s < 300; s += 2 {
		lines = append(lines, nginxLine("198.51.100.1", s, "/"), nginxLine("198.51.100.2", s, "/search"))
	}
	cfg := twoPerMinute + `
  - name: search
    match: { path: /search }
    limit: 10/m
    shadow: true
`
	rep, _ := run(t, cfg, strings.Join(lines, "\n"), Options{})
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(f, rep, "weir.yaml <test>"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	src, _ := os.ReadFile(page)
	if regexp.MustCompile(`(?i)(src|href)\s*=\s*"(https?:)?//`).Match(src) || strings.Contains(string(src), "@import") {
		t.Fatalf("the page references something outside itself")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--proxy-server=127.0.0.1:9", "--user-data-dir="+filepath.Join(dir, "profile"),
		"--virtual-time-budget=2000", "--dump-dom", "file://"+page)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	dom := string(out)
	// The page's script measured the rendered chart and counted rows.
	m := regexp.MustCompile(`data-check="([^"]*)"`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the page's check did not run:\n%.2000s", dom)
	}
	if m[1] != "ok bars=5 rules=2" {
		t.Fatalf("check %q, want a drawn chart of 5 minutes and 2 rules", m[1])
	}
	for _, want := range []string{"weir.yaml &lt;test&gt;", "198.51.100.1", "<td>search</td>"} {
		if !strings.Contains(dom, want) {
			t.Fatalf("rendered page lacks %q", want)
		}
	}
}
