package server

import (
	"testing"

	"github.com/weir-dev/weir/internal/server/envoyrls"
)

// TestHealthcheck: envoyproxy/ratelimit's GET /healthcheck answers 200
// "OK" while serving and 500 with no body once shutting down; under
// WithEnvoyAwaitConfig, also 500 until the first Envoy config.
func TestHealthcheck(t *testing.T) {
	health := func(base string) (int, string) {
		resp, b := call(t, "GET", base+"/healthcheck", "")
		return resp.StatusCode, string(b)
	}
	s, ts := newTestServer(t)
	if code, body := health(ts.URL); code != 200 || body != "OK" {
		t.Fatalf("serving: %d %q", code, body)
	}
	s.unready()
	if code, body := health(ts.URL); code != 500 || body != "" {
		t.Fatalf("shutting down: %d %q", code, body)
	}

	empty, err := envoyrls.LoadDocuments()
	if err != nil {
		t.Fatal(err)
	}
	s, ts = newTestServer(t, WithEnvoyConfig(empty), WithEnvoyAwaitConfig())
	if code, body := health(ts.URL); code != 500 || body != "" {
		t.Fatalf("awaiting the first config: %d %q", code, body)
	}
	cfg, err := envoyrls.LoadDocuments(envoyrls.Document{Name: "xds:a", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")})
	if err != nil {
		t.Fatal(err)
	}
	s.SetEnvoyConfig(cfg)
	if code, body := health(ts.URL); code != 200 || body != "OK" {
		t.Fatalf("with a config: %d %q", code, body)
	}
	if got := s.Envoy().Config().Domains(); len(got) != 1 || got[0] != "d" {
		t.Fatalf("SetEnvoyConfig: domains %v", got)
	}
	s.unready()
	if code, _ := health(ts.URL); code != 500 {
		t.Fatalf("shutting down with a config: %d", code)
	}
}
