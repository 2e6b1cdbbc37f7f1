// Package dashboard serves weir's live dashboard: one HTML page, its
// stylesheet and its JavaScript modules, all embedded in the binary with an
// embed directive, so `weir serve` needs no files on disk and no build step.
//
// The page is static. Once loaded it polls the service's
// GET /v1/dashboard/snapshot every second and draws what it gets: decisions
// per second (allowed, limited, shadow-limited) over the last five minutes,
// the rules in force, the most limited identities, the penalty box with an
// Unblock button that calls the admin API, the store's health, the fleet of
// instances and a form that sends a check; with the admin token, the
// overrides of every rule and their latest changes, read from the admin API
// every five seconds. The chart is uPlot, vendored
// from npm under assets/vendor/uplot.
//
// Every response carries a strict Content-Security-Policy: scripts, styles,
// images and connections come from the same origin only and nothing runs
// inline.
package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// ContentSecurityPolicy is the policy sent with every dashboard response:
// same origin only, no inline scripts or styles, no framing.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; " +
	"img-src 'self' data:; connect-src 'self'; font-src 'self'; manifest-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// asset is one embedded file ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// contentTypes maps the extensions the dashboard ships to their media types,
// so the answer never depends on the host's mime.types.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".json": "application/json",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
	".txt":  "text/plain; charset=utf-8",
	".md":   "text/plain; charset=utf-8",
}

// Handler returns the dashboard: index.html at "/" and the other embedded
// assets by path. Only GET and HEAD are served; unknown paths get 404.
//
// Responses are revalidated on every load (Cache-Control: no-cache) against
// a strong ETag derived from the content, so a browser re-downloads an asset
// only after weir is upgraded.
func Handler() http.Handler {
	files := make(map[string]asset)
	root, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embed pattern guarantees the directory exists
	}
	err = fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(root, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			ct = "text/plain; charset=utf-8"
		}
		if path.Base(p) == "LICENSE" {
			ct = "text/plain; charset=utf-8"
		}
		files["/"+p] = asset{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		panic(err) // reading an embed.FS cannot fail
	}
	files["/"] = files["/index.html"]
	return &handler{files: files}
}

type handler struct {
	files map[string]asset
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Content-Security-Policy", ContentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")

	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	p := r.URL.Path
	if p == "/index.html" {
		http.Redirect(w, r, "./", http.StatusMovedPermanently)
		return
	}
	a, ok := h.files[p]
	if !ok || strings.HasPrefix(path.Base(p), ".") {
		http.NotFound(w, r)
		return
	}
	hdr.Set("Content-Type", a.contentType)
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("ETag", a.etag)
	// ServeContent answers If-None-Match with 304, HEAD and Range requests.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
