package server

// End-to-end bypass attempts through real nginx and Caddy: a client that
// adds the header family its proxy does not set, or forwarding headers of
// its own, must stay inside the login rule (3/m in the examples).

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy/config"
)

// attackerIP is the loopback address the attacking client connects from:
// not in the examples' trusted_proxies (127.0.0.1/32), as a real client's
// address is not.
const attackerIP = "127.0.0.7"

// clientFrom returns an HTTP client whose connections come from ip.
func clientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", "127.0.0.1:1")
	if err == nil {
		c.Close()
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// logins posts n logins to base with the headers hdr(i) gives, and
// returns the statuses.
func logins(t *testing.T, c *http.Client, base string, n int, hdr func(i int) []string) []int {
	t.Helper()
	var out []int
	for i := range n {
		req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader("user=a"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		h := hdr(i)
		for j := 0; j+1 < len(h); j += 2 {
			req.Header.Set(h[j], h[j+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out = append(out, resp.StatusCode)
	}
	return out
}

// wantLimitedAfter3 checks that the first three logins reached the app and
// none after did.
func wantLimitedAfter3(t *testing.T, what string, got []int) {
	t.Helper()
	for i, code := range got {
		if ok := code == 200; ok != (i < 3) {
			t.Fatalf("%s: statuses %v; want 3 logins through, then none (the login rule is 3/m)", what, got)
		}
	}
}

func startNginx(t *testing.T, f *weirFleet, app string, pairs ...string) string {
	t.Helper()
	return startNginxWith(t, f, app, func(string) []string { return pairs })
}

// startNginxWith is startNginx with render pairs that may name nginx's
// listen address.
func startNginxWith(t *testing.T, f *weirFleet, app string, more func(listen string) []string) string {
	t.Helper()
	nginx := requireBinary(t, "nginx")
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "nginx", "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	listen := freeAddr(t)
	all := append([]string{
		"listen 127.0.0.1:8000;", "listen " + listen + ";",
		"server 127.0.0.1:8080;", "server " + f.addr[0] + ";\n        server " + f.addr[1] + ";",
		"server 127.0.0.1:3000;", "server " + app + ";",
	}, more(listen)...)
	dir := t.TempDir()
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(render(t, string(src), all...)), 0o644); err != nil {
		t.Fatal(err)
	}
	startProcess(t, listen, nil, nginx, "-p", dir, "-c", path, "-g", "master_process off;")
	return "http://" + listen
}

func startCaddy(t *testing.T, f *weirFleet, app string, pairs ...string) string {
	t.Helper()
	caddy := requireBinary(t, "caddy")
	src, err := os.ReadFile(filepath.Join("..", "..", "examples", "caddy", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	listen := freeAddr(t)
	all := append([]string{
		"http://127.0.0.1:8000 {", "http://" + listen + " {",
		"forward_auth 127.0.0.1:8080 {", "forward_auth " + f.addr[0] + " " + f.addr[1] + " {",
		"reverse_proxy 127.0.0.1:3000 {", "reverse_proxy " + app + " {",
	}, pairs...)
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(render(t, string(src), all...)), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}
	startProcess(t, listen, env, caddy, "run", "--adapter", "caddyfile", "--config", path)
	return "http://" + listen
}

// defaults puts the settings a config without them gets.
func defaults(cfg *config.Config) {
	cfg.Server.AuthHeaders = ""
	cfg.ClientIPHeader = ""
}

// nginx's stripping lines, and its X-Forwarded-For line: without them it
// is configured the common way.
var nginxCommon = []string{
	"            proxy_set_header X-Forwarded-Uri \"\";\n", "",
	"            proxy_set_header X-Forwarded-Method \"\";\n", "",
	"            proxy_set_header X-Forwarded-Host \"\";\n", "",
	"            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n", "",
}

// TestNginxBypass: through nginx, a client's X-Forwarded-Uri: /robots.txt
// and X-Forwarded-Method: GET on POST /login, or a fresh X-Forwarded-For
// on every login, do not escape the login rule: with the example as it
// is, and with nginx configured the common way (X-Real-IP set, the
// client's X-Forwarded-For passed on, nothing stripped) and weir's
// defaults.
func TestNginxBypass(t *testing.T) {
	requireBinary(t, "nginx")
	app := startApp(t)
	attack := func(i int) []string {
		return []string{"X-Forwarded-Uri", "/robots.txt", "X-Forwarded-Method", "GET", "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)}
	}
	freshXFF := func(i int) []string { return []string{"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)} }
	client := clientFrom(t, attackerIP)

	t.Run("example", func(t *testing.T) {
		f := startWeirFleet(t, "nginx")
		base := startNginx(t, f, app)
		wantLimitedAfter3(t, "X-Forwarded-Uri and a fresh X-Forwarded-For", logins(t, client, base, 5, attack))
	})
	t.Run("common config, weir defaults", func(t *testing.T) {
		f := startWeirFleet(t, "nginx", defaults)
		base := startNginx(t, f, app, nginxCommon...)
		wantLimitedAfter3(t, "a fresh X-Forwarded-For", logins(t, clientFrom(t, "127.0.0.8"), base, 6, freshXFF))
		// The families disagree: weir refuses, nginx answers 500, nothing
		// reaches the application.
		for i, code := range logins(t, client, base, 4, attack) {
			if code == 200 {
				t.Fatalf("login %d with X-Forwarded-Uri: /robots.txt reached the app", i+1)
			}
		}
	})
}

// TestCaddyBypass: through Caddy, a client's X-Original-URI: /robots.txt
// and X-Original-Method: GET on POST /login, or a fresh X-Real-IP or
// X-Forwarded-For on every login, do not escape the login rule: with the
// example as it is, and with Caddy stripping nothing and weir's defaults.
func TestCaddyBypass(t *testing.T) {
	requireBinary(t, "caddy")
	app := startApp(t)
	attack := func(i int) []string {
		return []string{"X-Original-URI", "/robots.txt", "X-Original-Method", "GET",
			"X-Real-IP", fmt.Sprintf("192.0.2.%d", i+1), "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)}
	}
	fresh := func(i int) []string {
		return []string{"X-Real-IP", fmt.Sprintf("192.0.2.%d", i+1), "X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)}
	}
	client := clientFrom(t, attackerIP)

	t.Run("example", func(t *testing.T) {
		f := startWeirFleet(t, "caddy")
		base := startCaddy(t, f, app)
		wantLimitedAfter3(t, "X-Original-URI and fresh X-Real-IP and X-Forwarded-For", logins(t, client, base, 5, attack))
	})
	t.Run("nothing stripped, weir defaults", func(t *testing.T) {
		f := startWeirFleet(t, "caddy", defaults)
		base := startCaddy(t, f, app,
			"\t\theader_up -X-Original-URI\n\t\theader_up -X-Original-Method\n\t\theader_up -X-Original-Host\n\t\theader_up -X-Real-IP\n", "")
		for i, code := range logins(t, client, base, 4, attack) {
			if code == 200 {
				t.Fatalf("login %d with X-Original-URI: /robots.txt reached the app", i+1)
			}
		}
		wantLimitedAfter3(t, "fresh X-Real-IP and X-Forwarded-For", logins(t, clientFrom(t, "127.0.0.8"), base, 6, fresh))
	})
}

// TestNginxIPv6Rotation: one IPv6 host sending each request from another
// address of its /64 is one client. nginx learns the client address from
// a load balancer in front of it (realip: X-Forwarded-For from 127.0.0.1)
// and passes it to weir in X-Real-IP, as the example does.
func TestNginxIPv6Rotation(t *testing.T) {
	requireBinary(t, "nginx")
	app := startApp(t)
	f := startWeirFleet(t, "nginx")
	base := startNginxWith(t, f, app, func(listen string) []string {
		return []string{"listen " + listen + ";", "listen " + listen + ";\n        set_real_ip_from 127.0.0.1;\n        real_ip_header X-Forwarded-For;"}
	})
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(from string) int {
		req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
		req.Header.Set("X-Forwarded-For", from)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	admitted := 0
	for i := range 20 {
		if get(fmt.Sprintf("2001:db8:aa:bb:%x::1", i+1)) == 200 {
			admitted++
		}
	}
	if want := int(f.limit.Rate); admitted != want {
		t.Fatalf("%d of 20 requests from 20 addresses of one /64 admitted; want %d, the per-ip limit", admitted, want)
	}
	if code := get("2001:db8:aa:cc::1"); code != 200 {
		t.Fatalf("another /64: %d", code)
	}
}

// noneAfter3 checks that at most the first three logins reached the app.
func noneAfter3(t *testing.T, what string, got []int) {
	t.Helper()
	for i, code := range got {
		if code == 200 && i >= 3 {
			t.Fatalf("%s: statuses %v; want at most the first 3 logins through (the login rule is 3/m)", what, got)
		}
	}
}

// TestCaddyBypassAgreeingFamilies: through Caddy stripping nothing, with
// weir's defaults, a client that sends X-Original-URI, -Method and -Host
// equal to its real request (so that the two families agree) and an
// X-Real-IP of its choosing neither becomes a new client on every login
// nor claims an allow-listed address: none of its logins reaches the
// application, while a client sending nothing of the kind gets its 3.
func TestCaddyBypassAgreeingFamilies(t *testing.T) {
	requireBinary(t, "caddy")
	app := startApp(t)
	f := startWeirFleet(t, "caddy", defaults, func(cfg *config.Config) { cfg.Allow = []string{"192.0.2.9"} })
	base := startCaddy(t, f, app,
		"\t\theader_up -X-Original-URI\n\t\theader_up -X-Original-Method\n\t\theader_up -X-Original-Host\n\t\theader_up -X-Real-IP\n", "")
	host := strings.TrimPrefix(base, "http://")
	agreeing := func(realIP func(i int) string) func(i int) []string {
		return func(i int) []string {
			return []string{"X-Original-URI", "/login", "X-Original-Method", "POST", "X-Original-Host", host, "X-Real-IP", realIP(i)}
		}
	}
	for what, realIP := range map[string]func(int) string{
		"a fresh X-Real-IP":         func(i int) string { return fmt.Sprintf("203.0.113.%d", i+1) },
		"an allow-listed X-Real-IP": func(int) string { return "192.0.2.9" },
	} {
		for i, code := range logins(t, clientFrom(t, attackerIP), base, 6, agreeing(realIP)) {
			if code == 200 {
				t.Fatalf("%s and agreeing X-Original-*: login %d reached the app", what, i+1)
			}
		}
	}
	wantLimitedAfter3(t, "an honest client", logins(t, clientFrom(t, "127.0.0.8"), base, 5, func(int) []string { return nil }))
}

// TestNginxBypassAgreeingFamilies: through nginx configured the common way
// (X-Real-IP set, the client's X-Forwarded-* passed on), with weir's
// defaults, a client that sends X-Forwarded-Uri, -Method and -Host equal
// to its real request and a fresh X-Forwarded-For stays inside the login
// rule: weir does not take the request for Caddy's and believe the
// client's X-Forwarded-For.
func TestNginxBypassAgreeingFamilies(t *testing.T) {
	requireBinary(t, "nginx")
	app := startApp(t)
	f := startWeirFleet(t, "nginx", defaults)
	base := startNginx(t, f, app, nginxCommon...)
	hostOnly, _, _ := strings.Cut(strings.TrimPrefix(base, "http://"), ":")
	noneAfter3(t, "agreeing X-Forwarded-* and a fresh X-Forwarded-For", logins(t, clientFrom(t, attackerIP), base, 6, func(i int) []string {
		return []string{"X-Forwarded-Uri", "/login", "X-Forwarded-Method", "POST", "X-Forwarded-Host", hostOnly,
			"X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i+1)}
	}))
	wantLimitedAfter3(t, "an honest client", logins(t, clientFrom(t, "127.0.0.8"), base, 5, func(int) []string { return nil }))
}
