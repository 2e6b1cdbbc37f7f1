package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/weir-dev/weir/clientip"
	"github.com/weir-dev/weir/policy/config"
)

// fuzzServer is one Server for a whole fuzz run: building one per input
// would make the fuzzer measure New instead of the handlers.
func fuzzServer(f *testing.F) *Server {
	f.Helper()
	s, err := New(WithConfig(mustParse(f, testConfig)), WithLogger(quietLogger()), WithAdminToken(""))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	return s
}

// Any body of POST /v1/check gets a JSON answer with a status the API
// documents; nothing panics and nothing answers 5xx, since the store (in
// memory) never fails.
func FuzzCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"rule":"login","key":"1.2.3.4"}`,
		`{"rule":"api","key":"k","hits":3}`,
		`{"rule":"api","key":"k","hits":0}`,
		`{"rule":"tiered","key":"k","tier":"pro","hits":1}`,
		`{"rule":"login","key":"::ffff:203.0.113.9","hits":1}`,
		`{"rule":"nope","key":"k"}`,
		`{"rule":"api","key":"k","hits":-1}`,
		`{"rule":"api","key":"k","hits":9223372036854775807}`,
		`{"rule":"api","key":"k","hits":1.5}`,
		`{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`,
		`{"rule":"api","domain":"d"}`,
		`{"rule":"api","key":"k"} {}`,
		`{}`, `[]`, `null`, ``, `"x"`, `{"rule":`,
	} {
		f.Add([]byte(s))
	}
	s := fuzzServer(f)
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/v1/check", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		checkAnswer(t, rec, body)
	})
}

// checkAnswer requires a JSON body and a status below 500.
func checkAnswer(t *testing.T, rec *httptest.ResponseRecorder, input any) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("input %q: status %d: %s", input, rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); rec.Body.Len() > 0 && !strings.Contains(ct, "json") {
		t.Fatalf("input %q: status %d with Content-Type %q", input, rec.Code, ct)
	}
	if rec.Body.Len() > 0 && !json.Valid(rec.Body.Bytes()) {
		t.Fatalf("input %q: status %d, body is not JSON: %q", input, rec.Code, rec.Body)
	}
}

// Any headers a proxy (trusted or not) forwards to GET /v1/auth get 200,
// 400, 403 or 429; nothing panics and nothing answers 5xx.
func FuzzAuthHeaders(f *testing.F) {
	type seed struct{ peer, uri, method, host, fwdURI, fwdMethod, xff, realIP, apiKey string }
	for _, s := range []seed{
		{"10.0.0.1:1", "/api/login", "POST", "", "", "", "192.0.2.1", "", ""},
		{"10.0.0.1:1", "", "", "", "/api/login", "POST", "", "192.0.2.1", ""},
		{"10.0.0.1:1", "/robots.txt", "GET", "", "/api/login", "POST", "", "", ""},
		{"192.0.2.9:1", "/api/x", "GET", "example.com", "", "", "1.1.1.1, 10.0.0.2", "", "k"},
		{"10.0.0.1:1", "http://h/api/login?x=1", "post", "h:80", "", "", "garbage, 2001:db8::1", "::ffff:1.2.3.4", ""},
		{"10.0.0.1:1", "*", "GET\x00", "", "", "", "", "", ""},
		{"[2001:db8::1]:5", "/tiered", "GET", "", "", "", "", "", "key"},
	} {
		f.Add(s.peer, s.uri, s.method, s.host, s.fwdURI, s.fwdMethod, s.xff, s.realIP, s.apiKey)
	}
	s := fuzzServer(f)
	h := s.Handler()
	f.Fuzz(func(t *testing.T, peer, uri, method, host, fwdURI, fwdMethod, xff, realIP, apiKey string) {
		req := httptest.NewRequest(http.MethodGet, "/v1/auth", nil)
		req.RemoteAddr = peer
		set := func(name, v string) {
			if v != "" {
				req.Header[name] = []string{v} // as a proxy would send it, unvalidated
			}
		}
		set("X-Original-Uri", uri)
		set("X-Original-Method", method)
		set("X-Original-Host", host)
		set("X-Forwarded-Uri", fwdURI)
		set("X-Forwarded-Method", fwdMethod)
		set("X-Forwarded-For", xff)
		set("X-Real-Ip", realIP)
		set("X-Api-Key", apiKey)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusForbidden, http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, []string{peer, uri, method, host, fwdURI, fwdMethod, xff, realIP, apiKey}, rec.Body)
		}
	})
}

// FuzzAuthClientIP checks which headers give /v1/auth its client under
// client_ip_header: auto, for any header values and any auth_headers
// setting. Nothing panics; under auth_headers: auto with X-Forwarded-Uri
// present, and under forwarded, X-Real-IP never changes the client; a
// request carrying both URI headers under auto is let through only when
// its X-Real-IP (if any) names the client its X-Forwarded-For names; and
// a request without X-Forwarded-Uri under auto keeps its X-Real-IP.
func FuzzAuthClientIP(f *testing.F) {
	type seed struct {
		setting                                                        uint8
		peer, uri, method, host, fwdURI, fwdMethod, fwdHost, xff, real string
	}
	for _, s := range []seed{
		{0, "10.0.0.1:1", "/login", "POST", "app", "/login", "POST", "app", "198.51.100.4", "203.0.113.1"},
		{0, "10.0.0.1:1", "/login", "POST", "app", "/login", "POST", "app", "", "198.51.100.4"},
		{0, "10.0.0.1:1", "/login", "POST", "app", "/login", "POST", "app", "203.0.113.9, 198.51.100.4", "198.51.100.4"},
		{0, "10.0.0.1:1", "", "", "", "/login", "POST", "", "198.51.100.4", "203.0.113.1"},
		{0, "10.0.0.1:1", "/login", "POST", "", "", "", "", "203.0.113.1", "198.51.100.4"},
		{1, "10.0.0.1:1", "/login", "POST", "", "/login", "", "", "203.0.113.1", "198.51.100.4"},
		{2, "10.0.0.1:1", "/login", "", "", "/login", "POST", "", "198.51.100.4", "10.0.0.3"},
		{0, "192.0.2.1:1", "/login", "POST", "app", "/login", "POST", "app", "198.51.100.4", "203.0.113.1"},
		{0, "10.0.0.1:1", "/login", "POST", "app", "/login", "POST", "app", "garbage, ::1", "[::ffff:1.2.3.4]:5"},
	} {
		f.Add(s.setting, s.peer, s.uri, s.method, s.host, s.fwdURI, s.fwdMethod, s.fwdHost, s.xff, s.real)
	}
	var cfgs []*config.Config
	for _, setting := range []string{"", config.AuthHeadersOriginal, config.AuthHeadersForwarded} {
		cfgs = append(cfgs, mustParse(f, "trusted_proxies: [10.0.0.0/8]\nserver: {auth_headers: "+strconv.Quote(setting)+"}\nrules: []\n"))
	}
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	f.Fuzz(func(t *testing.T, setting uint8, peer, uri, method, host, fwdURI, fwdMethod, fwdHost, xff, real string) {
		cfg := cfgs[int(setting)%len(cfgs)]
		r := httptest.NewRequest(http.MethodGet, "/v1/auth", nil)
		r.RemoteAddr = peer
		for _, h := range [][2]string{{"X-Original-Uri", uri}, {"X-Original-Method", method}, {"X-Original-Host", host},
			{"X-Forwarded-Uri", fwdURI}, {"X-Forwarded-Method", fwdMethod}, {"X-Forwarded-Host", fwdHost},
			{"X-Forwarded-For", xff}, {"X-Real-Ip", real}} {
			if h[1] != "" {
				r.Header[h[0]] = []string{h[1]}
			}
		}
		orig, _, err := originalRequest(r, cfg.Server.AuthHeaders)
		if err != nil {
			return
		}
		err = dropClientRealIP(r, orig, cfg)
		without := func(name string) netip.Addr {
			c := r.Clone(r.Context())
			c.Header.Del(name)
			return clientip.From(c, trusted, clientip.Auto)
		}
		auto := cfg.Server.AuthHeaders == ""
		fwd := firstHeader(r, "X-Forwarded-Uri") != ""
		both := fwd && firstHeader(r, "X-Original-Uri") != ""
		if err != nil {
			if !auto || !both || firstHeader(r, "X-Real-Ip") == "" || without("X-Real-Ip") == without("X-Forwarded-For") {
				t.Fatalf("refused %q: %v", r.Header, err)
			}
			return
		}
		got := clientip.From(orig, trusted, clientip.Auto)
		switch {
		case auto && fwd || cfg.Server.AuthHeaders == config.AuthHeadersForwarded:
			if want := without("X-Real-Ip"); got != want {
				t.Fatalf("client %v, want %v, the client without X-Real-IP, for %q", got, want, r.Header)
			}
			if auto && both && firstHeader(r, "X-Real-Ip") != "" && without("X-Real-Ip") != without("X-Forwarded-For") {
				t.Fatalf("both families, X-Real-IP and X-Forwarded-For naming different clients, let through: %q", r.Header)
			}
		default:
			if want := clientip.From(r, trusted, clientip.Auto); got != want {
				t.Fatalf("client %v, want %v, for %q", got, want, r.Header)
			}
		}
	})
}
