package dashboard

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The browser test: `weir serve` with a penalty-box rule, real traffic, and
// the dashboard driven in Debian's headless Chromium by playwright-core (see
// e2e/dashboard.test.mjs). Without chromium or node the test is skipped,
// unless CI is set, where it fails: `make test` installs both.
//
// The 1280×800 screenshot goes to docs/img/dashboard.png when
// WEIR_UPDATE_SCREENSHOT=1 or when that file is missing, and to a temporary
// directory otherwise. WEIR_SHOT_DIR keeps the extra screenshots (dark
// scheme, 390 px wide) for a look.

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

// browserTools finds node, npm and chromium, or skips (fails under CI).
func browserTools(t *testing.T) (node, npm, chromium string) {
	t.Helper()
	ci := os.Getenv("CI") != ""
	if testing.Short() && !ci {
		t.Skip("browser test skipped in -short mode")
	}
	chromium = os.Getenv("CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	var missing []string
	if _, err := os.Stat(chromium); err != nil {
		missing = append(missing, chromium+" (apt-get install chromium)")
	}
	var err error
	if node, err = exec.LookPath("node"); err != nil {
		missing = append(missing, "node")
	}
	if npm, err = exec.LookPath("npm"); err != nil {
		missing = append(missing, "npm")
	}
	if len(missing) > 0 {
		if ci {
			t.Fatalf("CI is set but the browser test cannot run: missing %s", strings.Join(missing, ", "))
		}
		t.Skipf("browser test skipped: missing %s", strings.Join(missing, ", "))
	}
	return node, npm, chromium
}

// runBrowser runs e2e/dashboard.test.mjs against the service at url.
func runBrowser(t *testing.T, url, token, screenshot, shotDir string, env ...string) {
	t.Helper()
	node, npm, chromium := browserTools(t)
	dir, err := filepath.Abs("e2e")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core", "package.json")); err != nil {
		start := time.Now()
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
		t.Logf("npm ci: %v", time.Since(start).Round(time.Millisecond))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "dashboard.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"WEIR_URL="+url,
		"WEIR_ADMIN_TOKEN="+token,
		"WEIR_SCREENSHOT="+screenshot,
		"WEIR_SHOT_DIR="+shotDir,
		"CHROMIUM="+chromium,
	)
	cmd.Env = append(cmd.Env, env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			t.Log(sc.Text())
		}
	}()
	err = cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		t.Fatalf("browser test: %v", err)
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
	root, err := filepath.Abs(filepath.Join("..", ".."))
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
	browserTools(t) // skip early, before building anything
	bin := buildWeir(t)
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(cfg, []byte(e2eConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	url := startWeir(t, bin, cfg, e2eToken)

	shot := filepath.Join(t.TempDir(), "dashboard.png")
	committed, err := filepath.Abs(filepath.Join("..", "..", "docs", "img", "dashboard.png"))
	if err != nil {
		t.Fatal(err)
	}
	points := "8" // seconds of traffic in the chart before the screenshot
	if _, err := os.Stat(committed); os.Getenv("WEIR_UPDATE_SCREENSHOT") == "1" || os.IsNotExist(err) {
		shot, points = committed, "32"
	}
	shotDir := os.Getenv("WEIR_SHOT_DIR")
	if shotDir == "" {
		shotDir = t.TempDir()
	}
	start := time.Now()
	runBrowser(t, url, e2eToken, shot, shotDir, "WEIR_CHART_POINTS="+points)
	t.Logf("browser test took %v; screenshot at %s", time.Since(start).Round(time.Millisecond), shot)
	if _, err := os.Stat(shot); err != nil {
		t.Errorf("no screenshot: %v", err)
	}
}
