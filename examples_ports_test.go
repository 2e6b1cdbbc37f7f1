package weir_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestExamplePorts holds examples/ to the port convention the README
// states: weir serve on :8080 (HTTP) and :8081 (gRPC), a proxy in front
// on :8000 (Envoy's on :10000), the application behind it on
// 127.0.0.1:3000, and the Go example programs on 127.0.0.1:8090.
func TestExamplePorts(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "`weir serve` on `:8080` (HTTP) and `:8081` (gRPC), a proxy in front on `:8000` (Envoy's on `:10000`), the application behind it on `127.0.0.1:3000`, and the Go example programs on `127.0.0.1:8090`") {
		t.Fatal("README.md no longer states the examples' ports as this test knows them")
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.FromSlash(p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ports := regexp.MustCompile(`(?:127\.0\.0\.1|0\.0\.0\.0|localhost)?:(\d{4,5})\b|port_value: (\d+)`)
	// Every port each file names, comments included, must be one of the
	// convention's for its role.
	for _, c := range []struct {
		glob string
		ok   []string
	}{
		{"examples/*/main.go", []string{"8090", "8080"}},   // the programs; weir serve named in comments
		{"examples/*/weir.yaml", []string{"8080", "8081"}}, // weir serve's configs
		{"examples/weir.yaml", []string{"8080", "8081", "6379", "26379", "9090"}},
		{"examples/nginx/nginx.conf", []string{"8000", "8080", "3000", "9080", "9081"}},
		{"examples/caddy/Caddyfile", []string{"8000", "8080", "3000"}},
		{"examples/traefik/*.yml", []string{"8000", "8080", "3000"}},
		{"examples/envoy/envoy.yaml", []string{"10000", "8080", "8081", "3000", "9901"}},
	} {
		files, err := filepath.Glob(filepath.FromSlash(c.glob))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no files (%v)", c.glob, err)
		}
		for _, f := range files {
			for _, m := range ports.FindAllStringSubmatch(read(f), -1) {
				p := m[1] + m[2]
				if !slices.Contains(c.ok, p) {
					t.Errorf("%s names port %s (%q); the examples' convention for it is %v", f, p, m[0], c.ok)
				}
			}
		}
	}
	// Each Go program listens by default on 127.0.0.1:8090.
	progs, _ := filepath.Glob(filepath.FromSlash("examples/*/main.go"))
	listen := regexp.MustCompile(`(?:addr = |envOr\("ADDR", )"([^"]+)"`)
	for _, f := range progs {
		src := read(f)
		if !strings.Contains(src, "ListenAndServe") && !strings.Contains(src, ".Run(") && !strings.Contains(src, ".Start(") && !strings.Contains(src, "Serve(") {
			continue
		}
		m := listen.FindStringSubmatch(src)
		if m == nil || m[1] != "127.0.0.1:8090" {
			t.Errorf("%s: its default address is %v; the examples' programs listen on 127.0.0.1:8090", f, m)
		}
	}
}
