package server

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// serveFrom runs one request through h as if it came from the peer remote.
func serveFrom(h http.Handler, method, target, remote string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestAdminTokenTrimmed: a token read from a file-mounted secret ends in a
// newline; the admin API must accept the token without it.
func TestAdminTokenTrimmed(t *testing.T) {
	const secret = "0123456789abcdef0123"
	for name, opt := range map[string]Option{
		"option": WithAdminToken(secret + "\n"),
		"env": WithLookupEnv(func(k string) (string, bool) {
			if k == DefaultAdminTokenEnv {
				return " " + secret + "\r\n", true
			}
			return "", false
		}),
	} {
		t.Run(name, func(t *testing.T) {
			s, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), opt)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if rec := serveFrom(s.Handler(), "GET", "/v1/blocked", "192.0.2.1:1000", bearer(secret)...); rec.Code != 200 {
				t.Fatalf("GET /v1/blocked with the trimmed token: %d %s", rec.Code, rec.Body)
			}
		})
	}
	// A blank token is no token: the admin API stays off.
	s, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken(" \n"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.AdminEnabled() {
		t.Fatal("a blank token turned the admin API on")
	}
}

// TestAdminTokenShortWarns: a token under 16 bytes is accepted with a
// warning that does not carry it.
func TestAdminTokenShortWarns(t *testing.T) {
	for _, tc := range []struct {
		token string
		warn  bool
	}{{"pw-1234", true}, {"0123456789abcdef", false}} {
		var buf bytes.Buffer
		s, err := New(WithConfig(mustParse(t, testConfig)), WithAdminToken(tc.token),
			WithLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))))
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		out := buf.String()
		if got := strings.Contains(out, "admin token is short"); got != tc.warn {
			t.Errorf("token of %d bytes: warned %v, want %v; log:\n%s", len(tc.token), got, tc.warn, out)
		}
		if strings.Contains(out, tc.token) {
			t.Errorf("the log shows the token:\n%s", out)
		}
	}
}

// TestAdminAuthFailuresThrottled: failed attempts are counted in
// weir_admin_auth_failures_total; after authFailures of them a client is
// refused even with the right token, while another client still gets in.
func TestAdminAuthFailuresThrottled(t *testing.T) {
	const secret = "0123456789abcdef0123"
	s, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken(secret))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	const attacker = "192.0.2.66:4000"
	for i := 1; i <= authFailures; i++ {
		rec := serveFrom(h, "GET", "/v1/blocked", attacker, bearer("guess-"+strconv.Itoa(i))...)
		if rec.Code != 401 {
			t.Fatalf("wrong token %d: %d %s, want 401", i, rec.Code, rec.Body)
		}
	}
	// Over the limit: refused, the right token too, and on the read-only
	// endpoints that take a token.
	for _, target := range []string{"/v1/blocked", "/v1/dashboard/snapshot", "/v1/top"} {
		rec := serveFrom(h, "GET", target, attacker, bearer(secret)...)
		if rec.Code != 429 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), codeAuthThrottled) {
			t.Fatalf("GET %s from a throttled client: %d %q %s, want 429 with Retry-After", target, rec.Code, rec.Header().Get("Retry-After"), rec.Body)
		}
		if ra, _ := strconv.Atoi(rec.Header().Get("Retry-After")); ra < int(authFailBlock.Seconds())-5 {
			t.Fatalf("GET %s from a throttled client: Retry-After %d, want the penalty box of %v", target, ra, authFailBlock)
		}
	}
	// The same IPv6 /64 is one client, another address is not.
	v6 := "[2001:db8:1:2::10]:5000"
	for i := 0; i < authFailures; i++ {
		serveFrom(h, "GET", "/v1/blocked", "[2001:db8:1:2::"+strconv.Itoa(100+i)+"]:5000", bearer("x")...)
	}
	if rec := serveFrom(h, "GET", "/v1/blocked", v6, bearer(secret)...); rec.Code != 429 {
		t.Fatalf("an address of a throttled /64: %d, want 429", rec.Code)
	}
	for _, other := range []string{"192.0.2.67:4000", "[2001:db8:1:3::10]:5000"} {
		if rec := serveFrom(h, "GET", "/v1/blocked", other, bearer(secret)...); rec.Code != 200 {
			t.Fatalf("the right token from %s: %d %s", other, rec.Code, rec.Body)
		}
	}
	rec := serveFrom(h, "GET", "/metrics", "192.0.2.1:1", nil...)
	bad := regexp.MustCompile(`(?m)^weir_admin_auth_failures_total\{reason="bad_token"\} (\d+)$`).FindStringSubmatch(rec.Body.String())
	thr := regexp.MustCompile(`(?m)^weir_admin_auth_failures_total\{reason="throttled"\} (\d+)$`).FindStringSubmatch(rec.Body.String())
	if bad == nil || thr == nil {
		t.Fatalf("no weir_admin_auth_failures_total in /metrics")
	}
	if bad[1] != strconv.Itoa(2*authFailures) || thr[1] != "4" {
		t.Fatalf("weir_admin_auth_failures_total: bad_token %s, throttled %s; want %d and 4", bad[1], thr[1], 2*authFailures)
	}
}

// TestAdminAuthFailuresBounded: the failure counters keep at most
// authFailKeys clients, however many addresses fail.
func TestAdminAuthFailuresBounded(t *testing.T) {
	s, err := New(WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken("0123456789abcdef0123"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := s.Handler()
	for i := 0; i < authFailKeys+3000; i++ {
		remote := "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":1"
		serveFrom(h, "GET", "/v1/blocked", remote, bearer("wrong")...)
	}
	if n := s.auth.store.Len(); n > authFailKeys {
		t.Fatalf("the failure counters hold %d clients, more than %d", n, authFailKeys)
	}
}
