package dashboard

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, path string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestHandlerServesAssets(t *testing.T) {
	h := Handler()
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/", "text/html; charset=utf-8", `data-testid="decisions-chart"`},
		{"/app.js", "text/javascript; charset=utf-8", "v1/dashboard/snapshot"},
		{"/app.css", "text/css; charset=utf-8", "prefers-color-scheme"},
		{"/vendor/uplot/uPlot.esm.js", "text/javascript; charset=utf-8", "export"},
		{"/vendor/uplot/uPlot.min.css", "text/css; charset=utf-8", ".uplot"},
		{"/vendor/uplot/LICENSE", "text/plain; charset=utf-8", "MIT"},
		{"/favicon.svg", "image/svg+xml", "<svg"},
	} {
		rec := get(t, h, "GET", tc.path)
		if rec.Code != 200 {
			t.Errorf("GET %s: %d", tc.path, rec.Code)
			continue
		}
		if got := rec.Header().Get("Content-Type"); got != tc.ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", tc.path, got, tc.ctype)
		}
		if !strings.Contains(rec.Body.String(), tc.contains) {
			t.Errorf("GET %s: body lacks %q", tc.path, tc.contains)
		}
		csp := rec.Header().Get("Content-Security-Policy")
		if csp != ContentSecurityPolicy || strings.Contains(csp, "unsafe") {
			t.Errorf("GET %s: CSP %q", tc.path, csp)
		}
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", tc.path)
		}
		if rec.Header().Get("Cache-Control") != "no-cache" || rec.Header().Get("ETag") == "" {
			t.Errorf("GET %s: Cache-Control %q ETag %q", tc.path, rec.Header().Get("Cache-Control"), rec.Header().Get("ETag"))
		}
	}
}

func TestHandlerRevalidates(t *testing.T) {
	h := Handler()
	etag := get(t, h, "GET", "/app.js").Header().Get("ETag")
	if rec := get(t, h, "GET", "/app.js", "If-None-Match", etag); rec.Code != http.StatusNotModified {
		t.Errorf("If-None-Match with the ETag: %d, want 304", rec.Code)
	}
	if rec := get(t, h, "GET", "/app.js", "If-None-Match", `"other"`); rec.Code != 200 {
		t.Errorf("If-None-Match with another ETag: %d, want 200", rec.Code)
	}
	if rec := get(t, h, "HEAD", "/"); rec.Code != 200 || rec.Body.Len() != 0 {
		t.Errorf("HEAD /: %d with %d bytes", rec.Code, rec.Body.Len())
	}
}

func TestHandlerRejects(t *testing.T) {
	h := Handler()
	for _, p := range []string{"/nope", "/vendor/", "/assets/app.js", "/../dashboard.go", "/app.js/"} {
		if rec := get(t, h, "GET", p); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, rec.Code)
		}
	}
	rec := get(t, h, "POST", "/")
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
	if rec := get(t, h, "GET", "/index.html"); rec.Code != http.StatusMovedPermanently {
		t.Errorf("GET /index.html: %d, want a redirect to ./", rec.Code)
	}
}

// TestPageIsSelfContained checks what the CSP relies on: no inline script or
// style in the page, and every local reference, in HTML and in JavaScript
// imports, names an embedded file.
func TestPageIsSelfContained(t *testing.T) {
	index, err := fs.ReadFile(assets, "assets/index.html")
	if err != nil {
		t.Fatal(err)
	}
	html := string(index)
	for _, m := range regexp.MustCompile(`<script[^>]*>`).FindAllString(html, -1) {
		if !strings.Contains(m, ` src="`) {
			t.Errorf("inline script: %s", m)
		}
	}
	for _, bad := range []string{"<style", " style=", " onclick=", " onload=", "javascript:"} {
		if strings.Contains(html, bad) {
			t.Errorf("index.html contains %q, which the CSP forbids", bad)
		}
	}
	h := Handler()
	refs := regexp.MustCompile(`(?:src|href)="([^"#:]+)"`).FindAllStringSubmatch(html, -1)
	for _, r := range refs {
		if strings.HasPrefix(r[1], "v1/") || r[1] == "metrics" || r[1] == "healthz" {
			continue // served by the service, not the dashboard
		}
		if rec := get(t, h, "GET", "/"+r[1]); rec.Code != 200 {
			t.Errorf("index.html refers to %s, which is not embedded", r[1])
		}
	}
	imp := regexp.MustCompile(`(?m)^\s*import\s+(?:[^'"]*from\s+)?'(\.[^']+)'`)
	err = fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".js") || strings.Contains(p, "/vendor/") {
			return err
		}
		src, _ := fs.ReadFile(assets, p)
		for _, m := range imp.FindAllStringSubmatch(string(src), -1) {
			target := strings.TrimPrefix(m[1], "./")
			if rec := get(t, h, "GET", "/"+target); rec.Code != 200 {
				t.Errorf("%s imports %s, which is not embedded", p, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"decisions-chart", "rules-table", "top-limited", "blocked-list", "store-health", "try-it", "overrides"} {
		if !strings.Contains(html, `data-testid="`+id+`"`) {
			t.Errorf("index.html lacks data-testid %q", id)
		}
	}
}
