package server

import (
	"fmt"
	"strings"
	"testing"
)

// authConfig is a login rule behind a proxy on loopback.
const authConfig = `
trusted_proxies: [127.0.0.1/32, "::1/128"]
%s
rules:
  - name: login
    match: { methods: [POST], path: /login }
    identity: [ip]
    limit: 3/m
    algorithm: sliding_window
`

// authCall sends a /v1/auth request with the given headers.
func authCall(t *testing.T, base string, hdr ...string) (int, string) {
	t.Helper()
	resp, b := call(t, "GET", base+"/v1/auth", "", hdr...)
	return resp.StatusCode, string(b)
}

// TestAuthHeaderFamilies: a client that adds the header family its proxy
// does not set cannot move its request out of a rule. Behind Caddy or
// Traefik (X-Forwarded-*), a client's X-Original-URI: /robots.txt on
// POST /login is refused in auto and ignored with auth_headers:
// forwarded; behind nginx (X-Original-*), a client's X-Forwarded-Uri is
// refused in auto and ignored with auth_headers: original.
func TestAuthHeaderFamilies(t *testing.T) {
	caddy := []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Forwarded-Host", "app.example", "X-Forwarded-For", "198.51.100.4"}
	nginx := []string{"X-Original-Method", "POST", "X-Original-URI", "/login", "X-Original-Host", "app.example", "X-Real-IP", "198.51.100.4"}
	attackOriginal := []string{"X-Original-URI", "/robots.txt", "X-Original-Method", "GET"}
	attackForwarded := []string{"X-Forwarded-Uri", "/robots.txt", "X-Forwarded-Method", "GET"}
	for _, c := range []struct {
		name, setting string
		hdr           []string
		want          []int // status of 4 logins
		mention       string
	}{
		{"caddy, auto, attacker's X-Original-*", "", append(append([]string{}, caddy...), attackOriginal...), []int{400, 400, 400, 400}, `X-Original-URI "/robots.txt" and X-Forwarded-Uri "/login"`},
		{"caddy, auto, attacker's X-Original-Method alone", "", append(append([]string{}, caddy...), "X-Original-Method", "GET"), []int{400, 400, 400, 400}, `X-Forwarded-Method "POST" and X-Original-Method "GET"`},
		{"caddy, forwarded, attacker's X-Original-*", "server: {auth_headers: forwarded}", append(append([]string{}, caddy...), attackOriginal...), []int{200, 200, 200, 403}, ""},
		{"caddy, auto, honest", "", caddy, []int{200, 200, 200, 403}, ""},
		{"nginx, auto, attacker's X-Forwarded-*", "", append(append([]string{}, nginx...), attackForwarded...), []int{400, 400, 400, 400}, `X-Original-URI "/login" and X-Forwarded-Uri "/robots.txt"`},
		{"nginx, original, attacker's X-Forwarded-*", "server: {auth_headers: original}", append(append([]string{}, nginx...), attackForwarded...), []int{200, 200, 200, 403}, ""},
		// Both families, so the proxy cannot be told, and X-Real-IP without
		// X-Forwarded-For: nginx's X-Real-IP, or one a client sent through
		// a Caddy that dropped X-Forwarded-For. Refused.
		{"nginx, auto, agreeing families", "", append(append([]string{}, nginx...), "X-Forwarded-Uri", "/login", "X-Forwarded-Method", "post", "X-Forwarded-Host", "APP.example"), []int{400, 400, 400, 400}, `X-Real-IP "198.51.100.4" names another client`},
		{"nginx, forwarded", "server: {auth_headers: forwarded}", nginx, []int{400, 400, 400, 400}, "lacks X-Forwarded-Uri, which server.auth_headers: forwarded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ts := newTestServer(t, WithConfig(mustParse(t, fmt.Sprintf(authConfig, c.setting))))
			for i, want := range c.want {
				code, body := authCall(t, ts.URL, c.hdr...)
				if code != want {
					t.Fatalf("login %d: %d %s, want %d", i+1, code, body, want)
				}
				if c.mention != "" && !strings.Contains(decode(t, []byte(body))["detail"].(string), c.mention) {
					t.Fatalf("login %d: %s, want it to mention %s", i+1, body, c.mention)
				}
			}
		})
	}
}

// TestAuthClientIPByFamily: in client_ip_header auto, the address the
// proxy wrote is the client: X-Real-IP behind nginx (which passes a
// client's X-Forwarded-For on), X-Forwarded-For behind Caddy and Traefik
// (Caddy passes a client's X-Real-IP on).
func TestAuthClientIPByFamily(t *testing.T) {
	for _, c := range []struct {
		name string
		hdr  func(i int) []string
	}{
		{"nginx, fresh X-Forwarded-For", func(i int) []string {
			return []string{"X-Original-Method", "POST", "X-Original-URI", "/login", "X-Real-IP", "198.51.100.4", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1)}
		}},
		{"caddy, fresh X-Real-IP", func(i int) []string {
			return []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Forwarded-For", "198.51.100.4", "X-Real-IP", fmt.Sprintf("203.0.113.%d", i+1)}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ts := newTestServer(t, WithConfig(mustParse(t, fmt.Sprintf(authConfig, ""))))
			allowed := 0
			for i := range 6 {
				if code, _ := authCall(t, ts.URL, c.hdr(i)...); code == 200 {
					allowed++
				}
			}
			if allowed != 3 {
				t.Errorf("%d of 6 logins allowed, want 3", allowed)
			}
		})
	}
}

// TestAuthAgreeingFamiliesClientIP: in auto, a request carrying the
// forwarded family (X-Forwarded-Uri) is read from X-Forwarded-For, never
// from an X-Real-IP a client sent through Caddy, even when the client
// also sends X-Original-* equal to its real request; and a request with
// both families whose X-Real-IP and X-Forwarded-For name different
// clients is refused, since either may be the client's (nginx passes a
// client's X-Forwarded-* on).
func TestAuthAgreeingFamiliesClientIP(t *testing.T) {
	caddy := []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Forwarded-Host", "app.example", "X-Forwarded-For", "198.51.100.4",
		"X-Original-Method", "POST", "X-Original-URI", "/login", "X-Original-Host", "app.example"}
	nginx := []string{"X-Original-Method", "POST", "X-Original-URI", "/login", "X-Original-Host", "app.example", "X-Real-IP", "198.51.100.4",
		"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/login", "X-Forwarded-Host", "app.example"}
	with := func(base []string, more ...string) func(int) []string {
		return func(int) []string { return append(append([]string{}, base...), more...) }
	}
	for _, c := range []struct {
		name string
		hdr  func(i int) []string
		want []int // status of 4 logins
	}{
		{"caddy, a fresh X-Real-IP", func(i int) []string {
			return append(append([]string{}, caddy...), "X-Real-IP", fmt.Sprintf("203.0.113.%d", i+1))
		}, []int{400, 400, 400, 400}},
		{"caddy, an allow-listed X-Real-IP", with(caddy, "X-Real-IP", "192.0.2.9"), []int{400, 400, 400, 400}},
		{"caddy, X-Real-IP the client's own", with(caddy, "X-Real-IP", "198.51.100.4"), []int{200, 200, 200, 403}},
		{"caddy, no X-Real-IP", with(caddy), []int{200, 200, 200, 403}},
		{"nginx, a fresh X-Forwarded-For", func(i int) []string {
			return append(append([]string{}, nginx...), "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i+1))
		}, []int{400, 400, 400, 400}},
		{"nginx, an allow-listed X-Forwarded-For", with(nginx, "X-Forwarded-For", "192.0.2.9"), []int{400, 400, 400, 400}},
		{"nginx appending to X-Forwarded-For", with(nginx, "X-Forwarded-For", "192.0.2.9, 198.51.100.4"), []int{200, 200, 200, 403}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, ts := newTestServer(t, WithConfig(mustParse(t, fmt.Sprintf(authConfig, "allow: [192.0.2.9]"))))
			for i, want := range c.want {
				code, body := authCall(t, ts.URL, c.hdr(i)...)
				if code != want {
					t.Fatalf("login %d: %d %s, want %d", i+1, code, body, want)
				}
				if want == 400 && !strings.Contains(body, "names another client than X-Forwarded-For") {
					t.Fatalf("login %d: %s, want it to name both headers", i+1, body)
				}
			}
		})
	}
}

// TestCheckCanonicalIPKeys: POST /v1/check under an ip rule counts one
// client however its address is spelled, the same counter /v1/auth uses,
// and the admin API reaches it by any spelling.
func TestCheckCanonicalIPKeys(t *testing.T) {
	const token = "0123456789abcdef-token"
	_, ts := newTestServer(t, WithConfig(mustParse(t, fmt.Sprintf(authConfig, ""))), WithAdminToken(token))
	for _, pair := range [][2]string{{"::ffff:203.0.113.9", "203.0.113.9"}, {"2001:DB8::1", "2001:db8:0::1"}} {
		for i := range 3 {
			if code, d := check(t, ts.URL, "login", pair[i%2], 1); code != 200 || d["allowed"] != true {
				t.Fatalf("%q, call %d: %d %v", pair[i%2], i+1, code, d)
			}
		}
		if code, d := check(t, ts.URL, "login", pair[1], 1); code != 429 || d["allowed"] != false {
			t.Fatalf("4th call as %q after %q: %d %v; want limited, one counter", pair[1], pair[0], code, d)
		}
		// The admin API reads and resets the same counter.
		resp, b := call(t, "GET", ts.URL+"/v1/state?rule=login&key="+urlQuery(pair[0]), "", bearer(token)...)
		if d := decode(t, b); resp.StatusCode != 200 || d["remaining"] != float64(0) {
			t.Fatalf("GET /v1/state %q: %d %s", pair[0], resp.StatusCode, b)
		}
		resp, b = call(t, "DELETE", ts.URL+"/v1/state?rule=login&key="+urlQuery(pair[0]), "", bearer(token)...)
		if resp.StatusCode != 200 {
			t.Fatalf("DELETE /v1/state: %d %s", resp.StatusCode, b)
		}
		if code, d := check(t, ts.URL, "login", pair[1], 1); code != 200 || d["allowed"] != true {
			t.Fatalf("after DELETE /v1/state of %q, %q: %d %v", pair[0], pair[1], code, d)
		}
	}
	// /v1/auth's identity of a client is /v1/check's.
	for range 3 {
		if code, body := authCall(t, ts.URL, "X-Original-Method", "POST", "X-Original-URI", "/login", "X-Real-IP", "2001:db8:7::1"); code != 200 {
			t.Fatalf("auth: %d %s", code, body)
		}
	}
	if code, d := check(t, ts.URL, "login", "2001:DB8:7:0:ffff::5", 0); code != 429 || d["remaining"] != float64(0) {
		t.Fatalf("/v1/check of another address of the same /64 after 3 auths: %d %v", code, d)
	}
	if code, d := check(t, ts.URL, "login", "2001:db8::/32", 1); code != 400 || !strings.Contains(d["detail"].(string), `"2001:db8::/32"`) {
		t.Fatalf("a /32 key: %d %v", code, d)
	}
}

func urlQuery(s string) string { return strings.NewReplacer(":", "%3A", "/", "%2F").Replace(s) }

// TestCheckCrossSite: /v1/check takes JSON only, and no browser request
// made for a page of another site.
func TestCheckCrossSite(t *testing.T) {
	_, ts := newTestServer(t)
	host := strings.TrimPrefix(ts.URL, "http://")
	body := `{"rule":"login","key":"192.0.2.50","hits":0}`
	for _, c := range []struct {
		name    string
		hdr     []string
		status  int
		mention string
	}{
		{"no Content-Type", nil, 415, "no Content-Type"},
		{"text/plain", []string{"Content-Type", "text/plain"}, 415, `"text/plain" is not JSON`},
		{"form", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "not JSON"},
		{"json", []string{"Content-Type", "application/json"}, 200, ""},
		{"json with charset", []string{"Content-Type", "Application/JSON; charset=utf-8"}, 200, ""},
		{"+json", []string{"Content-Type", "application/vnd.weir+json"}, 200, ""},
		{"cross-site", []string{"Content-Type", "application/json", "Sec-Fetch-Site", "cross-site"}, 403, "cross-site"},
		{"same-site", []string{"Content-Type", "application/json", "Sec-Fetch-Site", "same-site"}, 403, "same-site"},
		{"cross-site text/plain", []string{"Content-Type", "text/plain", "Sec-Fetch-Site", "cross-site"}, 403, "cross-site"},
		{"same-origin", []string{"Content-Type", "application/json", "Sec-Fetch-Site", "same-origin", "Origin", "http://" + host}, 200, ""},
		{"foreign Origin", []string{"Content-Type", "application/json", "Origin", "https://evil.example"}, 403, "evil.example"},
		{"null Origin", []string{"Content-Type", "application/json", "Origin", "null"}, 403, "null"},
		{"own Origin", []string{"Content-Type", "application/json", "Origin", "http://" + host}, 200, ""},
		{"Origin of the proxy's host", []string{"Content-Type", "application/json", "Origin", "https://weir.example", "X-Forwarded-Host", "weir.example"}, 200, ""},
	} {
		resp, b := call(t, "POST", ts.URL+"/v1/check", body, c.hdr...)
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, b, c.status)
			continue
		}
		if c.mention != "" {
			d := decode(t, b)
			code := map[int]string{415: "unsupported_media_type", 403: "cross_site_request"}[c.status]
			if d["error"] != code || !strings.Contains(d["detail"].(string), c.mention) {
				t.Errorf("%s: %s, want %s mentioning %s", c.name, b, code, c.mention)
			}
		}
	}
	// Nothing was counted by the refused requests.
	if code, d := check(t, ts.URL, "login", "192.0.2.50", 0); code != 200 || d["remaining"] != float64(3) {
		t.Errorf("after refused requests: %d %v", code, d)
	}
}
