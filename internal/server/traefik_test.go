package server

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/weir-dev/weir/policy"
)

// TestTraefikForwardAuth replays what Traefik's ForwardAuth middleware
// sends (Traefik is not packaged for Debian, so this is the request, not
// the proxy), as examples/traefik configures it: the original request in
// X-Forwarded-Method/Uri/Host/Proto/For, ?status=429, and the headers
// Traefik copies back.
func TestTraefikForwardAuth(t *testing.T) {
	var dyn struct {
		HTTP struct {
			Middlewares map[string]struct {
				ForwardAuth struct {
					Address             string   `yaml:"address"`
					TrustForwardHeader  bool     `yaml:"trustForwardHeader"`
					AuthResponseHeaders []string `yaml:"authResponseHeaders"`
				} `yaml:"forwardAuth"`
				Headers struct {
					CustomRequestHeaders map[string]string `yaml:"customRequestHeaders"`
				} `yaml:"headers"`
			} `yaml:"middlewares"`
			Routers map[string]struct {
				Middlewares []string `yaml:"middlewares"`
			} `yaml:"routers"`
		} `yaml:"http"`
	}
	raw, err := os.ReadFile("../../examples/traefik/dynamic.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &dyn); err != nil {
		t.Fatal(err)
	}
	fa := dyn.HTTP.Middlewares["weir-ratelimit"].ForwardAuth
	// At the edge, Traefik must set X-Forwarded-* itself, not keep the
	// client's.
	if !strings.HasSuffix(fa.Address, "/v1/auth?status=429") || fa.TrustForwardHeader {
		t.Fatalf("the example's forwardAuth is %+v", fa)
	}
	// The headers middleware before it drops the family Traefik does not
	// set, and X-Real-IP.
	if mw := dyn.HTTP.Routers["app"].Middlewares; len(mw) != 2 || mw[0] != "weir-strip" || mw[1] != "weir-ratelimit" {
		t.Fatalf("the app router's middlewares are %v, want [weir-strip weir-ratelimit]", mw)
	}
	strip := dyn.HTTP.Middlewares["weir-strip"].Headers.CustomRequestHeaders
	for _, h := range []string{"X-Original-URI", "X-Original-Method", "X-Original-Host", "X-Real-IP"} {
		if v, ok := strip[h]; !ok || v != "" {
			t.Fatalf("weir-strip does not remove %s: %v", h, strip)
		}
	}
	cfg, err := policy.LoadFile("../../examples/traefik/weir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, ts := newTestServer(t, WithConfig(cfg))
	path := fa.Address[strings.Index(fa.Address, "/v1/"):]

	stripHeaders, stripping := strip, true
	send := func(client, method, uri string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+path, nil)
		req.Header.Set("X-Forwarded-Method", method)
		req.Header.Set("X-Forwarded-Proto", "http")
		req.Header.Set("X-Forwarded-Host", "app.example")
		req.Header.Set("X-Forwarded-Uri", uri)
		req.Header.Set("X-Forwarded-For", client)
		// What a client adds to escape the login rule and to pose as
		// another client, passed on by Traefik unless weir-strip drops it.
		req.Header.Set("X-Original-URI", "/robots.txt")
		req.Header.Set("X-Original-Method", "GET")
		req.Header.Set("X-Real-IP", "192.0.2.77")
		if stripping {
			for h := range stripHeaders {
				req.Header.Del(h)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	// weir.yaml's auth_headers: forwarded and client_ip_header:
	// X-Forwarded-For hold even when the client's headers get through.
	stripping = false
	for i := 0; i < 5; i++ {
		if i == 2 {
			stripping = true
		}
		resp := send("198.51.100.9", "POST", "/login?next=/home")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("login attempt %d: status %d", i+1, resp.StatusCode)
		}
		for _, h := range fa.AuthResponseHeaders {
			if resp.Header.Get(h) == "" {
				t.Fatalf("allowed answer lacks %s, which Traefik copies to the app", h)
			}
		}
	}
	resp := send("198.51.100.9", "POST", "/login")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "900" {
		t.Fatalf("6th login: status %d Retry-After %q, want 429 and 900", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// Another client, told apart by the forwarded address, is unaffected.
	if resp := send("198.51.100.10", "POST", "/login"); resp.StatusCode != http.StatusOK {
		t.Fatalf("another client: status %d", resp.StatusCode)
	}
}
