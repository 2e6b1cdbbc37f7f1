package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// testConfig is the rule set most tests run.
const testConfig = `
trusted_proxies: [10.0.0.0/8]
deny: [203.0.113.0/24]
allow: [198.51.100.7/32]
rules:
  - name: login
    match: { methods: [POST], path: /api/login }
    identity: [ip]
    limit: 3/m
    algorithm: sliding_log
    block: 1m
  - name: api
    match: { path: /api/ }
    identity: [header:X-API-Key]
    limit: 5/m
    algorithm: fixed_window
  - name: trial
    match: { path: /trial }
    limit: 1/m
    shadow: true
  - name: tiered
    match: { path: /tiered }
    identity: [header:X-Key]
    tiers:
      by: header:X-Plan
      default: { limit: 2/m, algorithm: gcra }
      pro: { limit: 10/m, algorithm: gcra }
`

func mustParse(t testing.TB, yaml string) *config.Config {
	t.Helper()
	cfg, err := policy.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

// quietLogger discards everything below errors.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
}

// withFastLoops shortens the background loops for tests.
func withFastLoops() Option {
	return func(o *options) {
		o.fleetEvery = 100 * time.Millisecond
		o.rulesEvery = 50 * time.Millisecond
		o.probeEvery = 100 * time.Millisecond
	}
}

// newTestServer builds a Server with testConfig (unless opts give another)
// and serves its Handler with httptest.
func newTestServer(t testing.TB, opts ...Option) (*Server, *httptest.Server) {
	t.Helper()
	all := append([]Option{WithConfig(mustParse(t, testConfig)), WithLogger(quietLogger()), WithAdminToken("")}, opts...)
	s, err := New(all...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return s, ts
}

// call sends a request and returns the response with its body read. The
// response is validated against openapi.json (validateResponse): every
// answer a test receives through call is one the API reference describes.
func call(t testing.TB, method, url, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	validateResponse(t, req, resp, b)
	return resp, b
}

// decode decodes a JSON body into a map.
func decode(t testing.TB, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, b)
	}
	return m
}

// check posts a /v1/check by rule and key and returns the decoded answer.
func check(t testing.TB, base, rule, key string, hits int) (int, map[string]any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"rule": rule, "key": key, "hits": hits})
	resp, b := call(t, "POST", base+"/v1/check", string(body), "Content-Type", "application/json")
	return resp.StatusCode, decode(t, b)
}

// eventually retries cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serveOn serves s on a free loopback port and returns its base URL and a
// function that shuts it down and waits.
func serveOn(t testing.TB, s *Server) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l, nil) }()
	var once bool
	stop := func() {
		if once {
			return
		}
		once = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return "http://" + l.Addr().String(), stop
}
