package server

// End-to-end tests with real proxies: nginx (auth_request) and Caddy
// (forward_auth) run examples/nginx/nginx.conf and examples/caddy/Caddyfile,
// rendered with free loopback ports, in front of a tiny Go application,
// with two weir instances sharing one real Redis behind them.
//
// The tests skip when nginx or caddy is not installed, unless CI is set:
// then they fail, so that CI cannot silently skip them. `make test`
// installs both from Debian's packages.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// requireBinary finds a program, looking in the sbin directories too,
// which are not on every user's PATH.
func requireBinary(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not installed; CI is set, so this end-to-end test must not be skipped (make test installs it)", name)
	}
	t.Skipf("%s is not installed; skipping the end-to-end test (make test installs it)", name)
	return ""
}

// freeAddr returns a loopback address nobody listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitListening waits until addr accepts connections.
func waitListening(t *testing.T, addr string, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after 15s:\n%s", addr, logs())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// startProcess runs a proxy until the test ends and waits for addr.
func startProcess(t *testing.T, addr string, env []string, bin string, args ...string) {
	t.Helper()
	out := &lockedWriter{b: &strings.Builder{}}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), out.String())
		}
	})
	waitListening(t, addr, func() string { return out.String() })
}

// render replaces each old string of src, which must occur exactly once,
// so that a change to the example that the test no longer understands
// fails loudly.
func render(t *testing.T, src string, pairs ...string) string {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		if n := strings.Count(src, pairs[i]); n != 1 {
			t.Fatalf("the example has %q %d times; the test expects it once", pairs[i], n)
		}
		src = strings.Replace(src, pairs[i], pairs[i+1], 1)
	}
	return src
}

// startApp serves the application behind the proxy.
func startApp(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from the app\n")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// weirFleet is two weir instances sharing one Redis, serving HTTP on free
// loopback ports with the example's weir.yaml.
type weirFleet struct {
	s     [2]*Server
	addr  [2]string
	stop  [2]func()
	limit weir.Limit // the per-ip rule's
}

func startWeirFleet(t *testing.T, example string, tweak ...func(*config.Config)) *weirFleet {
	t.Helper()
	r := redistest.Standalone(t)
	cfg, err := policy.LoadFile(filepath.Join("..", "..", "examples", example, "weir.yaml"))
	if err != nil {
		t.Fatalf("the example's weir.yaml: %v", err)
	}
	for _, f := range tweak {
		f(cfg)
	}
	// A loaded test machine (-race, parallel packages) can take longer than
	// the default 50ms for the first scripts; a timeout would send the
	// decision to the local fallback and the counts would be off.
	cfg.Store.Timeout = 2 * time.Second
	f := &weirFleet{}
	for _, rc := range cfg.Rules {
		if rc.Name == "per-ip" {
			if f.limit, err = weir.ParseLimit(rc.Limit); err != nil {
				t.Fatal(err)
			}
		}
	}
	if f.limit.Rate == 0 {
		t.Fatal("the example's weir.yaml has no per-ip rule")
	}
	for i := range f.s {
		s, err := New(WithConfig(cfg), WithRedisURL("redis://"+r.Addr), WithInstanceID("weir-"+strconv.Itoa(i)),
			WithLogger(quietLogger()), WithShutdownTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		base, stop := serveOn(t, s)
		f.s[i], f.addr[i], f.stop[i] = s, strings.TrimPrefix(base, "http://"), stop
	}
	return f
}

// decisions returns how many decisions instance i made recently.
func (f *weirFleet) decisions(i int) int64 {
	st := f.s[i].stats
	var n int64
	from := time.Now().Unix() - 60
	for _, name := range st.names() {
		for _, c := range st.window(name, from, 62) {
			n += c.decisions()
		}
	}
	return n
}

// down stops both instances.
func (f *weirFleet) down() {
	f.stop[0]()
	f.stop[1]()
}

// proxyChecks drives traffic through a proxy at base and checks what a
// client sees: the allowed requests with the headers, then a 429 with
// Retry-After; and that both weir instances took part in one shared limit.
func proxyChecks(t *testing.T, base string, f *weirFleet) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	get := func() (*http.Response, string) {
		resp, err := client.Get(base + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	n := int(f.limit.Rate)
	window := int64((f.limit.Period + time.Second - 1) / time.Second)
	policyHdr := fmt.Sprintf(`"per-ip";q=%d;w=%d`, n, window)
	// A POST first: the proxy asks weir about it too (nginx's subrequest
	// keeps the method), and two rules apply.
	resp, err := client.Post(base+"/login", "text/plain", strings.NewReader("user=a"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("RateLimit-Policy"), policyHdr) ||
		!strings.Contains(resp.Header.Get("RateLimit-Policy"), `"login"`) {
		t.Fatalf("POST /login: %d %v", resp.StatusCode, resp.Header)
	}
	for i := 1; i < n; i++ {
		resp, body := get()
		if resp.StatusCode != 200 || body != "hello from the app\n" {
			t.Fatalf("request %d: %d %q", i+1, resp.StatusCode, body)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != policyHdr {
			t.Fatalf("request %d: RateLimit-Policy %q, want %q", i+1, got, policyHdr)
		}
		if got, want := resp.Header.Get("RateLimit"), fmt.Sprintf(`"per-ip";r=%d;t=`, n-1-i); !strings.HasPrefix(got, want) {
			t.Fatalf("request %d: RateLimit %q, want %s…", i+1, got, want)
		}
	}
	resp, body := get()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("request %d: %d %q, want 429", n+1, resp.StatusCode, body)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || int64(ra) > window {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	if resp.Header.Get("RateLimit-Policy") != policyHdr || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"per-ip";r=0;`) {
		t.Fatalf("429 headers: %v", resp.Header)
	}
	if !strings.Contains(body, "rate_limited") {
		t.Fatalf("429 body: %q", body)
	}
	// Both instances decided, and between them the limit held exactly:
	// n+1 requests, the POST decided by two rules.
	for i := range f.s {
		if e := f.s[i].metrics.errorsTotal.Load(); e != 0 {
			t.Fatalf("instance %d had %d store errors", i, e)
		}
	}
	a, b := f.decisions(0), f.decisions(1)
	if a == 0 || b == 0 || a+b != int64(n+2) {
		t.Fatalf("decisions by instance: %d and %d; want both > 0, %d in all", a, b, n+2)
	}
}

func TestNginxAuthRequest(t *testing.T) {
	nginx := requireBinary(t, "nginx")
	f := startWeirFleet(t, "nginx")
	app := startApp(t)
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "nginx", "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := func(listen string, failOpen bool) string {
		pairs := []string{
			"listen 127.0.0.1:8000;", "listen " + listen + ";",
			"server 127.0.0.1:8080;", "server " + f.addr[0] + ";\n        server " + f.addr[1] + ";",
			"server 127.0.0.1:3000;", "server " + app + ";",
		}
		if failOpen {
			pairs = append(pairs, "# error_page 500 = @weir_down;", "error_page 500 = @weir_down;")
		}
		return render(t, string(src), pairs...)
	}
	start := func(failOpen bool) string {
		dir := t.TempDir()
		listen := freeAddr(t)
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(conf(listen, failOpen)), 0o644); err != nil {
			t.Fatal(err)
		}
		// One process, so that it dies with the test binary.
		startProcess(t, listen, nil, nginx, "-p", dir, "-c", path, "-g", "master_process off;")
		return "http://" + listen
	}
	closedBase := start(false)
	openBase := start(true)

	proxyChecks(t, closedBase, f)

	// weir down: the default fails closed (500), the variant fails open.
	f.down()
	resp, err := http.Get(closedBase + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("weir down, default config: %d, want 500 (fail closed)", resp.StatusCode)
	}
	resp, err = http.Get(openBase + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello from the app\n" {
		t.Fatalf("weir down, fail-open variant: %d %q, want the app's 200", resp.StatusCode, b)
	}
}

func TestCaddyForwardAuth(t *testing.T) {
	caddy := requireBinary(t, "caddy")
	f := startWeirFleet(t, "caddy")
	app := startApp(t)
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "caddy", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	start := func(failOpen bool) string {
		dir := t.TempDir()
		listen := freeAddr(t)
		pairs := []string{
			"http://127.0.0.1:8000 {", "http://" + listen + " {",
			"forward_auth 127.0.0.1:8080 {", "forward_auth " + f.addr[0] + " " + f.addr[1] + " {",
			"reverse_proxy 127.0.0.1:3000 {", "reverse_proxy " + app + " {",
		}
		if failOpen {
			pairs = append(pairs,
				"\t# handle_errors {\n\t#\t@weir_down expression {err.status_code} == 502\n\t#\treverse_proxy @weir_down 127.0.0.1:3000\n\t# }",
				"\thandle_errors {\n\t\t@weir_down expression {err.status_code} == 502\n\t\treverse_proxy @weir_down "+app+"\n\t}")
		}
		path := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(path, []byte(render(t, string(src), pairs...)), 0o644); err != nil {
			t.Fatal(err)
		}
		env := []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}
		startProcess(t, listen, env, caddy, "run", "--adapter", "caddyfile", "--config", path)
		return "http://" + listen
	}
	closedBase := start(false)
	openBase := start(true)

	proxyChecks(t, closedBase, f)

	f.down()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	get := func(base string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get(closedBase); code != http.StatusBadGateway {
		t.Fatalf("weir down, default config: %d, want 502 (fail closed)", code)
	}
	if code, body := get(openBase); code != 200 || body != "hello from the app\n" {
		t.Fatalf("weir down, fail-open variant: %d %q, want the app's 200", code, body)
	}
}

// lockedWriter collects a process's output from two pipes.
type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
