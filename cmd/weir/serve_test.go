package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/internal/otlptest"
	"github.com/weir-dev/weir/internal/server"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServeHelpDocumentsEveryFlag(t *testing.T) {
	out, errs, code := runCLI(t, "serve", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	help := out + errs
	fs, _ := newServeFlagSet(io.Discard)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		// A boolean flag's line ends at its name; others name a value.
		named := strings.Contains(help, "-"+f.Name+" ") || strings.Contains(help, "-"+f.Name+"\n")
		if !named || !strings.Contains(help, "$"+envName(f.Name)) {
			t.Errorf("--help does not document --%s and $%s", f.Name, envName(f.Name))
		}
		if len(f.Usage) < 20 {
			t.Errorf("--%s has a one-word description", f.Name)
		}
	})
	if n < 10 {
		t.Fatalf("only %d flags", n)
	}
	for _, want := range []string{"WEIR_REDIS", "SIGTERM", "SIGHUP", "/v1/auth", "/v1/check", ":8080", ":8081"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
	// Every route of the API reference, but the dashboard's page.
	var doc struct{ Paths map[string]any }
	if err := json.Unmarshal(server.OpenAPI(), &doc); err != nil || len(doc.Paths) < 10 {
		t.Fatalf("openapi.json: %v, %d paths", err, len(doc.Paths))
	}
	for path := range doc.Paths {
		if path != "/" && !regexp.MustCompile(regexp.QuoteMeta(path)+`\b([^/]|$)`).MatchString(help) {
			t.Errorf("--help does not list the route %s", path)
		}
	}
	if envName("envoy-config") != "WEIR_ENVOY_CONFIG" || envName("http") != "WEIR_HTTP" {
		t.Fatal(envName("envoy-config"))
	}
}

var servingLine = regexp.MustCompile(`^weir: serving on https?://(\S+) \(dashboard\), (gRPC \S+|gRPC off), store (.+)\n$`)

// startServe runs serve in-process with the given environment and waits
// for its one line on stdout.
func startServe(t *testing.T, env map[string]string, args ...string) (base string, line []string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := &syncBuffer{}, &syncBuffer{}
	lookup := func(k string) (string, bool) {
		v, ok := env[k]
		if !ok && k == "WEIR_SHUTDOWN_DELAY" {
			return "0", true // stop at once
		}
		return v, ok
	}
	done := make(chan int, 1)
	go func() { done <- serve(ctx, args, stdout, stderr, lookup, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := servingLine.FindStringSubmatch(stdout.String()); m != nil {
			line = m
			break
		}
		select {
		case code := <-done:
			cancel()
			t.Fatalf("serve exited %d early:\n%s%s", code, stdout, stderr)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no serving line after 10s: stdout %q stderr %q", stdout, stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := false
	code := 0
	stop = func() int {
		if !stopped {
			stopped = true
			cancel()
			code = <-done
		}
		return code
	}
	t.Cleanup(func() { stop() })
	if strings.HasPrefix(line[0], "weir: serving on https://") {
		return "https://" + line[1], line, stop
	}
	return "http://" + line[1], line, stop
}

func getJSON(t *testing.T, url string) map[string]any {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return m
}

func TestServeFromEnvironment(t *testing.T) {
	env := map[string]string{
		"WEIR_HTTP":        "127.0.0.1:0",
		"WEIR_GRPC":        "off",
		"WEIR_INSTANCE_ID": "from-env",
		"WEIR_LOG_LEVEL":   "error",
	}
	base, line, stop := startServe(t, env)
	if line[2] != "gRPC off" || line[3] != "memory" {
		t.Fatalf("serving line: %q", line[0])
	}
	snap := getJSON(t, base+"/v1/dashboard/snapshot")
	if id := snap["instance"].(map[string]any)["id"]; id != "from-env" {
		t.Fatalf("instance id %v", id)
	}
	// No flags, no config: the demo rules.
	rules := getJSON(t, base+"/v1/rules")["rules"].([]any)
	var names []string
	for _, r := range rules {
		names = append(names, r.(map[string]any)["name"].(string))
	}
	if strings.Join(names, ",") != "demo-ip,login,api" {
		t.Fatalf("demo rules: %v", names)
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestServeGRPCOffInConfig: server.grpc: off in weir.yaml serves no gRPC,
// as --grpc off does.
func TestServeGRPCOffInConfig(t *testing.T) {
	cfg := writeFile(t, t.TempDir(), "weir.yaml", "server: {http: \"127.0.0.1:0\", grpc: off}\nrules:\n  - {name: a, limit: 5/m}\n")
	_, line, stop := startServe(t, map[string]string{"WEIR_LOG_LEVEL": "error"}, "--config", cfg)
	if line[2] != "gRPC off" {
		t.Fatalf("serving line: %q", line[0])
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestServeFlagsWinOverEnvironment(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "weir.yaml")
	if err := os.WriteFile(cfg, []byte("server:\n  http: 127.0.0.1:1\nrules:\n  - name: only\n    limit: 1/s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"WEIR_HTTP":        "127.0.0.1:1", // a flag overrides it
		"WEIR_GRPC":        "127.0.0.1:0",
		"WEIR_INSTANCE_ID": "from-env",
		"WEIR_CONFIG":      cfg,
		"WEIR_LOG_LEVEL":   "error",
		"WEIR_ADMIN_TOKEN": "should-not-matter",
		"MY_TOKEN":         "tok",
	}
	base, line, _ := startServe(t, env, "--http", "127.0.0.1:0", "--instance-id", "from-flag", "--admin-token-env", "MY_TOKEN")
	if !strings.HasPrefix(line[2], "gRPC 127.0.0.1:") {
		t.Fatalf("gRPC from the environment: %q", line[0])
	}
	snap := getJSON(t, base+"/v1/dashboard/snapshot")
	if id := snap["instance"].(map[string]any)["id"]; id != "from-flag" {
		t.Fatalf("instance id %v", id)
	}
	if snap["admin_enabled"] != true {
		t.Fatal("admin token from --admin-token-env not used")
	}
	rules := getJSON(t, base+"/v1/rules")["rules"].([]any)
	if len(rules) != 1 || rules[0].(map[string]any)["name"] != "only" {
		t.Fatalf("config from WEIR_CONFIG: %v", rules)
	}
}

func TestServeUsageAndConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		args    []string
		code    int
		mention string
	}{
		{nil, []string{"extra"}, 2, "unexpected argument"},
		{nil, []string{"--nope"}, 2, "nope"},
		{map[string]string{"WEIR_SHUTDOWN_TIMEOUT": "banana"}, nil, 2, "WEIR_SHUTDOWN_TIMEOUT"},
		{nil, []string{"--log-level", "loud"}, 2, "log-level"},
		{nil, []string{"--shutdown-delay", "30s", "--shutdown-timeout", "10s"}, 2, "--shutdown-delay 30s"},
		{nil, []string{"--log-format", "xml"}, 2, "log-format"},
		{nil, []string{"--config", "/nonexistent/weir.yaml"}, 1, "/nonexistent/weir.yaml"},
		{nil, []string{"--redis", "redis://:bad:port:/x", "--http", "127.0.0.1:0"}, 1, "redis"},
		{nil, []string{"--envoy-config", "/nonexistent-dir", "--http", "127.0.0.1:0"}, 1, "nonexistent-dir"},
	} {
		var stdout, stderr bytes.Buffer
		lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
		code := serve(context.Background(), tc.args, &stdout, &stderr, lookup, nil)
		if code != tc.code || !strings.Contains(stderr.String(), tc.mention) {
			t.Errorf("%v %v: exit %d, stderr %q; want %d mentioning %q", tc.env, tc.args, code, stderr.String(), tc.code, tc.mention)
		}
	}
	// A bad config file names its line.
	dir := t.TempDir()
	bad := filepath.Join(dir, "weir.yaml")
	os.WriteFile(bad, []byte("rules:\n  - name: x\n    limit: 5/fortnight\n"), 0o644)
	var stderr bytes.Buffer
	if code := serve(context.Background(), []string{"--config", bad}, io.Discard, &stderr, func(string) (string, bool) { return "", false }, nil); code != 1 ||
		!strings.Contains(stderr.String(), "weir.yaml:3") {
		t.Fatalf("bad config: %d %q", code, stderr.String())
	}
}

func TestServeReloadsOnSignal(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "weir.yaml")
	os.WriteFile(cfg, []byte("rules:\n  - name: one\n    limit: 1/s\n"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout := &syncBuffer{}
	reload := make(chan os.Signal, 1)
	env := map[string]string{"WEIR_HTTP": "127.0.0.1:0", "WEIR_GRPC": "off", "WEIR_LOG_LEVEL": "error"}
	done := make(chan int, 1)
	go func() {
		done <- serve(ctx, []string{"--config", cfg, "--shutdown-delay", "0"}, stdout, io.Discard, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, reload)
	}()
	var base string
	for base == "" {
		if m := servingLine.FindStringSubmatch(stdout.String()); m != nil {
			base = "http://" + m[1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Changing the file reloads it by itself; SIGHUP forces a reload.
	os.WriteFile(cfg, []byte("rules:\n  - name: two\n    limit: 1/s\n"), 0o644)
	reload <- syscall.SIGHUP
	deadline := time.Now().Add(30 * time.Second)
	for {
		rules := getJSON(t, base+"/v1/rules")["rules"].([]any)
		if len(rules) == 1 && rules[0].(map[string]any)["name"] == "two" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not reloaded: %v", rules)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestServeHelperProcess is not a test: TestServeSIGTERMDrains runs the test
// binary again as `weir serve` through it.
func TestServeHelperProcess(t *testing.T) {
	if os.Getenv("WEIR_SERVE_HELPER") != "1" {
		t.Skip("runs only as a child of TestServeSIGTERMDrains")
	}
	args := strings.Fields(os.Getenv("WEIR_SERVE_ARGS"))
	os.Exit(run(append([]string{"serve"}, args...), os.Stdout, os.Stderr))
}

// serveProcess is a weir serve started as a child process of the test
// binary (see TestServeHelperProcess).
type serveProcess struct {
	cmd    *exec.Cmd
	addr   string     // the HTTP address from the serving line
	exited chan error // receives the process's exit
	stderr *syncBuffer
}

// startServeProcess runs `weir serve args` as a child process and waits for its
// serving line; the process is killed when the test ends.
func startServeProcess(t *testing.T, args string) *serveProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeHelperProcess$")
	cmd.Env = append(os.Environ(), "WEIR_SERVE_HELPER=1", "WEIR_SERVE_ARGS="+args)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &serveProcess{cmd: cmd, exited: make(chan error, 1), stderr: &syncBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lineCh := make(chan string, 1)
	go func() {
		ln, _ := bufio.NewReader(stdout).ReadString('\n')
		lineCh <- ln
		io.Copy(io.Discard, stdout)
	}()
	var line string
	select {
	case line = <-lineCh:
	case <-time.After(15 * time.Second):
		t.Fatalf("no serving line; stderr: %s", p.stderr.String())
	}
	m := servingLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("serving line %q", line)
	}
	p.addr = m[1]
	return p
}

// TestServeSIGTERMDrains runs weir serve as a real process, holds a request
// in flight (its body half sent), sends SIGTERM, and checks that the
// request still completes and the process exits 0.
func TestServeSIGTERMDrains(t *testing.T) {
	p := startServeProcess(t, "--http 127.0.0.1:0 --grpc 127.0.0.1:0 --log-level error --shutdown-timeout 10s --shutdown-delay 0")
	cmd, exited, stderr, addr := p.cmd, p.exited, p.stderr, p.addr

	body := `{"rule":"login","key":"192.0.2.1","hits":1}`
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Expect: 100-continue makes the server say when the handler starts
	// reading the body: from then on the request is in flight, however
	// slow the machine.
	fmt.Fprintf(conn, "POST /v1/check HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(body))
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("waiting for 100 Continue: %q %v", line, err)
	}
	if blank, err := br.ReadString('\n'); err != nil || blank != "\r\n" {
		t.Fatalf("after 100 Continue: %q %v", blank, err)
	}
	if _, err := io.WriteString(conn, body[:10]); err != nil {
		t.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The listener closes once the signal is handled; the request in
	// flight keeps the process up meanwhile.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still accepting connections 30s after SIGTERM")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a chance to exit early; this asserts no time
	select {
	case err := <-exited:
		t.Fatalf("exited with a request in flight: %v\n%s", err, stderr.String())
	default:
	}
	if _, err := io.WriteString(conn, body[10:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the in-flight response: %v", err)
	}
	var d map[string]any
	json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	if resp.StatusCode != 200 || d["allowed"] != true {
		t.Fatalf("in-flight request: %d %v", resp.StatusCode, d)
	}
	conn.Close()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("did not exit after the in-flight request finished")
	}
}

// TestServeTLSFromEnvironment: WEIR_TLS_CERT, WEIR_TLS_KEY and
// WEIR_TLS_CLIENT_CA serve HTTPS with mutual TLS; the serving line says
// https.
func TestServeTLSFromEnvironment(t *testing.T) {
	pki := certtest.New(t)
	env := map[string]string{
		"WEIR_HTTP": "127.0.0.1:0", "WEIR_GRPC": "off", "WEIR_LOG_LEVEL": "error",
		"WEIR_TLS_CERT": pki.Cert, "WEIR_TLS_KEY": pki.Key, "WEIR_TLS_CLIENT_CA": pki.CA,
	}
	base, _, stop := startServe(t, env)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("base %s: want https", base)
	}
	for _, withCert := range []bool{true, false} {
		tr := &http.Transport{TLSClientConfig: pki.ClientConfig(withCert)}
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		tr.CloseIdleConnections()
		if withCert != (err == nil && resp.StatusCode == 200) {
			t.Errorf("client certificate %v: %v", withCert, err)
		}
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	// A key without its certificate is refused at start.
	_, errs, code := runCLI(t, "serve", "--tls-key", pki.Key, "--http", "127.0.0.1:0", "--grpc", "off")
	if code == 0 || !strings.Contains(errs, "certificate") {
		t.Fatalf("--tls-key alone: exit %d, %s", code, errs)
	}
}

// TestServeTracesFromOTELEnvironment: weir serve exports a span per check
// to the OTLP endpoint that OTEL_EXPORTER_OTLP_ENDPOINT names, a child of
// the caller's traceparent, and flushes on exit.
func TestServeTracesFromOTELEnvironment(t *testing.T) {
	rc := otlptest.NewHTTP(t)
	env := map[string]string{
		"WEIR_HTTP": "127.0.0.1:0", "WEIR_GRPC": "off", "WEIR_LOG_LEVEL": "error",
		"OTEL_EXPORTER_OTLP_ENDPOINT": rc.Endpoint,
		"OTEL_BSP_SCHEDULE_DELAY":     "3600000", // only the flush on exit sends
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	base, _, stop := startServe(t, env)
	req, _ := http.NewRequest("POST", base+"/v1/check", strings.NewReader(`{"rule":"login","key":"203.0.113.9","hits":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("check: %v %v", resp, err)
	}
	resp.Body.Close()
	if code := stop(); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var found bool
	for _, sp := range rc.Spans() {
		if sp.Name == "weir.check" && sp.TraceID == "0af7651916cd43dd8448eb211c80319c" && sp.Parent == "b7ad6b7169203331" && sp.Attrs["weir.rule"] == "login" && sp.Service == "weir" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no weir.check span under the caller's trace after exit: %+v", rc.Spans())
	}
}

// TestServeRefuseRoot: --refuse-root (or WEIR_REFUSE_ROOT, which the
// container image sets) stops weir serve from serving as root, and only as
// root.
func TestServeRefuseRoot(t *testing.T) {
	saved := geteuid
	t.Cleanup(func() { geteuid = saved })
	none := func(string) (string, bool) { return "", false }
	fromEnv := func(k string) (string, bool) { return "true", k == "WEIR_REFUSE_ROOT" }

	geteuid = func() int { return 0 }
	for _, tc := range []struct {
		args   []string
		lookup func(string) (string, bool)
	}{
		{[]string{"--refuse-root"}, none},
		{nil, fromEnv},
	} {
		var stderr bytes.Buffer
		if f, _, code := parseServeArgs(tc.args, io.Discard, &stderr, tc.lookup); f != nil || code != 1 ||
			!strings.Contains(stderr.String(), "refusing to run as root") {
			t.Errorf("root, %v: exit %d, stderr %q", tc.args, code, stderr.String())
		}
	}
	// Root without the flag: permissive, as before.
	if f, _, _ := parseServeArgs(nil, io.Discard, io.Discard, none); f == nil {
		t.Error("root without --refuse-root refused")
	}
	geteuid = func() int { return 65532 }
	if f, _, _ := parseServeArgs(nil, io.Discard, io.Discard, fromEnv); f == nil || !f.refuseRoot {
		t.Error("an unprivileged user with WEIR_REFUSE_ROOT refused")
	}
}

// TestEnvoyConfigAloneRunsNoDemoRules: --envoy-config without --config
// runs the Envoy config's rules only, not the demo's, and the start-up log
// says which rules are in force; with nothing configured, the demo's.
func TestEnvoyConfigAloneRunsNoDemoRules(t *testing.T) {
	dir := t.TempDir()
	yml := "domain: edge\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--envoy-config", dir}, `rules=0 rules_from="none (Envoy config only)" rule_names="" envoy_rules=1 envoy_domains=edge`},
		{nil, `rules=3 rules_from="built-in demo" rule_names=demo-ip,login,api envoy_rules=0 envoy_domains=""`},
	} {
		f, _, code := parseServeArgs(append(tc.args, "--http", "127.0.0.1:0", "--grpc", "off"), io.Discard, io.Discard, func(string) (string, bool) { return "", false })
		if f == nil {
			t.Fatalf("%v: exit %d", tc.args, code)
		}
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		srv, err := server.New(serverOptions(f, log, func(string) (string, bool) { return "", false })...)
		if err != nil {
			t.Fatal(err)
		}
		hl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		announce(io.Discard, log, false, srv, hl, nil)
		hl.Close()
		srv.Close()
		if !strings.Contains(logs.String(), tc.want) {
			t.Errorf("%v: start-up log\n%s\nwant %s", tc.args, logs.String(), tc.want)
		}
	}
}
