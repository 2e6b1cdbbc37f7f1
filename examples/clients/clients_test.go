// Package clients_test runs the example clients (Python, Node.js and curl)
// against a live `weir serve`: allowed, limited, a caller's mistake, and
// weir unreachable or silent with fail-open and fail-closed.
package clients_test

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// config is the rule the clients ask about: 2 per minute per key.
const config = `
rules:
  - name: api
    identity: [header:X-API-Key]
    limit: 2/h # an hour: no unit comes back while slow clients start
    algorithm: fixed_window
`

// client runs one example client: args are rule, key, base URL, timeout
// in milliseconds and fail-open, turned into the client's own flags.
type client struct {
	name, tool string
	args       func(url, rule, key string, timeoutMS int, failOpen bool) (argv, env []string)
}

var clients = []client{
	{"python", "python3", func(url, rule, key string, ms int, open bool) ([]string, []string) {
		a := []string{"python3", "python/weir_client.py", "--url", url, "--rule", rule, "--key", key, "--timeout", fmtSeconds(ms)}
		if !open {
			a = append(a, "--fail-closed")
		}
		return a, nil
	}},
	{"node", "node", func(url, rule, key string, ms int, open bool) ([]string, []string) {
		a := []string{"node", "node/weir-client.mjs", "--url", url, "--rule", rule, "--key", key, "--timeout-ms", itoa(ms)}
		if !open {
			a = append(a, "--fail-closed")
		}
		return a, nil
	}},
	{"curl", "curl", func(url, rule, key string, ms int, open bool) ([]string, []string) {
		fo := "1"
		if !open {
			fo = "0"
		}
		return []string{"sh", "curl/check.sh", rule, key}, []string{"WEIR_URL=" + url, "WEIR_TIMEOUT=" + fmtSeconds(ms), "WEIR_FAIL_OPEN=" + fo}
	}},
}

func TestClients(t *testing.T) {
	base := startWeir(t, buildWeir(t))
	closed := closedAddr(t)
	silent := silentAddr(t)
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			need(t, c.tool)
			run := func(url, rule, key string, ms int, open bool) (code int, stdout, stderr string) {
				t.Helper()
				argv, env := c.args(url, rule, key, ms, open)
				cmd := exec.Command(argv[0], argv[1:]...)
				cmd.Env = append(os.Environ(), env...)
				var o, e bytes.Buffer
				cmd.Stdout, cmd.Stderr = &o, &e
				err := cmd.Run()
				var ee *exec.ExitError
				switch {
				case errors.As(err, &ee):
					code = ee.ExitCode()
				case err != nil:
					t.Fatalf("%s: %v", strings.Join(argv, " "), err)
				}
				return code, strings.TrimSpace(o.String()), strings.TrimSpace(e.String())
			}
			expect := func(what string, code int, out, errOut string, wantCode int, wantOut, wantErr string) {
				t.Helper()
				if code != wantCode || !strings.HasPrefix(out, wantOut) || !strings.Contains(errOut, wantErr) || (wantErr == "" && errOut != "") {
					t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, stdout %q…, stderr with %q", what, code, out, errOut, wantCode, wantOut, wantErr)
				}
			}
			key := "client-" + c.name
			code, out, errOut := run(base, "api", key, 2000, true)
			expect("1st of 2/h", code, out, errOut, 0, "allowed remaining=1", "")
			code, out, errOut = run(base, "api", key, 2000, true)
			expect("2nd of 2/h", code, out, errOut, 0, "allowed remaining=0", "")
			code, out, errOut = run(base, "api", key, 2000, true)
			expect("3rd of 2/h", code, out, errOut, 1, "limited retry_after_ms=", "")
			code, out, errOut = run(base, "nosuch", key, 2000, true)
			expect("unknown rule", code, out, errOut, 2, "", "unknown_rule")
			for _, down := range []struct{ what, url string }{{"weir not listening", closed}, {"weir not answering", silent}} {
				code, out, errOut = run(down.url, "api", key, 300, true)
				expect(down.what+", fail-open", code, out, errOut, 0, "allowed (weir unavailable, failing open)", "failing open")
				code, out, errOut = run(down.url, "api", key, 300, false)
				expect(down.what+", fail-closed", code, out, errOut, 1, "refused (weir unavailable, failing closed)", "failing closed")
			}
		})
	}
}

// need skips the test when tool is missing, or fails it under CI, where
// scripts/deps.sh installs it.
func need(t *testing.T, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but %s is missing (scripts/deps.sh installs it from Debian)", tool)
		}
		t.Skipf("%s is missing (scripts/deps.sh installs it from Debian)", tool)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// fmtSeconds renders milliseconds as seconds for the Python and curl
// clients, such as 0.3.
func fmtSeconds(ms int) string { return strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64) }

// closedAddr is the URL of a port nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// silentAddr is the URL of a listener that accepts connections and never
// answers: the clients' timeout must end the call.
func silentAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return "http://" + ln.Addr().String()
}

// buildWeir builds cmd/weir into a temporary directory.
func buildWeir(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "weir")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/weir")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/weir: %v\n%s", err, out)
	}
	return bin
}

// startWeir runs `weir serve` with config on free ports and waits until
// it is ready.
func startWeir(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "weir.yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr, grpcAddr := strings.TrimPrefix(closedAddr(t), "http://"), strings.TrimPrefix(closedAddr(t), "http://")
	var log bytes.Buffer
	cmd := exec.Command(bin, "serve", "--config", cfg, "--http", httpAddr, "--grpc", grpcAddr)
	cmd.Stdout, cmd.Stderr = &log, &log
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
		if t.Failed() {
			t.Logf("weir serve log:\n%s", log.String())
		}
	})
	base := "http://" + httpAddr
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("weir serve exited: %v", err)
		default:
		}
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("weir serve not ready on %s within 20s", base)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
